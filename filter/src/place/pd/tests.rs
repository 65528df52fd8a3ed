use super::*;
use tether_placement::Endpoint;

fn ep(a: &str) -> Endpoint {
    Endpoint {
        address: a.to_owned(),
        weight: 1.0,
        dp_size: 2,
        name: None,
    }
}

fn cfg() -> PdConfig {
    PdConfig {
        prefill: vec![
            ep("10.0.1.1:8000"),
            ep("10.0.1.2:8000"),
            ep("10.0.1.3:8000"),
        ],
        threshold_tokens: 1000,
        bytes_per_token: 4.0,
    }
}

#[test]
fn a_returning_turn_on_its_primary_is_mostly_cached() {
    let e = estimate(40_000, Some(400), false, 4.0);
    assert_eq!(
        e,
        Estimate {
            prompt_tokens: 10_000,
            expected_cached: 9_900
        }
    );
    // Spilled off its primary: nothing expected cached there.
    assert_eq!(estimate(40_000, Some(400), true, 4.0).expected_cached, 0);
    // First turn (no assistant entry): nothing cached.
    assert_eq!(estimate(40_000, None, false, 4.0).expected_cached, 0);
    // Nonsense sizes never underflow.
    assert_eq!(estimate(10, Some(400), false, 4.0).expected_cached, 0);
}

#[test]
fn only_a_long_uncached_prompt_is_disaggregated() {
    let c = cfg();
    let p = Placement::new(&c.prefill);
    let loads = [0.0; 3];
    // 10,000 tokens, 9,900 expected cached: 100 uncached, under the threshold.
    assert_eq!(
        prefiller(&c, &p, 7, estimate(40_000, Some(400), false, 4.0), &loads),
        None
    );
    // A first turn of 10,000 tokens: over it.
    assert!(prefiller(&c, &p, 7, estimate(40_000, None, false, 4.0), &loads).is_some());
    // Exactly at the threshold stays local (llm-d: strictly more).
    assert_eq!(
        prefiller(&c, &p, 7, estimate(4_000, None, false, 4.0), &loads),
        None
    );
    assert!(prefiller(&c, &p, 7, estimate(4_004, None, false, 4.0), &loads).is_some());
}

#[test]
fn the_prefiller_is_the_least_loaded_then_the_keys_rendezvous_choice() {
    let c = cfg();
    let p = Placement::new(&c.prefill);
    let long = estimate(400_000, None, false, 4.0);
    assert_eq!(prefiller(&c, &p, 7, long, &[500.0, 20.0, 900.0]), Some(1));
    // Equal loads: the key's rendezvous primary, the same on every replica.
    for key in 0..50u64 {
        let primary = p.pick(key, 0).unwrap().order[0];
        assert_eq!(prefiller(&c, &p, key, long, &[0.0; 3]), Some(primary));
    }
    // Keys spread over the pool when loads are equal.
    let used: std::collections::BTreeSet<_> = (0..50u64)
        .filter_map(|k| prefiller(&c, &p, k, long, &[0.0; 3]))
        .collect();
    assert_eq!(used.len(), 3);
}
