use super::*;
use crate::trace::{AgentSpec, RequestSpec, SessionSpec, TraceBuilder, TurnKind};

/// main: r0 at 0, r1 at 10_000 (spawns sub), r2 at 60_000;
/// sub (spawned by r1): s0 at 12_000, s1 at 20_000 (before r2: main waits);
/// bg (spawned by r0): b0 at 1_000, b1 at 90_000 (after r1: runs alongside).
fn trace() -> Trace {
    let mut b = TraceBuilder::new(16).unwrap();
    let s = b
        .session(SessionSpec {
            id: "s".into(),
            start_ms: Some(5_000),
            ..Default::default()
        })
        .unwrap();
    let main = b
        .agent(
            s,
            AgentSpec {
                id: "main".into(),
                agent_type: "main".into(),
                ..Default::default()
            },
        )
        .unwrap();
    let sub = b
        .agent(
            s,
            AgentSpec {
                id: "sub".into(),
                agent_type: "x".into(),
                parent: Some("main".into()),
                spawned_by_turn: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
    let bg = b
        .agent(
            s,
            AgentSpec {
                id: "bg".into(),
                agent_type: "x".into(),
                parent: Some("main".into()),
                spawned_by_turn: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
    b.request(main, RequestSpec::new(0, 10, 1, TurnKind::First), &[1])
        .unwrap();
    let mut r1 = RequestSpec::new(10_000, 10, 1, TurnKind::Tool);
    r1.gap_ms = Some(2_000);
    b.request(main, r1, &[1]).unwrap();
    b.request(
        main,
        RequestSpec::new(60_000, 10, 1, TurnKind::Handoff),
        &[1],
    )
    .unwrap();
    b.request(
        sub,
        RequestSpec::new(12_000, 10, 1, TurnKind::Handoff),
        &[2],
    )
    .unwrap();
    b.request(sub, RequestSpec::new(20_000, 10, 1, TurnKind::Tool), &[2])
        .unwrap();
    b.request(bg, RequestSpec::new(1_000, 10, 1, TurnKind::Handoff), &[3])
        .unwrap();
    b.request(bg, RequestSpec::new(90_000, 10, 1, TurnKind::Tool), &[3])
        .unwrap();
    b.build().unwrap()
}

fn ids(v: &[(RequestId, f64, f64)]) -> Vec<u32> {
    v.iter().map(|x| x.0.0).collect()
}

fn by_time(t: &Trace, at: u64) -> RequestId {
    RequestId(t.requests().iter().position(|r| r.at_ms == at).unwrap() as u32)
}

#[test]
fn live_mode_follows_dependencies_and_gaps() {
    let t = trace();
    let mut p = SessionPlan::new(&t, SessionId(0), Mode::Live { max_gap_ms: 10_000 });
    let r = |at| by_time(&t, at);
    let first = p.ready(100.0);
    assert_eq!(ids(&first), vec![r(0).0]);
    assert_eq!(
        first[0].1, 100.0,
        "a session's first request goes at its start"
    );
    assert!(p.ready(100.0).is_empty(), "nothing else until r0 completes");
    p.complete(r(0), 500.0, 400.0);
    let next = p.ready(100.0);
    // r1 (recorded gap 2 s) and bg's first request (derived gap 1000 − 0 − 400 = 600).
    assert_eq!(next.len(), 2);
    let rel = |id: RequestId| next.iter().find(|x| x.0 == id).unwrap().1;
    assert_eq!(rel(r(10_000)), 2_500.0);
    assert_eq!(rel(r(1_000)), 1_100.0);
    p.complete(r(10_000), 3_000.0, 500.0);
    let sub0 = p.ready(100.0);
    assert_eq!(
        ids(&sub0),
        vec![r(12_000).0],
        "r2 waits for the subagent, the subagent starts"
    );
    p.complete(r(12_000), 4_000.0, 10.0);
    let sub1 = p.ready(100.0);
    // 20_000 − 12_000 − 10 = 7_990 ms of derived gap.
    assert_eq!(sub1[0].1, 4_000.0 + 7_990.0);
    p.complete(r(20_000), 13_000.0, 10.0);
    let r2 = p.ready(100.0);
    // r2: main dep r1 (60_000 − 10_000 − 500 capped at 10 s) and the subagent's end.
    assert_eq!(ids(&r2), vec![r(60_000).0]);
    assert_eq!(r2[0].1, 13_000.0);
    p.complete(r(1_000), 1_200.0, 10.0);
    let b1 = p.ready(100.0);
    assert_eq!(
        ids(&b1),
        vec![r(90_000).0],
        "the background subagent runs alongside"
    );
    assert!(!p.is_done());
    p.complete(r(60_000), 14_000.0, 1.0);
    p.complete(r(90_000), 14_000.0, 1.0);
    assert!(p.is_done());
}

#[test]
fn fixed_mode_releases_at_trace_time_or_when_dependencies_allow() {
    let t = trace();
    let mut p = SessionPlan::new(&t, SessionId(0), Mode::Fixed { origin_ms: 4_000 });
    let r = |at| by_time(&t, at);
    let first = p.ready(0.0);
    assert_eq!(first[0].1, 1_000.0, "start 5 000 − origin 4 000");
    p.complete(r(0), 50_000.0, 10.0);
    let next = p.ready(0.0);
    let got = |id: RequestId| *next.iter().find(|x| x.0 == id).unwrap();
    let (_, release, due) = got(r(10_000));
    assert_eq!(
        (release, due),
        (50_000.0, 11_000.0),
        "late dependency: sent late, lag recorded"
    );
}
