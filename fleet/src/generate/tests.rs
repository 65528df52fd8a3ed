use super::*;
use crate::trace::stats::stats;
use crate::trace::{IdForm, content_hash, write_trace};

fn small() -> GenerateOptions {
    GenerateOptions {
        sessions: 6,
        system_tokens: 600,
        tool_tokens: 400,
        tool_result_tokens: 300.0,
        user_turns_mean: 2.0,
        calls_per_turn_mean: 4.0,
        subagent_share: 0.5,
        subagent_calls_mean: 3.0,
        subagent_system_tokens: 300,
        subagent_tool_tokens: 200,
        ..GenerateOptions::default()
    }
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let a = generate(&small()).unwrap();
    let b = generate(&small()).unwrap();
    assert_eq!(content_hash(&a), content_hash(&b));
    let c = generate(&GenerateOptions { seed: 2, ..small() }).unwrap();
    assert_ne!(content_hash(&a), content_hash(&c));
    // Pinned: a change here changes every committed example trace.
    let mut out = Vec::new();
    write_trace(&a, IdForm::Runs, &mut out).unwrap();
    let first_req = String::from_utf8(out)
        .unwrap()
        .lines()
        .find(|l| l.contains("\"request\""))
        .unwrap()
        .to_owned();
    assert!(first_req.contains(r#""opened_by":"first""#), "{first_req}");
}

#[test]
fn turns_extend_their_prompt_and_subagents_hand_back() {
    let t = generate(&small()).unwrap();
    let bs = t.block_size() as usize;
    let mut handoffs = 0;
    for a in t.agents() {
        for w in a.requests.windows(2) {
            let (p, r) = (t.request(w[0]), t.request(w[1]));
            let shared = t.blocks().common_prefix(p.blocks, r.blocks);
            assert!(r.at_ms >= p.at_ms);
            if r.input_tokens > p.input_tokens {
                // Grows by the previous output and the new message; keeps every full block.
                assert_eq!(shared, p.input_tokens as usize / bs, "{p:?} {r:?}");
            }
            match r.opened_by {
                TurnKind::Tool => assert_eq!(p.ended_by, Some(EndReason::ToolCall)),
                TurnKind::Handoff => {
                    assert_eq!(p.ended_by, Some(EndReason::Handoff));
                    handoffs += 1;
                }
                TurnKind::User => assert_eq!(p.ended_by, Some(EndReason::EndTurn)),
                TurnKind::First => panic!("first only opens a session"),
            }
        }
        let first = t.request(a.requests[0]);
        match a.parent {
            None => assert_eq!(first.opened_by, TurnKind::First),
            Some(parent) => {
                assert_eq!(first.opened_by, TurnKind::Handoff);
                let spawner = t.request(a.spawned_by.unwrap());
                assert_eq!(spawner.agent, parent);
                assert_eq!(spawner.ended_by, Some(EndReason::Handoff));
                assert!(first.at_ms > spawner.at_ms);
            }
        }
    }
    let s = stats(&t);
    assert!(
        s.subagents > 0 && handoffs == s.subagents,
        "{handoffs} {s:?}"
    );
}

#[test]
fn a_shared_system_prompt_is_shared_and_first_messages_are_not() {
    let t = generate(&small()).unwrap();
    let bs = t.block_size() as usize;
    let preamble = 1000 / bs; // full blocks of tools + system prompt
    let firsts: Vec<_> = t
        .sessions()
        .iter()
        .map(|s| t.request(t.agent(s.agents[0]).requests[0]).blocks)
        .collect();
    for w in firsts.windows(2) {
        let shared = t.blocks().common_prefix(w[0], w[1]);
        assert!(shared >= preamble && shared <= preamble + 1, "{shared}");
    }
    let own = generate(&GenerateOptions {
        shared_system_prompt: false,
        ..small()
    })
    .unwrap();
    let firsts: Vec<_> = own
        .sessions()
        .iter()
        .map(|s| own.request(own.agent(s.agents[0]).requests[0]).blocks)
        .collect();
    assert_eq!(own.blocks().common_prefix(firsts[0], firsts[1]), 0);
    assert!(stats(&t).ideal.global > stats(&own).ideal.global);
}

#[test]
fn long_sessions_compact_instead_of_growing_forever() {
    let o = GenerateOptions {
        sessions: 2,
        max_context_tokens: 20_000,
        summary_tokens: 2_000.0,
        ..GenerateOptions::default()
    };
    let t = generate(&o).unwrap();
    assert!(t.requests().iter().all(|r| r.input_tokens <= 20_000 + 64));
    let shrinks = t
        .agents()
        .iter()
        .flat_map(|a| a.requests.windows(2))
        .filter(|w| t.request(w[1]).input_tokens < t.request(w[0]).input_tokens)
        .count();
    assert!(shrinks > 0);
}
