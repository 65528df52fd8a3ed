//! Small agent traces for the simulator's tests: sessions of growing turns on a
//! shared system prompt, some with a subagent, built through the trace builder.

use crate::trace::{
    AgentSpec, RequestId, RequestSpec, SessionId, SessionSpec, Trace, TraceBuilder, TurnKind,
};

/// The main agent's requests of session `s`, in order.
pub fn main_requests(t: &Trace, s: u32) -> Vec<RequestId> {
    t.agent(t.session(SessionId(s)).agents[0]).requests.clone()
}

/// `sessions` sessions of `turns` turns, one every `gap_ms` per session,
/// sessions starting `stagger_ms` apart; block size `bs`; every third session
/// has a subagent; `tenants` > 0 spreads sessions over tenants.
pub fn agent_trace(sessions: u32, turns: u32, gap_ms: u64, stagger_ms: u64, bs: u32) -> Trace {
    let mut b = TraceBuilder::new(bs).unwrap();
    // Block ids: 0..4 the shared system prompt; each session's own ids from 1000·(s+1).
    for s in 0..sessions {
        let sid = b
            .session(SessionSpec {
                id: format!("s{s}"),
                start_ms: Some(u64::from(s) * stagger_ms),
                tenant: None,
                user: (s % 5 == 0).then(|| format!("u{}", s / 10)),
            })
            .unwrap();
        let main = b
            .agent(
                sid,
                AgentSpec {
                    id: "main".into(),
                    agent_type: "main".into(),
                    ..Default::default()
                },
            )
            .unwrap();
        let base = 1000 * (u64::from(s) + 1);
        let mut ids: Vec<u64> = (0..4).collect();
        for t in 0..turns {
            // Each turn adds 2 blocks of its own and a partial block.
            ids.extend([base + 2 * u64::from(t), base + 2 * u64::from(t) + 1]);
            // Every id a full block, plus half of the turn's own partial block.
            let input = ids.len() as u32 * bs + bs / 2;
            let kind = if t == 0 {
                TurnKind::First
            } else {
                TurnKind::Tool
            };
            let mut with_partial = ids.clone();
            with_partial.push(base + 500 + u64::from(t));
            b.request(
                main,
                RequestSpec::new(u64::from(t) * gap_ms, input, 20 + 7 * t, kind),
                &with_partial,
            )
            .unwrap();
        }
        if s % 3 == 0 {
            let sub = b
                .agent(
                    sid,
                    AgentSpec {
                        id: "sub".into(),
                        agent_type: "explore".into(),
                        parent: Some("main".into()),
                        spawned_by_turn: Some(0),
                        ..Default::default()
                    },
                )
                .unwrap();
            let mut sids: Vec<u64> = vec![0, 1, base + 900];
            for t in 0..2u32 {
                sids.push(base + 901 + u64::from(t));
                b.request(
                    sub,
                    RequestSpec::new(
                        gap_ms / 2 + u64::from(t) * gap_ms,
                        sids.len() as u32 * bs,
                        30,
                        if t == 0 {
                            TurnKind::Handoff
                        } else {
                            TurnKind::Tool
                        },
                    ),
                    &sids,
                )
                .unwrap();
            }
        }
    }
    b.build().unwrap()
}

/// One single-request session per spec: a main agent sending `input` tokens
/// over `ids` (block size 16).
pub fn one_turn_sessions(specs: Vec<SessionSpec>, input: u32, ids: &[u64]) -> Trace {
    let mut b = TraceBuilder::new(16).unwrap();
    for spec in specs {
        let s = b.session(spec).unwrap();
        let main = AgentSpec {
            id: "main".into(),
            agent_type: "main".into(),
            ..Default::default()
        };
        let m = b.agent(s, main).unwrap();
        b.request(m, RequestSpec::new(0, input, 1, TurnKind::First), ids)
            .unwrap();
    }
    b.build().unwrap()
}
