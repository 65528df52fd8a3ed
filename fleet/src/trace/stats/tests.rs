use super::*;
use crate::trace::model::{AgentSpec, RequestSpec, SessionSpec, TraceBuilder};

fn trace() -> Trace {
    let mut b = TraceBuilder::new(16).unwrap();
    let mut add = |id: &str, start: u64, reqs: &[(u64, u32, &[u64])]| {
        let s = b
            .session(SessionSpec {
                id: id.into(),
                start_ms: Some(start),
                ..SessionSpec::default()
            })
            .unwrap();
        let a = b
            .agent(
                s,
                AgentSpec {
                    id: "main".into(),
                    agent_type: "main".into(),
                    ..AgentSpec::default()
                },
            )
            .unwrap();
        for (i, &(at, input, ids)) in reqs.iter().enumerate() {
            let kind = if i == 0 {
                TurnKind::First
            } else {
                TurnKind::Tool
            };
            let mut spec = RequestSpec::new(at, input, 7, kind);
            spec.gap_ms = Some(at);
            b.request(a, spec, ids).unwrap();
        }
    };
    add("a", 0, &[(0, 32, &[1, 2]), (200, 48, &[1, 2, 3])]);
    add("b", 100, &[(0, 20, &[1, 5])]);
    b.build().unwrap()
}

#[test]
fn ideal_hits_count_prefix_blocks_seen_before() {
    let t = trace();
    let h = ideal_hits(&t);
    // Arrival order a1, b1, a2: b1 reuses block 1 (16 tokens) from a1, a2 reuses 1,2 (32).
    assert!((h.global - 48.0 / 100.0).abs() < 1e-12, "{h:?}");
    // Within sessions only a2's 32 tokens.
    assert!((h.session - 32.0 / 100.0).abs() < 1e-12, "{h:?}");
    assert!((h.session_returning - 32.0 / 48.0).abs() < 1e-12, "{h:?}");
}

#[test]
fn stats_add_up() {
    let s = stats(&trace());
    assert_eq!(
        (s.sessions, s.agents, s.subagents, s.requests),
        (2, 2, 0, 3)
    );
    assert_eq!(s.input_tokens_total, 100);
    assert_eq!(s.output_tokens_total, 21);
    assert_eq!(s.opened_by["first"], 2);
    assert_eq!(s.opened_by["tool"], 1);
    assert_eq!(s.ended_by["unknown"], 3);
    assert_eq!(s.span_ms, 200);
    assert_eq!(s.requests_per_session.max, 2);
    assert_eq!(s.distinct_blocks, 4);
    // 48 tokens over 3 blocks of 16 cover it exactly; none short.
    assert_eq!(s.short_hash_ids, 0);
    let text = s.to_string();
    assert!(text.contains("requests     3"), "{text}");
    assert!(text.contains("48.0 % with one infinite cache"), "{text}");
}
