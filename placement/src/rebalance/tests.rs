use super::*;
use crate::rendezvous::Endpoint;
use crate::{LoadBound, MoveCost, Unseen};

fn placement(n: usize) -> Placement {
    let eps: Vec<Endpoint> = (0..n)
        .map(|i| Endpoint {
            address: format!("10.3.0.{}:8000", i + 1),
            weight: 1.0,
            dp_size: 1,
            name: None,
        })
        .collect();
    Placement::new(&eps)
}

fn rule(d: usize) -> Rule {
    Rule {
        candidates: d,
        bound: LoadBound {
            factor: 1.5,
            floor: 1.0,
        },
        cost: MoveCost::from_link(131_072.0, 50.0, 5.0, 20_000.0),
        unseen: Unseen::LeastLoaded,
        over_bound: crate::OverBound::Move,
    }
}

/// 8 endpoints: the key's first three candidates and a view in which the home
/// (its first candidate) holds 90 % of its KV against a mean near 40 %.
fn setup() -> (Placement, u64, [usize; 3], Vec<f64>, Vec<f64>, Vec<f64>) {
    let p = placement(8);
    let key = crate::hash_parts(&[b"rebalance", b"1"]);
    let o = p.pick(key, 7).unwrap().order;
    let mut kv = vec![0.4; 8];
    kv[o[0]] = 0.9;
    kv[o[1]] = 0.3;
    kv[o[2]] = 0.2;
    (p, key, [o[0], o[1], o[2]], vec![2.0; 8], kv, vec![0.0; 8])
}

fn target(
    p: &Placement,
    key: u64,
    home: usize,
    d: usize,
    r: &[f64],
    kv: &[f64],
    b: &[f64],
) -> Option<usize> {
    let view = Loads {
        requests: r,
        kv_usage: kv,
        backlog: b,
    };
    p.rebalance_target(key, home, &rule(d), Rebalance::default(), view, 0.0)
}

#[test]
fn a_home_full_of_kv_copies_to_its_emptiest_candidate() {
    let (p, key, [home, a, b], req, kv, bl) = setup();
    assert_eq!(target(&p, key, home, 3, &req, &kv, &bl), Some(b));
    // With d = 2 only the second candidate is in reach.
    assert_eq!(target(&p, key, home, 2, &req, &kv, &bl), Some(a));
}

#[test]
fn a_home_near_the_mean_or_off_its_candidates_keeps_the_state_alone() {
    let (p, key, [home, ..], req, mut kv, bl) = setup();
    let order = p.pick(key, 7).unwrap().order;
    // 0.9 against a mean near 0.42 is relieved; 0.38 is within 1.1 × the mean (0.36).
    kv[home] = 0.38;
    assert_eq!(target(&p, key, home, 3, &req, &kv, &bl), None);
    // A home outside the candidates: the rule would not look for the state there.
    let (_, _, _, _, mut kv, _) = setup();
    kv[order[5]] = 1.0;
    assert_eq!(target(&p, key, order[5], 3, &req, &kv, &bl), None);
}

#[test]
fn a_target_needs_request_room_less_kv_and_no_longer_prefill_queue() {
    let (p, key, [home, a, b], mut req, kv, mut bl) = setup();
    // b over the request bound (⌈1.5 · 31 / 8⌉ = 6): a takes it.
    req[b] = 16.0;
    assert_eq!(target(&p, key, home, 3, &req, &kv, &bl), Some(a));
    // a with more prefill queued than the home: none.
    bl[a] = 50_000.0;
    assert_eq!(target(&p, key, home, 3, &req, &kv, &bl), None);
    // Both back to room and no queue, but above the mean KV: none.
    let (_, _, _, req, mut kv, bl) = setup();
    kv[a] = 0.6;
    kv[b] = 0.6;
    assert_eq!(target(&p, key, home, 3, &req, &kv, &bl), None);
}

/// A state large against a rank's KV would only move the hot spot: the
/// emptiest candidate with 20 % + the state still under the home's 90 % takes
/// it, and none does once every landing would reach the home's level.
#[test]
fn a_target_must_stay_below_the_home_once_the_state_landed() {
    let (p, key, [home, _, b], req, kv, bl) = setup();
    let view = Loads {
        requests: &req,
        kv_usage: &kv,
        backlog: &bl,
    };
    let with = |state| p.rebalance_target(key, home, &rule(3), Rebalance::default(), view, state);
    assert_eq!(with(0.5), Some(b), "0.2 + 0.5 < 0.9");
    assert_eq!(
        with(0.65),
        Some(b),
        "0.3 + 0.65 would pass the home, 0.2 + 0.65 does not"
    );
    assert_eq!(with(0.75), None, "0.2 + 0.75 passes the home's 0.9");
    // An unknown or nonsensical size reads as 0.
    assert_eq!(with(f64::NAN), Some(b));
    assert_eq!(with(-1.0), Some(b));
}
