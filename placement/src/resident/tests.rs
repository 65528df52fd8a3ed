use super::*;
use crate::rendezvous::Endpoint;

const BOUND: LoadBound = LoadBound {
    factor: 1.25,
    floor: 2.0,
};

fn rule(d: usize) -> Rule {
    Rule {
        candidates: d,
        bound: BOUND,
        // 128 KiB per token over 12.5 GB/s (0.0105 ms/token), 5 ms set-up,
        // 20 k tokens/s prefill (0.05 ms/token): migrate above ~127 tokens.
        cost: MoveCost::from_link(131_072.0, 12.5, 5.0, 20_000.0),
        unseen: Unseen::LeastLoaded,
        over_bound: OverBound::Move,
    }
}

fn placement(n: usize) -> Placement {
    let eps: Vec<Endpoint> = (0..n)
        .map(|i| Endpoint {
            address: format!("10.2.0.{}:8000", i + 1),
            weight: 1.0,
            dp_size: 1,
            name: None,
        })
        .collect();
    Placement::new(&eps)
}

fn key(i: u64) -> u64 {
    crate::keys::hash_parts(&[b"session", &i.to_le_bytes()])
}

fn holds(tokens: u32) -> Knows {
    Knows::Holds(Held {
        tokens,
        device: true,
    })
}

#[test]
fn an_unseen_key_stays_on_its_first_candidate_with_rendezvous() {
    let p = placement(8);
    let k = key(1);
    let order = p.pick(k, 7).unwrap().order;
    let mut loads = vec![1.0; 8];
    loads[order[1]] = 0.0;
    let r = Rule {
        unseen: Unseen::Rendezvous,
        ..rule(3)
    };
    // The first candidate has room (1 in flight, capacity the floor of 2): it takes the key.
    let c = p
        .place_resident(k, 2, &r, &loads, |_| Knows::Nothing)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[0]), How::Least));
    // The same view with least-loaded goes elsewhere.
    let c = p
        .place_resident(k, 2, &rule(3), &loads, |_| Knows::Nothing)
        .unwrap();
    assert_eq!(c.endpoint(), Some(order[1]));
    // Over the bound: the least loaded, as least-loaded would.
    loads[order[0]] = 40.0;
    let c = p
        .place_resident(k, 2, &r, &loads, |_| Knows::Nothing)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[1]), How::Least));
    // A holder still wins, and an unknown summary still gives the bounded pick.
    let c = p
        .place_resident(k, 2, &r, &loads, |i| {
            if i == order[2] {
                holds(900)
            } else {
                Knows::Nothing
            }
        })
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[2]), How::Stay));
    for (n, u) in Unseen::NAMES {
        assert_eq!((Unseen::from_name(n), u.name()), (Some(u), n));
    }
    assert_eq!(Unseen::from_name("nearest"), None);
}

#[test]
fn a_new_key_goes_to_the_least_loaded_of_its_candidates() {
    let p = placement(8);
    let k = key(1);
    let order = p.pick(k, 7).unwrap().order;
    let mut loads = vec![1.0; 8];
    loads[order[0]] = 3.0;
    loads[order[1]] = 2.0;
    loads[order[2]] = 0.0;
    let c = p
        .place_resident(k, 2, &rule(2), &loads, |_| Knows::Nothing)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[1]), How::Least));
    let c = p
        .place_resident(k, 2, &rule(3), &loads, |_| Knows::Nothing)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[2]), How::Least));
    // Ties go to the rendezvous order.
    let c = p
        .place_resident(k, 2, &rule(3), &[0.0; 8], |_| Knows::Nothing)
        .unwrap();
    assert_eq!(c.endpoint(), Some(order[0]));
    // The rest of the order follows for retries.
    assert_eq!(c.pick.order.len(), 3);
}

#[test]
fn a_returning_key_stays_with_its_state_even_when_another_candidate_is_emptier() {
    let p = placement(8);
    let k = key(2);
    let order = p.pick(k, 7).unwrap().order;
    let mut loads = vec![1.0; 8];
    loads[order[0]] = 0.0;
    let c = p
        .place_resident(k, 2, &rule(2), &loads, |i| {
            if i == order[1] {
                holds(30_000)
            } else {
                Knows::Nothing
            }
        })
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[1]), How::Stay));
}

#[test]
fn an_overloaded_holder_passes_the_key_on_with_its_state_when_the_transfer_is_cheaper() {
    let p = placement(4);
    let k = key(3);
    let order = p.pick(k, 3).unwrap().order;
    // 12 in flight, 4 endpoints, c = 1.25: capacity ⌈1.25 · 13 / 4⌉ = 5.
    let mut loads = vec![0.0; 4];
    loads[order[0]] = 6.0;
    loads[order[1]] = 3.0;
    loads[order[2]] = 2.0;
    loads[order[3]] = 1.0;
    let knows = |i: usize| {
        if i == order[0] {
            holds(30_000)
        } else {
            Knows::Nothing
        }
    };
    let c = p.place_resident(k, 1, &rule(3), &loads, knows).unwrap();
    assert_eq!(c.endpoint(), Some(order[2]));
    assert_eq!(c.how, How::Migrate { from: order[0] });
    // A tiny state is recomputed instead.
    let small = |i: usize| {
        if i == order[0] {
            holds(64)
        } else {
            Knows::Nothing
        }
    };
    let c = p.place_resident(k, 1, &rule(3), &loads, small).unwrap();
    assert_eq!(c.how, How::Recompute { from: order[0] });
    // No other candidate with room: the key stays.
    // 24 in flight: capacity ⌈1.25 · 25 / 4⌉ = 8.
    let mut full = vec![0.0; 4];
    full[order[0]] = 8.0;
    full[order[1]] = 8.0;
    full[order[2]] = 8.0;
    let c = p.place_resident(k, 1, &rule(3), &full, knows).unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[0]), How::Stay));
}

