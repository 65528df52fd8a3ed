use super::*;
use crate::rendezvous::Endpoint;

const C: LoadBound = LoadBound {
    factor: 1.25,
    floor: 1.0,
};

fn eps(n: usize) -> Vec<Endpoint> {
    (0..n)
        .map(|i| Endpoint {
            address: format!("10.1.0.{}:8000", i + 1),
            weight: 1.0,
            dp_size: 1,
            name: None,
        })
        .collect()
}

fn key(i: u64) -> u64 {
    crate::keys::hash_parts(&[b"session", &i.to_le_bytes()])
}

#[test]
fn the_bound_is_the_papers_ceiling_and_never_zero() {
    // 10 in flight over 4 equal endpoints, c = 1.25: ⌈1.25 · 11 / 4⌉ = 4.
    assert_eq!(load_bound(10.0, 0.25, 1.25), 4.0);
    assert_eq!(load_bound(0.0, 0.25, 1.25), 1.0);
    // A double-weight endpoint gets twice the room.
    assert_eq!(load_bound(10.0, 0.5, 1.25), 7.0);
}

#[test]
fn a_key_stays_on_its_primary_until_it_is_full_then_takes_its_next_choice() {
    let p = Placement::new(&eps(4));
    let k = key(7);
    let order = p.pick(k, 3).unwrap().order;
    let mut loads = vec![0.0; 4];
    assert_eq!(p.pick_bounded(k, 3, &loads, C).unwrap().order[0], order[0]);
    // Primary holding 4 of 4 in flight: bound ⌈1.25 · 5 / 4⌉ = 2 → spill to the first fallback.
    loads[order[0]] = 4.0;
    let b = p.pick_bounded(k, 3, &loads, C).unwrap();
    assert_eq!(b.order[0], order[1]);
    assert_eq!(b.order.len(), 4);
    // The rest keep their rendezvous order, the full primary now second.
    assert_eq!(b.order[1], order[0]);
    // Fallback full too → the next one.
    loads[order[1]] = 4.0;
    assert_eq!(p.pick_bounded(k, 3, &loads, C).unwrap().order[0], order[2]);
    // Every endpoint in a short list over its bound: the least loaded of the list.
    let loads = {
        let mut l = vec![0.0; 4];
        l[order[0]] = 9.0;
        l[order[1]] = 8.0;
        l[order[2]] = 1.0;
        l[order[3]] = 1.0;
        l
    };
    assert_eq!(
        first_under_bound(
            &order[..2],
            &loads,
            &p.shares(),
            20.0,
            LoadBound {
                factor: 1.1,
                floor: 1.0
            }
        ),
        Some(1)
    );
}

#[test]
fn bounded_load_caps_the_hottest_endpoint() {
    // 2,000 keys, most of them on few endpoints (a skewed key set): with c = 1.25
    // no endpoint ends above ⌈1.25 · n / endpoints⌉, and keys that fit stay on their primary.
    let p = Placement::new(&eps(8));
    let shares = p.shares();
    let mut loads = vec![0.0; 8];
    let mut moved = 0;
    for i in 0..2000u64 {
        // Half the traffic from 20 hot keys.
        let k = if i % 2 == 0 { key(i % 20) } else { key(i) };
        let order = p.pick(k, 7).unwrap().order;
        let total = loads.iter().sum();
        let pos = first_under_bound(&order, &loads, &shares, total, C).unwrap();
        moved += usize::from(pos > 0);
        loads[order[pos]] += 1.0;
    }
    let max = loads.iter().cloned().fold(0.0, f64::max);
    assert!(max <= (1.25f64 * 2000.0 / 8.0).ceil(), "{loads:?}");
    assert!(moved > 0 && moved < 1000, "moved {moved}");
}

#[test]
fn least_loaded_breaks_ties_by_the_keys_rendezvous_order() {
    let p = Placement::new(&eps(6));
    let k = key(3);
    let order = p.pick(k, 5).unwrap().order;
    let zeros = vec![0.0; 6];
    // All idle: the key's primary (so a session's prefills meet its prefix again).
    assert_eq!(p.least_loaded(k, 0..6, &zeros), Some(order[0]));
    let mut loads = vec![2.0; 6];
    loads[order[4]] = 1.0;
    assert_eq!(p.least_loaded(k, 0..6, &loads), Some(order[4]));
    // Only the candidates given count; unknown indices are skipped.
    assert_eq!(
        p.least_loaded(k, [order[2], order[3], 99], &zeros),
        Some(order[2])
    );
    assert_eq!(p.least_loaded(k, [99], &zeros), None);
    // Same view, same answer (replicas agree).
    let q = Placement::new(&eps(6));
    assert_eq!(
        q.least_loaded(k, 0..6, &loads),
        p.least_loaded(k, 0..6, &loads)
    );
}

#[test]
fn disaggregate_only_above_the_uncached_threshold() {
    assert!(disaggregate(10_000, 0, 2048));
    // A returning turn whose prefix the decode endpoint holds prefills in place.
    assert!(!disaggregate(10_000, 9_000, 2048));
    assert!(!disaggregate(2048, 0, 2048));
    assert!(disaggregate(2049, 0, 2048));
    assert!(!disaggregate(100, 500, 0));
}

#[test]
fn partial_selection_gives_the_full_sorts_prefix() {
    let p = Placement::new(&eps(50));
    for i in 0..200 {
        let k = key(i);
        let full = p.pick(k, 49).unwrap();
        for f in [0usize, 1, 3, 10, 48, 49, 80] {
            let part = p.pick(k, f).unwrap();
            assert_eq!(part.order[..], full.order[..(f + 1).min(50)]);
            assert_eq!(part.rank, full.rank);
        }
    }
}

#[test]
fn below_the_floor_a_key_never_spills() {
    let p = Placement::new(&eps(8));
    let k = key(11);
    let order = p.pick(k, 7).unwrap().order;
    // 3 in flight over 8 endpoints, all on the primary: the paper's bound is
    // ⌈1.25 · 4 / 8⌉ = 1, so without a floor the key leaves its primary …
    let mut loads = vec![0.0; 8];
    loads[order[0]] = 3.0;
    assert_ne!(p.pick_bounded(k, 7, &loads, C).unwrap().order[0], order[0]);
    // … with a floor of 4 it stays, and spills once the primary holds 4.
    let floor = LoadBound {
        factor: 1.25,
        floor: 4.0,
    };
    assert_eq!(floor.capacity(3.0, 1.0 / 8.0), 4.0);
    assert_eq!(
        p.pick_bounded(k, 7, &loads, floor).unwrap().order[0],
        order[0]
    );
    loads[order[0]] = 4.0;
    assert_ne!(
        p.pick_bounded(k, 7, &loads, floor).unwrap().order[0],
        order[0]
    );
    // Under heavy load the proportional bound governs.
    assert_eq!(floor.capacity(800.0, 1.0 / 8.0), 126.0);
}
