use super::*;
use crate::trace::RequestId;
use std::io::Cursor;

fn import_text(text: &str, opts: &ImportOptions) -> Result<Trace, TraceError> {
    let recs = parse(Cursor::new(text.as_bytes()), "m.jsonl")?;
    import_records(recs, opts, "m.jsonl", Some("m.jsonl"))
}

/// Five chats behind one system prompt (block 0), written as the Mooncake
/// conversation trace is: ids numbered in order of first appearance, the last
/// partial block re-hashed every turn, a shorter regenerated last turn.
pub(crate) const CHATS: &str = r#"{"timestamp": 0, "input_length": 1400, "output_length": 50, "hash_ids": [0, 1, 2]}
{"timestamp": 0, "input_length": 1400, "output_length": 40, "hash_ids": [0, 3, 4]}
{"timestamp": 1000, "input_length": 1350, "output_length": 60, "hash_ids": [0, 5, 6]}
{"timestamp": 2000, "input_length": 1200, "output_length": 60, "hash_ids": [0, 7, 8]}

{"timestamp": 5000, "input_length": 1500, "output_length": 30, "hash_ids": [0, 1, 9]}
{"timestamp": 9000, "input_length": 1250, "output_length": 70, "hash_ids": [0, 10, 11]}
{"timestamp": 95000, "input_length": 2100, "output_length": 80, "hash_ids": [0, 3, 12, 13, 14]}
{"timestamp": 96000, "input_length": 1900, "output_length": 80, "hash_ids": [0, 1, 15, 16]}
{"timestamp": 97000, "input_length": 1700, "output_length": 20, "hash_ids": [0, 1, 15, 17]}
"#;

#[test]
fn chats_behind_one_system_prompt_become_separate_sessions() {
    let t = import_text(CHATS, &ImportOptions::default()).unwrap();
    assert_eq!(t.block_size(), 512);
    assert_eq!(t.sessions().len(), 5);
    assert_eq!(t.requests().len(), 9);
    let by_session: Vec<(String, Vec<u64>, Vec<TurnKind>)> = t
        .sessions()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let ids = t.session_requests(crate::trace::SessionId(i as u32));
            (
                s.id.clone(),
                ids.iter().map(|&r| t.arrival_ms(r).unwrap()).collect(),
                ids.iter().map(|&r| t.request(r).opened_by).collect(),
            )
        })
        .collect();
    // Chat 0: 0 ms, a continuation 5 s later (tool), one 96 s later (user),
    // its shorter regeneration 1 s after that (user).
    assert_eq!(
        by_session[0].1,
        vec![0, 5_000, 96_000, 97_000],
        "{by_session:?}"
    );
    assert_eq!(
        by_session[0].2,
        vec![
            TurnKind::First,
            TurnKind::Tool,
            TurnKind::User,
            TurnKind::User
        ]
    );
    // Chat 1 returns after 95 s: a user turn.
    assert_eq!(by_session[1].2, vec![TurnKind::First, TurnKind::User]);
    let first = &t.requests()[0];
    assert_eq!(first.ended_by, Some(EndReason::ToolCall));
    assert_eq!(t.session(first.session).start_ms, Some(0));
    let d = derivation_of(&t).unwrap();
    assert_eq!(d.conversations, 5);
    assert_eq!(d.common_heads, 1);
    assert_eq!(t.hash_ids(RequestId(1)), vec![0, 1, 9]);
    let src = t.header().source.as_ref().unwrap();
    assert_eq!(src["format"], "mooncake");
    assert_eq!(src["tool_turns"], 1);
}

#[test]
fn tool_gap_and_block_size_are_options() {
    let opts = ImportOptions {
        tool_gap_ms: 0,
        mooncake_block_size: 16,
        api: Some(crate::trace::Api::Messages),
        ..ImportOptions::default()
    };
    let t = import_text(CHATS, &opts).unwrap();
    assert!(t.requests().iter().all(|r| r.opened_by != TurnKind::Tool));
    assert!(
        t.requests()
            .iter()
            .all(|r| r.api == crate::trace::Api::Messages)
    );
    assert_eq!(t.block_size(), 16);
}

#[test]
fn explicit_session_ids_are_taken_as_given() {
    let text = r#"{"session_id": "a", "timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
{"session_id": "b", "timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}
{"session_id": "a", "timestamp": 2, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}"#;
    let t = import_text(text, &ImportOptions::default()).unwrap();
    assert_eq!(t.sessions().len(), 2);
    assert_eq!(t.sessions()[0].id, "a");
    assert!(derivation_of(&t).is_none());
    assert_eq!(
        t.header().source.as_ref().unwrap()["sessions"],
        "explicit session_id"
    );
}

#[test]
fn bad_records_name_their_line() {
    let e = import_text(
        "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n\n{oops}",
        &ImportOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.to_string().starts_with("m.jsonl:3: "), "{e}");
    let e = import_text(
        "{\"timestamp\":0,\"output_length\":1}",
        &ImportOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("input_length"), "{e}");
    let e = import_text(
        "{\"timestamp\":-5,\"input_length\":1,\"output_length\":1}",
        &ImportOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("timestamp"), "{e}");
    let e = import_text("\n\n", &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("no requests"), "{e}");
}

/// A response followed by a tool continuation ended in a tool call; one
/// followed by a user turn, or by nothing, ended its turn. Arrivals keep
/// their timestamps when the conversation starts late (cargo-mutants
/// survivors: the match guard on the next turn's kind, `ts(i) - ts(c)`).
#[test]
fn responses_end_by_what_follows_and_late_conversations_keep_their_times() {
    let t = import_text(CHATS, &ImportOptions::default()).unwrap();
    let chat0 = t.session_requests(crate::trace::SessionId(0));
    let ended: Vec<_> = chat0.iter().map(|&r| t.request(r).ended_by).collect();
    assert_eq!(
        ended,
        vec![
            Some(EndReason::ToolCall),
            Some(EndReason::EndTurn),
            Some(EndReason::EndTurn),
            Some(EndReason::EndTurn)
        ]
    );
    let late = r#"{"timestamp": 1000, "input_length": 1400, "output_length": 50, "hash_ids": [0, 1, 2]}
{"timestamp": 3000, "input_length": 2400, "output_length": 50, "hash_ids": [0, 1, 2, 3, 4]}
"#;
    let t = import_text(late, &ImportOptions::default()).unwrap();
    assert_eq!(t.sessions().len(), 1);
    assert_eq!(t.session(t.requests()[0].session).start_ms, Some(1000));
    let arrivals: Vec<u64> = (0..2)
        .map(|i| t.arrival_ms(RequestId(i)).unwrap())
        .collect();
    assert_eq!(arrivals, vec![1000, 3000]);
}