#[test]
fn unknown_residency_keeps_the_plain_bounded_pick() {
    let p = placement(4);
    let k = key(4);
    let order = p.pick(k, 3).unwrap().order;
    let mut loads = vec![0.0; 4];
    loads[order[1]] = 0.0;
    loads[order[0]] = 1.0;
    let c = p
        .place_resident(k, 1, &rule(2), &loads, |_| Knows::Unknown)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[0]), How::Bounded));
}

#[test]
fn without_a_link_nothing_migrates() {
    let c = MoveCost::from_link(131_072.0, 0.0, 0.0, 10_000.0);
    assert!(!c.migrate(1_000_000));
    let c = MoveCost::from_link(131_072.0, 100.0, 5.0, 10_000.0);
    assert!(c.migrate(100_000));
    assert!(!c.migrate(10));
}

#[test]
fn the_choice_is_deterministic_and_bounded() {
    // 64 endpoints, 10,000 keys with random holders: the same view gives the
    // same choice, and no endpoint over its bound takes a key it does not hold.
    let p = placement(64);
    let loads: Vec<f64> = (0..64).map(|i| f64::from((i * 7) % 11)).collect();
    let total: f64 = loads.iter().sum();
    let cap = BOUND.capacity(total, 1.0 / 64.0);
    for i in 0..10_000u64 {
        let k = key(i);
        let holder = (k % 64) as usize;
        let knows = |e: usize| {
            if e == holder {
                holds(1_000)
            } else {
                Knows::Nothing
            }
        };
        let a = p.place_resident(k, 2, &rule(3), &loads, knows).unwrap();
        let b = p.place_resident(k, 2, &rule(3), &loads, knows).unwrap();
        assert_eq!(a, b);
        let e = a.endpoint().unwrap();
        if a.how != How::Stay {
            assert!(loads[e] < cap || a.how == How::Least, "{a:?}");
        }
    }
}

#[test]
fn a_holder_busy_with_another_prefill_passes_the_turn_on_when_moving_is_quicker() {
    let p = placement(4);
    let k = key(5);
    let order = p.pick(k, 3).unwrap().order;
    let loads = vec![1.0; 4];
    let knows = |i: usize| {
        if i == order[0] {
            holds(30_000)
        } else {
            Knows::Nothing
        }
    };
    // The holder has 100 K tokens queued (5 s at 20 K tokens/s); moving 30 K
    // tokens costs 5 + 315 ms.
    let wait = |tokens: f64| rule(3).cost.wait_ms(tokens, None);
    let mut backlog = vec![0.0; 4];
    backlog[order[0]] = wait(100_000.0);
    let c = p
        .place_resident_in(k, 2, &rule(3), &loads, &backlog, knows)
        .unwrap();
    assert_eq!(c.how, How::Migrate { from: order[0] });
    assert_ne!(c.endpoint(), Some(order[0]));
    // A short backlog (2 K tokens: 100 ms) is not worth the move.
    backlog[order[0]] = wait(2_000.0);
    let c = p
        .place_resident_in(k, 2, &rule(3), &loads, &backlog, knows)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[0]), How::Stay));
    // Without backlogs the rule is the plain one.
    let c = p
        .place_resident_in(k, 2, &rule(3), &loads, &[], knows)
        .unwrap();
    assert_eq!(c.how, How::Stay);
}

#[test]
fn of_two_holders_of_the_same_state_the_cooler_one_takes_the_key() {
    let p = placement(8);
    let k = key(7);
    let order = p.pick(k, 7).unwrap().order;
    let (a, b) = (order[0], order[1]);
    let mut loads = vec![1.0; 8];
    loads[a] = 1.5;
    loads[b] = 0.5;
    let both = |i: usize| {
        if i == a || i == b {
            holds(4096)
        } else {
            Knows::Nothing
        }
    };
    let c = p.place_resident(k, 2, &rule(3), &loads, both).unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(b), How::Stay));
    // More tokens win over load: the original keeps a longer state.
    let longer = |i: usize| match i {
        i if i == a => holds(8192),
        i if i == b => holds(4096),
        _ => Knows::Nothing,
    };
    let c = p.place_resident(k, 2, &rule(3), &loads, longer).unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(a), How::Stay));
}

