use super::*;
use crate::sim::testkit::{agent_trace, main_requests};

fn input<'a>(key: u64, inflight: &'a [f64], store: &'a BlockStore) -> RouteInput<'a> {
    RouteInput {
        key,
        inflight,
        inflight_total: inflight.iter().sum(),
        polled: inflight,
        path: &[],
        store,
        prompt_tokens: 100,
    }
}

fn router(policy: Policy, n: usize) -> Router {
    Router::new(
        policy,
        "rank",
        n,
        4,
        LoadBound {
            factor: 1.25,
            floor: 1.0,
        },
        PrefixOptions::default(),
        None,
    )
}

#[test]
fn round_robin_cycles_and_hashing_is_sticky() {
    let t = agent_trace(1, 1, 1, 1, 16);
    let zeros = vec![0.0; 4];
    let mut rr = router(Policy::RoundRobin, 4);
    let seq: Vec<usize> = (0..8)
        .map(|_| rr.route(&input(7, &zeros, t.blocks())).unwrap())
        .collect();
    assert_eq!(seq, vec![0, 1, 2, 3, 0, 1, 2, 3]);
    let mut h = router(Policy::Tether, 4);
    let a = h.route(&input(42, &zeros, t.blocks())).unwrap();
    let busy = vec![9.0; 4];
    assert_eq!(
        h.route(&input(42, &busy, t.blocks())).unwrap(),
        a,
        "plain hashing ignores load"
    );
}

#[test]
fn bounded_load_spills_to_the_next_choice_and_least_loaded_takes_the_minimum() {
    let t = agent_trace(1, 1, 1, 1, 16);
    let zeros = vec![0.0; 4];
    let mut b = router(Policy::TetherBounded, 4);
    let primary = b.route(&input(42, &zeros, t.blocks())).unwrap();
    let mut loads = vec![1.0; 4];
    loads[primary] = 6.0; // bound ⌈1.25 · 10 / 4⌉ = 4
    let spilled = b.route(&input(42, &loads, t.blocks())).unwrap();
    assert_ne!(spilled, primary);
    assert_eq!(spilled, b.placement.pick(42, 1).unwrap().order[1]);
    let mut ll = router(Policy::LeastLoaded, 4);
    let loads = vec![3.0, 1.0, 2.0, 5.0];
    assert_eq!(ll.route(&input(1, &loads, t.blocks())).unwrap(), 1);
}

#[test]
fn scaling_moves_only_the_keys_of_removed_ranks() {
    let t = agent_trace(1, 1, 1, 1, 16);
    let zeros = vec![0.0; 8];
    let mut r = router(Policy::Tether, 8);
    let before: Vec<usize> = (0..500u64)
        .map(|k| r.route(&input(k * 7919, &zeros, t.blocks())).unwrap())
        .collect();
    r.set_active("rank", (0..7).collect());
    for (k, &b) in before.iter().enumerate() {
        let a = r
            .route(&input(k as u64 * 7919, &zeros, t.blocks()))
            .unwrap();
        assert!(a < 7);
        if b != 7 {
            assert_eq!(a, b, "a key of a surviving rank moved");
        }
    }
}

#[test]
fn prefix_routes_to_the_holder_above_the_threshold_and_balances_when_skewed() {
    let t = agent_trace(4, 3, 1000, 10, 16);
    let store = t.blocks();
    let mut r = Router::new(
        Policy::Prefix,
        "rank",
        4,
        4,
        LoadBound {
            factor: 1.25,
            floor: 1.0,
        },
        PrefixOptions::default(),
        Some((store, 16)),
    );
    let s0 = main_requests(&t, 0);
    let path = |id: crate::trace::RequestId| {
        let mut p = Vec::new();
        store.path_into(t.request(id).blocks, &mut p);
        p
    };
    let zeros = vec![0.0; 4];
    let p0 = path(s0[0]);
    let mut i = input(1, &zeros, store);
    i.path = &p0;
    i.prompt_tokens = u64::from(t.request(s0[0]).input_tokens);
    let first = r.route(&i).unwrap();
    let p1 = path(s0[1]);
    let mut i = input(2, &zeros, store);
    i.path = &p1;
    i.prompt_tokens = u64::from(t.request(s0[1]).input_tokens);
    assert_eq!(r.route(&i).unwrap(), first, "match rate 6/8.5 > 0.3");
    // Imbalanced (max − min > 64 and max > 1.5 · min): shortest queue wins.
    let mut skew = vec![100.0; 4];
    skew[(first + 1) % 4] = 0.0;
    let mut i = input(3, &skew, store);
    i.path = &p1;
    assert_eq!(r.route(&i).unwrap(), (first + 1) % 4);
}
