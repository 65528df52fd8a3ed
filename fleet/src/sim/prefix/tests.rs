use super::*;
use crate::sim::testkit::{agent_trace, main_requests};
use crate::trace::RequestId;

#[test]
fn the_best_match_is_the_rank_holding_the_longest_contiguous_prefix() {
    let t = agent_trace(3, 3, 1000, 10, 16);
    let store = t.blocks();
    let mut tree = ApproxTree::new(store, 4, 16);
    let active = vec![true; 4];
    let path = |id: RequestId| {
        let mut p = Vec::new();
        store.path_into(t.request(id).blocks, &mut p);
        p
    };
    let s0 = main_requests(&t, 0);
    let s1 = main_requests(&t, 1);
    assert_eq!(tree.best(store, &path(s0[0]), &active).rank, None);
    tree.insert(store, &path(s0[0]), 2);
    tree.insert(store, &path(s1[0]), 1);
    // Session 0's next turn: rank 2 holds its whole previous prompt (6 blocks + partial id).
    let m = tree.best(store, &path(s0[1]), &active);
    assert_eq!(m.rank, Some(2));
    assert_eq!(m.tokens, 6 * 16);
    // Session 1's sibling shares only the 4-block system prompt with rank 2, more with rank 1.
    assert_eq!(tree.best(store, &path(s1[1]), &active).rank, Some(1));
    // An inactive rank is not a match.
    let mut off = active.clone();
    off[2] = false;
    let m = tree.best(store, &path(s0[1]), &off);
    assert_eq!(m.tokens, 4 * 16, "{m:?}");
    assert!(tree.size(2) > 0 && tree.size(0) == 0);
}
