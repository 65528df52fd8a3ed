use super::*;
use tether_placement::Endpoint;

fn placement(n: usize) -> Placement {
    let eps: Vec<Endpoint> = (0..n)
        .map(|i| Endpoint {
            address: format!("10.0.0.{}:8000", i + 1),
            weight: 1.0,
            dp_size: 1,
            name: None,
        })
        .collect();
    Placement::new(&eps)
}

const CFG: EjectConfig = EjectConfig {
    failures: 3,
    ms: 1000,
};

#[test]
fn consecutive_failures_eject_and_a_success_clears_them() {
    let mut h = Health::new(3);
    // Two failures, a success, two failures: never three in a row.
    for status in [503, 503, 200, 503, 503] {
        let o = h.record(&CFG, 0, Some(0), 1, status, 10);
        assert!(!o.ejected);
    }
    assert!(!h.ejected(0, 10));
    assert!(h.record(&CFG, 0, Some(0), 1, 503, 10).ejected);
    assert!(h.ejected(0, 10) && h.ejected(0, 1009) && !h.ejected(0, 1010));
    // Failures while out do not extend it.
    assert!(!h.record(&CFG, 0, Some(0), 1, 503, 500).ejected);
    // Back in: one more failure ejects it again, a success keeps it in.
    assert!(h.record(&CFG, 0, Some(0), 1, 503, 1010).ejected);
    assert!(!h.record(&CFG, 0, Some(0), 1, 200, 2010).ejected);
    assert!(!h.record(&CFG, 0, Some(0), 1, 503, 2011).ejected);
    assert!(!h.ejected(0, 2011));
}

#[test]
fn a_retry_that_a_fallback_served_counts_against_the_first_endpoint() {
    let mut h = Health::new(3);
    for _ in 0..2 {
        let o = h.record(&CFG, 1, Some(2), 2, 200, 0);
        assert_eq!(
            o,
            Outcome {
                served_by_fallback: true,
                ejected: false
            }
        );
    }
    assert!(h.record(&CFG, 1, Some(2), 2, 200, 0).ejected);
    assert!(!h.ejected(2, 0));
    // Served by a fallback on the first attempt (the first was skipped):
    // nothing against the first endpoint.
    let mut h = Health::new(3);
    for _ in 0..5 {
        assert!(!h.record(&CFG, 1, Some(2), 1, 200, 0).ejected);
    }
    // Nobody answered (every connection failed): a failure of the first.
    for _ in 0..2 {
        h.record(&CFG, 1, None, 3, 503, 0);
    }
    assert!(h.record(&CFG, 1, None, 3, 503, 0).ejected);
}

#[test]
fn an_ejected_primary_sends_the_key_to_its_first_fallback_and_back() {
    let p = placement(4);
    let mut h = Health::new(4);
    let key = 42;
    let pick = p.pick(key, 2).unwrap();
    let primary = pick.order[0];
    for _ in 0..3 {
        h.record(&CFG, primary, Some(primary), 1, 503, 0);
    }
    let mut moved = pick.clone();
    assert!(h.reorder(&p, key, &mut moved, 5));
    assert_eq!(moved.order, vec![pick.order[1], pick.order[2], primary]);
    // Every key of that primary goes to its own first fallback, every time.
    let mut again = pick.clone();
    h.reorder(&p, key, &mut again, 6);
    assert_eq!(again, moved);
    // Other keys do not move.
    for k in 0..500u64 {
        let mut q = p.pick(k, 2).unwrap();
        let before = q.clone();
        let changed = h.reorder(&p, k, &mut q, 5);
        assert_eq!(changed, before.order[0] == primary, "key {k}");
        if !changed {
            assert_eq!(q, before);
        }
    }
    // After the ejection the key is home again.
    let mut home = pick.clone();
    assert!(!h.reorder(&p, key, &mut home, 1000));
    assert_eq!(home, pick);
}

#[test]
fn when_the_listed_fallbacks_are_out_the_next_choices_serve() {
    let p = placement(5);
    let mut h = Health::new(5);
    let key = 7;
    let all = p.pick(key, 4).unwrap();
    let mut pick = p.pick(key, 1).unwrap();
    for i in &pick.order {
        for _ in 0..3 {
            h.record(&CFG, *i, Some(*i), 1, 500, 0);
        }
    }
    assert!(h.reorder(&p, key, &mut pick, 1));
    assert_eq!(pick.order, vec![all.order[2], all.order[3]]);
    // Everything out: the order stays.
    let mut h = Health::new(1);
    let p1 = placement(1);
    for _ in 0..3 {
        h.record(&CFG, 0, Some(0), 1, 500, 0);
    }
    let mut only = p1.pick(key, 2).unwrap();
    assert!(!h.reorder(&p1, key, &mut only, 1));
    assert_eq!(only.order, vec![0]);
}
