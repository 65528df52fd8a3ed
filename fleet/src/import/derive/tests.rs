use super::*;

/// Requests of `ids.len() × 512 − 100` tokens.
fn run(reqs: &[&[u64]], fanout: u32) -> Derivation {
    let mut store = BlockStore::new();
    let refs: Vec<(BlockRef, u32)> = reqs
        .iter()
        .map(|r| (store.insert(r), r.len() as u32 * 512 - 100))
        .collect();
    derive(&store, &refs, fanout)
}

/// A system prompt (block 100) that five conversations start with, each with
/// its own multi-turn history; a document (blocks 50–52) four of them share;
/// forks, a shorter regenerated turn, re-hashed partial last blocks.
#[test]
fn conversations_sharing_a_system_prompt_stay_apart() {
    let reqs: Vec<&[u64]> = vec![
        /* 0 */ &[100, 1, 2],
        /* 1 */ &[100, 10, 11],
        /* 2 */ &[100, 20, 21],
        /* 3 */ &[100, 1, 3, 4], // re-hashes 2 → 3: continues 0
        /* 4 */ &[100, 30, 31],
        /* 5 */ &[100, 40, 41],
        /* 6 */ &[100, 10, 12, 13], // continues 1
        /* 7 */ &[100, 1, 3, 5, 6], // continues 3
        /* 8 */ &[100, 10, 12, 14], // as long as 6, last block different: regenerates 6
        /* 9 */ &[100, 1, 3, 7, 8], // forks off conversation 0 after block 3
        /* 10 */ &[900, 901], // shares nothing
        /* 11 */ &[100, 20, 22, 23, 24], // continues 2
        /* 12 */
        &[100, 20, 22], // shorter than 11, within its path: a regenerated earlier turn
    ];
    let d = run(&reqs, DEFAULT_HEAD_FANOUT);
    assert_eq!(
        d.link,
        vec![
            Link::NewNoSharedBlock,
            Link::NewCommonHead,
            Link::NewCommonHead,
            Link::Continuation(0),
            Link::NewCommonHead,
            Link::NewCommonHead,
            Link::Continuation(1),
            Link::Continuation(3),
            Link::Regeneration(6),
            Link::Fork(7),
            Link::NewNoSharedBlock,
            Link::Continuation(2),
            Link::Regeneration(11),
        ]
    );
    assert_eq!(d.conversation, vec![0, 1, 2, 0, 4, 5, 1, 0, 1, 0, 10, 2, 2]);
    let r = &d.report;
    assert_eq!((r.conversations, r.largest, r.single_request), (6, 4, 3));
    assert_eq!((r.continuations, r.regenerations, r.forks), (4, 2, 1));
    assert_eq!((r.new_no_shared_block, r.new_common_head), (2, 4));
    assert_eq!((r.common_heads, r.deepest_common_head), (1, 1));
}

/// Without the common-head rule everything after the shared block would be
/// one conversation: the failure this derivation exists to avoid.
#[test]
fn a_fanout_too_high_to_see_the_head_merges_conversations() {
    let reqs: Vec<&[u64]> = vec![&[100, 1, 2], &[100, 10, 11], &[100, 20, 21], &[100, 30, 31]];
    assert_eq!(run(&reqs, 4).report.conversations, 4);
    // With a first request whose head is the shared block alone (one
    // partial block after it), a fan-out the trace never reaches lets the
    // rest attach to it.
    let reqs: Vec<&[u64]> = vec![
        &[100, 1],
        &[100, 10, 11],
        &[100, 20, 21],
        &[100, 30, 31],
        &[100, 40, 41],
    ];
    assert_eq!(run(&reqs, 4).report.conversations, 5);
    assert_eq!(run(&reqs, 100).report.conversations, 1);
}

