use super::*;

fn eps(n: usize) -> Vec<Endpoint> {
    (0..n)
        .map(|i| Endpoint {
            address: format!("10.0.0.{}:8000", i + 1),
            weight: 1.0,
            dp_size: 4,
            name: None,
        })
        .collect()
}

fn keys(n: u64) -> impl Iterator<Item = u64> {
    (0..n).map(|i| crate::keys::hash_parts(&[b"session", &i.to_le_bytes()]))
}

fn primary(p: &Placement, k: u64) -> String {
    let pick = p.pick(k, 0).unwrap();
    p.endpoints()[pick.order[0]].address.clone()
}

#[test]
fn picks_are_deterministic_and_ordered() {
    let p = Placement::new(&eps(5));
    let q = Placement::new(&eps(5));
    for k in keys(1000) {
        let a = p.pick(k, 2).unwrap();
        assert_eq!(a, q.pick(k, 2).unwrap());
        assert_eq!(a.order.len(), 3);
        let mut uniq = a.order.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), 3, "{:?}", a.order);
        assert_eq!(p.destination(&a).split(',').count(), 3);
    }
}

#[test]
fn weights_are_respected() {
    let mut e = eps(3);
    e[0].weight = 2.0; // 2:1:1 → 50 %, 25 %, 25 %
    let p = Placement::new(&e);
    let n = 40_000;
    let mut count = [0u32; 3];
    for k in keys(n) {
        count[p.pick(k, 0).unwrap().order[0]] += 1;
    }
    let share = |i: usize| f64::from(count[i]) / n as f64;
    assert!((share(0) - 0.5).abs() < 0.015, "{count:?}");
    assert!((share(1) - 0.25).abs() < 0.015, "{count:?}");
    assert!((share(2) - 0.25).abs() < 0.015, "{count:?}");
}

#[test]
fn removing_an_endpoint_moves_only_its_sessions() {
    let n_eps = 8;
    let all = eps(n_eps);
    let before = Placement::new(&all);
    let removed = all[3].address.clone();
    let rest: Vec<Endpoint> = all
        .iter()
        .filter(|e| e.address != removed)
        .cloned()
        .collect();
    let after = Placement::new(&rest);
    let n = 20_000u64;
    let mut moved = 0u64;
    for k in keys(n) {
        let (a, b) = (primary(&before, k), primary(&after, k));
        if a != b {
            assert_eq!(a, removed, "a session of a surviving endpoint moved");
            moved += 1;
        }
        // Its first fallback is where it goes: the ordered list stays useful.
        if a == removed {
            let fb = before.pick(k, 1).unwrap();
            assert_eq!(before.endpoints()[fb.order[1]].address, b);
        }
    }
    let frac = moved as f64 / n as f64;
    assert!((frac - 1.0 / n_eps as f64).abs() < 0.01, "moved {frac}");
}

#[test]
fn adding_an_endpoint_moves_sessions_only_to_it() {
    let before = Placement::new(&eps(6));
    let after = Placement::new(&eps(7));
    let n = 20_000u64;
    let mut moved = 0u64;
    for k in keys(n) {
        let (a, b) = (primary(&before, k), primary(&after, k));
        if a != b {
            assert_eq!(b, "10.0.0.7:8000");
            moved += 1;
        }
    }
    let frac = moved as f64 / n as f64;
    assert!((frac - 1.0 / 7.0).abs() < 0.01, "moved {frac}");
}

#[test]
fn dp_rank_is_uniform_and_independent_of_the_endpoint() {
    let p = Placement::new(&eps(4));
    let n = 40_000u64;
    let mut joint = [[0u32; 4]; 4];
    for k in keys(n) {
        let pick = p.pick(k, 0).unwrap();
        assert!(pick.rank < 4);
        joint[pick.order[0]][pick.rank as usize] += 1;
    }
    // Each (endpoint, rank) cell holds ≈ 1/16 of the keys: the rank does not follow the endpoint.
    for row in &joint {
        for &c in row {
            let share = f64::from(c) / n as f64;
            assert!((share - 1.0 / 16.0).abs() < 0.01, "{joint:?}");
        }
    }
    assert_eq!(dp_rank(42, 1), 0);
}