#[test]
fn keep_up_keeps_a_holder_over_the_bound_while_its_prefills_keep_up() {
    let p = placement(4);
    let k = key(9);
    let order = p.pick(k, 3).unwrap().order;
    // The holder decodes 12 requests, the others none: over the bound (capacity 5).
    let mut loads = vec![0.0; 4];
    loads[order[0]] = 12.0;
    let knows = |i: usize| {
        if i == order[0] {
            holds(400)
        } else {
            Knows::Nothing
        }
    };
    let keep = Rule {
        over_bound: OverBound::KeepUp,
        ..rule(3)
    };
    // One 2 K-token prefill queued on the holder (100 ms at 20 K tokens/s): a
    // 400-token pull (9 ms) starts the turn more than 50 ms sooner elsewhere.
    let wait = |tokens: f64, rate: Option<f64>| keep.cost.wait_ms(tokens, rate);
    let mut backlog = vec![0.0; 4];
    backlog[order[0]] = wait(2_000.0, None);
    let moved = p
        .place_resident_in(k, 2, &keep, &loads, &backlog, knows)
        .unwrap();
    assert_eq!(moved.how, How::Migrate { from: order[0] });
    // The same 2 K tokens on a rank that reports prefilling 100 K tokens/s
    // (20 ms): it keeps up, and keeps the key.
    backlog[order[0]] = wait(2_000.0, Some(100_000.0));
    let c = p
        .place_resident_in(k, 2, &keep, &loads, &backlog, knows)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[0]), How::Stay));
    // 500 tokens queued at the rule's rate (25 ms): it keeps up too.
    backlog[order[0]] = wait(500.0, None);
    let c = p
        .place_resident_in(k, 2, &keep, &loads, &backlog, knows)
        .unwrap();
    assert_eq!((c.endpoint(), c.how), (Some(order[0]), How::Stay));
    // `move` moves it on the same view, to the least loaded other candidate.
    let c = p
        .place_resident_in(k, 2, &rule(3), &loads, &backlog, knows)
        .unwrap();
    assert_eq!(
        (c.endpoint(), c.how),
        (Some(order[1]), How::Migrate { from: order[0] })
    );
    // Without backlogs in view `keep-up` is `move`.
    let c = p
        .place_resident_in(k, 2, &keep, &loads, &[], knows)
        .unwrap();
    assert_eq!(
        (c.endpoint(), c.how),
        (Some(order[1]), How::Migrate { from: order[0] })
    );
}

#[test]
fn a_wait_is_the_backlog_at_the_ranks_own_rate_else_at_the_rules() {
    let cost = rule(3).cost; // 20 K tokens/s
    assert!((cost.wait_ms(2_000.0, None) - 100.0).abs() < 1e-9);
    assert!((cost.wait_ms(2_000.0, Some(100_000.0)) - 20.0).abs() < 1e-9);
    // An unknown, zero or broken rate falls back to the rule's.
    for rate in [Some(0.0), Some(-5.0), Some(f64::NAN), Some(f64::INFINITY)] {
        assert!(
            (cost.wait_ms(2_000.0, rate) - 100.0).abs() < 1e-9,
            "{rate:?}"
        );
    }
    // No backlog, or a broken one, is no wait.
    for tokens in [0.0, -3.0, f64::NAN, f64::INFINITY] {
        assert_eq!(cost.wait_ms(tokens, Some(1.0)), 0.0, "{tokens}");
    }
}

#[test]
fn over_bound_names_round_trip() {
    for (n, o) in OverBound::NAMES {
        assert_eq!(OverBound::from_name(n), Some(o));
        assert_eq!(o.name(), n);
    }
    assert_eq!(OverBound::from_name("stay"), None);
}

/// With as many requests in flight everywhere, a new key goes to the
/// candidate that has lately been least busy (`crate::busy`), not to its first
/// rendezvous candidate; and the busy share never outweighs a request.
#[test]
fn ties_in_flight_go_to_the_least_busy_candidate() {
    use crate::busy::{BUSY_WEIGHT, resident_load};
    let p = placement(8);
    let k = key(7);
    let order = p.pick(k, 7).unwrap().order;
    let busy = |quiet: usize| -> Vec<f64> {
        (0..8)
            .map(|i| if i == quiet { 0.1 } else { 0.8 })
            .collect::<Vec<f64>>()
    };
    let place = |requests: &[f64], busy: &[f64], w: f64| {
        let loads: Vec<f64> = requests
            .iter()
            .zip(busy)
            .map(|(&r, &b)| resident_load(r, b, w))
            .collect();
        p.place_resident(k, 3, &rule(4), &loads, |_| Knows::Nothing)
            .unwrap()
            .endpoint()
    };
    let idle = vec![0.0; 8];
    // Without the busy share the tie goes to the first candidate.
    assert_eq!(place(&idle, &busy(order[2]), 0.0), Some(order[0]));
    // With it, to the quiet third candidate.
    assert_eq!(place(&idle, &busy(order[2]), BUSY_WEIGHT), Some(order[2]));
    // One more request in flight outweighs any busy share.
    let mut one = idle.clone();
    one[order[2]] = 1.0;
    assert_eq!(place(&one, &busy(order[2]), BUSY_WEIGHT), Some(order[0]));
}
