use super::*;
use crate::sim::testkit::{agent_trace, main_requests, one_turn_sessions};
use crate::trace::SessionSpec;

fn blocks(t: &Trace, be: usize, id: u32) -> Vec<BlockHash> {
    let mut p = PromptBlocks::new(t, be).unwrap();
    let mut out = Vec::new();
    p.blocks_into(t, RequestId(id), &mut out);
    out
}

#[test]
fn equal_prefixes_give_equal_ids_and_nothing_else_is_shared() {
    let t = agent_trace(3, 4, 1000, 500, 64);
    // Session 0's turns: ids 0..4 shared prompt, then 2 per turn; input covers every id fully.
    let s0 = main_requests(&t, 0);
    let a = blocks(&t, 64, s0[0].0);
    let b = blocks(&t, 64, s0[1].0);
    assert_eq!(a.len(), 6);
    assert_eq!(b.len(), 8);
    assert_eq!(a[..], b[..6], "a returning turn extends its predecessor");
    // Another session shares only the system prompt.
    let s1 = main_requests(&t, 1);
    let c = blocks(&t, 64, s1[0].0);
    assert_eq!(c[..4], a[..4]);
    assert!(c[4..].iter().all(|h| !a.contains(h)));
    // Every id of a request is distinct.
    let mut d = b.clone();
    d.sort_by_key(|h| h.0);
    d.dedup();
    assert_eq!(d.len(), b.len());
}

#[test]
fn smaller_engine_blocks_split_trace_blocks_consistently() {
    let t = agent_trace(2, 3, 1000, 500, 64);
    let s0 = main_requests(&t, 0);
    let a = blocks(&t, 16, s0[0].0);
    let b = blocks(&t, 16, s0[1].0);
    // 6 full trace blocks + half a block = 26 full 16-token blocks.
    assert_eq!(a.len(), 26);
    // The shared part: the 6 full trace blocks (24 engine blocks) only — the
    // partial block is re-hashed next turn.
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert_eq!(shared, 24);
    assert!(PromptBlocks::new(&t, 48).is_err());
    assert!(PromptBlocks::new(&t, 0).is_err());
}

#[test]
fn tenants_never_share_blocks() {
    let spec = |i: usize, tenant: &str| SessionSpec {
        id: format!("s{i}"),
        start_ms: Some(0),
        tenant: Some(tenant.into()),
        user: None,
    };
    let t = one_turn_sessions(vec![spec(0, "a"), spec(1, "b")], 64, &[1, 2, 3, 4]);
    let x = blocks(&t, 16, 0);
    let y = blocks(&t, 16, 1);
    assert_eq!(x.len(), 4);
    assert!(x.iter().all(|h| !y.contains(h)));
    // Same low halves (the pool's hash-map key), different salts.
    assert_eq!(x[0].0 as u64, y[0].0 as u64);
}
