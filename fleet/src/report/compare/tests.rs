use super::*;
use crate::report::build::tests::{run_info, served, trace};
use crate::report::{BuildInput, Observation, ServingConfig, build};
use crate::trace::SessionId;
use std::collections::BTreeMap;

fn report(label: &str, cached: u64, cache: &str) -> Report {
    let t = trace();
    let o: Vec<Observation> = (0..6u32)
        .map(|i| Observation {
            request: i,
            sent_ms: 0.0,
            lag_ms: 0.0,
            outcome: served(
                u64::from(t.requests()[i as usize].input_tokens),
                cached.min(19),
                "a",
                10.0,
            ),
        })
        .collect();
    let mut run = run_info();
    run.label = label.into();
    let keys: BTreeMap<String, String> = [("rank.cache".to_owned(), cache.to_owned())].into();
    build(BuildInput {
        trace: &t,
        trace_path: "t".into(),
        trace_format: "tether".into(),
        sessions: &[SessionId(0), SessionId(1)],
        observations: &o,
        run,
        config: ServingConfig::new(None, vec![], keys),
        busy_s: BTreeMap::new(),
    })
}

#[test]
fn changed_keys_sit_next_to_metric_changes() {
    let a = report("lru", 0, "lru");
    let b = report("retention", 19, "retention-host");
    let c = compare(&[a, b]).unwrap();
    assert_eq!(
        c.changed,
        vec![(
            "rank.cache".to_owned(),
            vec![Some("lru".to_owned()), Some("retention-host".to_owned())]
        )]
    );
    assert_eq!(c.value("hit ratio", 0), Some(0.0));
    assert!(
        c.value("prefill tokens computed", 1).unwrap()
            < c.value("prefill tokens computed", 0).unwrap()
    );
    let md = c.to_markdown();
    assert!(
        md.contains("| `rank.cache` | lru | retention-host |"),
        "{md}"
    );
    assert!(md.contains("pp)"), "{md}");
}

#[test]
fn reports_of_different_traces_or_scopes_are_refused() {
    let a = report("a", 0, "lru");
    let mut b = report("b", 0, "lru");
    b.trace.content_hash = "xxh3-128:00".into();
    let e = compare(&[a.clone(), b]).unwrap_err();
    assert!(matches!(e, CompareError::DifferentTrace { .. }));
    assert!(e.to_string().contains("different traces"));
    let mut c = report("c", 0, "lru");
    c.trace.sessions = 1;
    assert!(matches!(
        compare(&[a.clone(), c]),
        Err(CompareError::DifferentScope { .. })
    ));
    assert!(matches!(compare(&[a]), Err(CompareError::TooFew)));
}

#[test]
fn deltas_are_points_for_ratios_and_factors_otherwise() {
    assert_eq!(delta(Kind::Ratio, 0.4, 0.9), "+50.0 pp");
    assert_eq!(delta(Kind::Count, 100.0, 20.0), "×0.20");
    assert_eq!(delta(Kind::Ms, 0.0, 0.0), "=");
    assert_eq!(delta(Kind::Count, 0.0, 5.0), "new", "no factor of nothing");
}

/// The same trace with no request served: every latency distribution is empty.
fn unserved(label: &str) -> Report {
    let t = trace();
    let mut run = run_info();
    run.label = label.into();
    build(BuildInput {
        trace: &t,
        trace_path: "t".into(),
        trace_format: "tether".into(),
        sessions: &[SessionId(0), SessionId(1)],
        observations: &[],
        run,
        config: ServingConfig::new(None, vec![], BTreeMap::new()),
        busy_s: BTreeMap::new(),
    })
}

/// The review as printed: unlabeled reports named by position and config
/// hash, the baseline without a change, the others with theirs, unmeasured
/// values as `-`, partial reports named; refusals name the report that differs
/// (cargo-mutants survivors in `label`, `value`, `to_markdown`, `compare`).
#[test]
fn the_markdown_review_shows_values_changes_and_gaps() {
    let a = report("", 0, "lru");
    let b = report("retention", 19, "retention-host");
    let mut e = unserved("stopped");
    e.run.partial = true;
    let c = compare(&[a.clone(), b.clone(), e]).unwrap();
    assert_eq!(c.labels[0], format!("#1 ({})", a.config.hash));
    assert_eq!(c.value("TTFT p50 ms", 0), Some(10.0));
    assert_eq!(c.value("TTFT p50 ms", 2), None, "nothing measured");
    let md = c.to_markdown();
    assert!(md.contains("**Partial reports**: stopped"), "{md}");
    for line in [
        "| requests completed ↑ | 6 | 6 (×1.00) | 0 (×0.00) |",
        "| TTFT p50 ms ↓ | 10.0 | 10.0 (×1.00) | - |",
        "| hit ratio ↑ | 0.0 % | ",
    ] {
        assert!(md.contains(line), "missing {line:?} in\n{md}");
    }
    assert!(
        !compare(&[a.clone(), b.clone()])
            .unwrap()
            .to_markdown()
            .contains("Partial reports")
    );

    let mut other = report("other", 0, "lru");
    other.trace.content_hash = "xxh3-128:00".into();
    match compare(&[a.clone(), b.clone(), other]) {
        Err(CompareError::DifferentTrace { b: l, .. }) => assert_eq!(l, "other"),
        r => panic!("{r:?}"),
    }
    let mut fewer = report("fewer", 0, "lru");
    fewer.trace.sessions = 1;
    match compare(&[a, b, fewer]) {
        Err(CompareError::DifferentScope { b: l, .. }) => assert_eq!(l, "fewer"),
        r => panic!("{r:?}"),
    }
}