/// The rank comes from the chosen endpoint's own `dp_size`: with endpoints of
/// different sizes, every rank is below its primary's size, and every rank of
/// each primary is used (a rank from another endpoint's size would break one or
/// the other).
#[test]
fn dp_rank_follows_the_chosen_endpoints_size() {
    let sizes = [8u32, 1, 2, 3];
    let e: Vec<Endpoint> = sizes
        .iter()
        .enumerate()
        .map(|(i, &dp_size)| Endpoint {
            address: format!("10.0.1.{}:8000", i + 1),
            weight: 1.0,
            dp_size,
            name: None,
        })
        .collect();
    let p = Placement::new(&e);
    let mut seen = vec![vec![false; 8]; sizes.len()];
    for k in keys(4_000) {
        let pick = p.pick(k, 1).unwrap();
        let primary = pick.order[0];
        assert!(
            pick.rank < sizes[primary],
            "rank {} on an endpoint of dp_size {}",
            pick.rank,
            sizes[primary]
        );
        assert_eq!(pick.rank, dp_rank(k, sizes[primary]));
        seen[primary][pick.rank as usize] = true;
    }
    for (i, &n) in sizes.iter().enumerate() {
        assert!(
            seen[i][..n as usize].iter().all(|s| *s),
            "endpoint {i}: ranks used {:?}",
            seen[i]
        );
    }
}

/// `unit` maps the whole 64-bit range into the open interval (0, 1), so
/// `ln(u)` is finite and negative for every hash.
#[test]
fn unit_stays_inside_the_open_interval() {
    let lo = unit(0);
    assert!(lo > 0.0 && lo < 1e-15, "{lo}");
    assert_eq!(lo, 0.5 / (1u64 << 53) as f64);
    let hi = unit(u64::MAX);
    assert!(hi < 1.0 && hi > 1.0 - 1e-15, "{hi}");
    // The top hashes get the largest f64 below 1.
    assert_eq!(hi.to_bits(), 1.0f64.to_bits() - 1, "{hi}");
    assert!(unit(1 << 11) > lo);
}

#[test]
fn a_named_endpoint_keeps_its_keys_on_a_new_address() {
    let named = |addrs: &[&str]| {
        let eps: Vec<Endpoint> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Endpoint {
                address: (*a).to_owned(),
                weight: 1.0,
                dp_size: 1,
                name: Some(format!("rank-{i}")),
            })
            .collect();
        Placement::new(&eps)
    };
    let before = named(&["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]);
    let after = named(&["10.0.0.1:8000", "10.0.9.9:9999", "10.0.0.3:8000"]);
    let mut on_moved = 0;
    for key in 0..2000u64 {
        let (b, a) = (before.pick(key, 2).unwrap(), after.pick(key, 2).unwrap());
        assert_eq!(b, a, "key {key}");
        on_moved += usize::from(b.order[0] == 1);
    }
    assert!(on_moved > 400, "the renamed endpoint had keys: {on_moved}");
    // Without names the same move reshuffles that endpoint's keys.
    let plain = |addrs: &[&str]| {
        let eps: Vec<Endpoint> = addrs
            .iter()
            .map(|a| Endpoint {
                address: (*a).to_owned(),
                weight: 1.0,
                dp_size: 1,
                name: None,
            })
            .collect();
        Placement::new(&eps)
    };
    let (b, a) = (
        plain(&["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]),
        plain(&["10.0.0.1:8000", "10.0.9.9:9999", "10.0.0.3:8000"]),
    );
    assert!((0..2000u64).any(|k| b.pick(k, 0) != a.pick(k, 0)));
}