/// The Mooncake README's own sample: the second request keeps the first's
/// first 12 blocks and is shorter (6,472 vs 6,955 tokens): a regenerated turn.
#[test]
fn the_readme_sample_is_a_regeneration() {
    let a: Vec<u64> = (46..58).chain([2353, 2354]).collect();
    let b: Vec<u64> = (46..58).chain([2366]).collect();
    let mut store = BlockStore::new();
    let refs = [(store.insert(&a), 6955), (store.insert(&b), 6472)];
    let d = derive(&store, &refs, DEFAULT_HEAD_FANOUT);
    assert_eq!(d.link, vec![Link::NewNoSharedBlock, Link::Regeneration(0)]);
    // The same blocks with a longer prompt: the turn grew inside its last block.
    let refs = [(store.insert(&a), 6955), (store.insert(&b), 7000)];
    let d = derive(&store, &refs, DEFAULT_HEAD_FANOUT);
    assert_eq!(d.link[1], Link::NewInsideHead);
}

/// A document (blocks 50–52 after the system prompt) shared by four
/// conversations is a second-level common head; a request diverging inside
/// another conversation's first prompt starts its own.
#[test]
fn shared_documents_and_divergence_inside_a_head() {
    let reqs: Vec<&[u64]> = vec![
        &[100, 50, 51, 52, 60, 61],
        &[100, 50, 51, 52, 70, 71],
        &[100, 50, 51, 52, 80, 81],
        &[100, 50, 51, 52, 90, 91],
        &[100, 50, 51, 52, 60, 62, 63], // continues the first
        &[100, 7, 8, 9],
        &[100, 200, 201, 202, 203],
        &[100, 200, 201, 299, 300], // diverges inside the previous one's head
    ];
    let d = run(&reqs, DEFAULT_HEAD_FANOUT);
    assert_eq!(d.link[0], Link::NewNoSharedBlock);
    assert_eq!(&d.link[1..4], &[Link::NewCommonHead; 3]);
    assert_eq!(d.link[4], Link::Continuation(0));
    // Only three contents continue after the system prompt here (50, 7, 200):
    // not a common head, but 7 branches inside the first conversation's head.
    assert_eq!(d.link[5], Link::NewInsideHead);
    assert_eq!(d.link[7], Link::NewInsideHead);
    assert_eq!(d.report.conversations, 7);
    assert_eq!(d.report.deepest_common_head, 4);
}

/// Requests that end one block after a shared prefix, each in a different last
/// block, are regenerations of one prompt (Mooncake re-hashes a partial last
/// block), not a fan-out: leaf children never make a common head
/// (cargo-mutants survivor: `> 0` -> `>= 0` in the full-children count).
#[test]
fn different_last_blocks_after_a_shared_prefix_are_regenerations_not_a_head() {
    let reqs: Vec<&[u64]> = vec![&[100, 1], &[100, 2], &[100, 3], &[100, 4], &[100, 5]];
    let d = run(&reqs, 4);
    assert_eq!(d.report.conversations, 1);
    assert_eq!(d.report.common_heads, 0);
    assert_eq!(
        &d.link[1..],
        &[
            Link::Regeneration(0),
            Link::Regeneration(1),
            Link::Regeneration(2),
            Link::Regeneration(3)
        ]
    );
}

/// The report names its rule and inputs and prints every count (what
/// `tether trace import` and the benchmarks show).
#[test]
fn the_report_states_rule_inputs_and_counts() {
    let a: Vec<u64> = (46..58).chain([2353, 2354]).collect();
    let b: Vec<u64> = (46..58).chain([2366]).collect();
    let mut store = BlockStore::new();
    let refs = [(store.insert(&a), 6955), (store.insert(&b), 7000)];
    let r = derive(&store, &refs, 3).report;
    assert_eq!(
        (
            r.requests,
            r.head_fanout,
            r.new_inside_head,
            r.conversations
        ),
        (2, 3, 1, 2)
    );
    assert_eq!(
        r.to_string(),
        "derived 2 conversations from 2 requests (prefix continuation with common heads \
         (docs/trace-format.md, Mooncake); head fan-out 3)\n  \
         new conversations: 1 sharing no block, 0 sharing only a common head, 1 diverging inside another's head\n  \
         joined: 0 continuations, 0 regenerations, 0 forks\n  \
         2 single-request conversations; largest 1 requests; 0 common-head nodes (deepest 0 blocks)"
    );
}
