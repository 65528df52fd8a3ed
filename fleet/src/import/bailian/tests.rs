use super::*;
use crate::trace::SessionId;
use std::io::Cursor;

fn import_text(text: &str) -> Result<Trace, TraceError> {
    let recs = parse(Cursor::new(text.as_bytes()), "b.jsonl")?;
    import_records(recs, &ImportOptions::default(), "b.jsonl", Some("b.jsonl"))
}

/// Two chats written as the Bailian README shows them: 16-token blocks, the
/// last input block re-hashed in the next turn (padding replaced by the first
/// output token), `<think>` tokens stripped before the next turn, and a turn
/// whose parent fell before the trace window.
pub(crate) const CHATS: &str = r#"{"chat_id": 10, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 20, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 11, "parent_chat_id": -1, "timestamp": 1.25, "input_length": 30, "output_length": 5, "type": "search", "turn": 1, "hash_ids": [1, 9]}
{"chat_id": 12, "parent_chat_id": 10, "timestamp": 61.114, "input_length": 70, "output_length": 9, "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5, 6]}
{"chat_id": 13, "parent_chat_id": 12, "timestamp": 70.0, "input_length": 90, "output_length": 3, "type": "text", "turn": 3, "hash_ids": [1, 2, 4, 5, 6, 7]}
{"chat_id": 14, "parent_chat_id": 999, "timestamp": 80.0, "input_length": 33, "output_length": 3, "type": "file", "turn": 4, "hash_ids": [50, 51, 52]}
"#;

#[test]
fn sessions_follow_the_parent_chain() {
    let t = import_text(CHATS).unwrap();
    assert_eq!(t.block_size(), 16);
    assert_eq!(t.sessions().len(), 3);
    let s0 = &t.sessions()[0];
    assert_eq!((s0.id.as_str(), s0.start_ms), ("chat-10", Some(500)));
    let reqs = t.session_requests(SessionId(0));
    let at: Vec<u64> = reqs.iter().map(|&r| t.request(r).at_ms).collect();
    assert_eq!(at, vec![0, 60_614, 69_500]);
    let kinds: Vec<TurnKind> = reqs.iter().map(|&r| t.request(r).opened_by).collect();
    // 60.6 s after its parent: a user reply; 8.9 s after: a tool result.
    assert_eq!(kinds, vec![TurnKind::First, TurnKind::User, TurnKind::Tool]);
    assert_eq!(t.request(reqs[1]).ended_by, Some(EndReason::ToolCall));
    assert_eq!(t.request(reqs[2]).ended_by, Some(EndReason::EndTurn));
    let orphan = t.sessions().iter().position(|s| s.id == "chat-14").unwrap();
    let o = t.session_requests(SessionId(orphan as u32));
    assert_eq!(t.request(o[0]).opened_by, TurnKind::User);

    let rep = report_of(&t).unwrap();
    assert_eq!(rep.orphans, 1);
    // 12 re-hashes 10's last block (padding); 13 keeps all of 12's.
    assert_eq!(
        (
            rep.children_rehash_last,
            rep.children_keep_all,
            rep.children_keep_less
        ),
        (1, 1, 0)
    );
    // 12's prompt (70) is shorter than 10's prompt + output (60)? No; 13's (90) < 70 + 9? No.
    assert_eq!(rep.children_shorter_than_parent_context, 0);
    assert_eq!(rep.types["search"], 1);
}

#[test]
fn stripped_think_tokens_show_in_the_report() {
    // The parent generated 50 tokens, 10 of them <think>…</think> and its
    // markers: the child's prompt carries 40 + 40, not 40 + 50.
    let text = r#"{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 40, "output_length": 50, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 2, "parent_chat_id": 1, "timestamp": 100, "input_length": 80, "output_length": 5, "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5, 6]}"#;
    let rep = report_of(&import_text(text).unwrap()).unwrap();
    assert_eq!(rep.children_shorter_than_parent_context, 1);
    assert_eq!(rep.children_rehash_last, 1);
}

#[test]
fn bad_records_name_their_line() {
    let e = import_text(&CHATS.replace("\"chat_id\": 13", "\"chat_id\": 10")).unwrap_err();
    assert!(e.to_string().contains("`chat_id` 10 appears twice"), "{e}");
    let e =
        import_text(&CHATS.replace("\"timestamp\": 70.0", "\"timestamp\": \"70\"")).unwrap_err();
    assert!(e.to_string().starts_with("b.jsonl:4: "), "{e}");
    let e = import_text("").unwrap_err();
    assert!(e.to_string().contains("no requests"), "{e}");
}

/// Edge records of the published format: a child keeping fewer blocks than
/// its parent's prefix, a child prompt exactly the parent's prompt + output
/// (not shorter), a record naming itself as parent (an orphan, its own
/// session); the API option reaches every request and the report prints what
/// it counted (cargo-mutants survivors in `import_records` and `Display`).
#[test]
fn edge_records_and_the_report_text() {
    let text = r#"{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 40, "output_length": 20, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 2, "parent_chat_id": 1, "timestamp": 100, "input_length": 60, "output_length": 5, "type": "text", "turn": 2, "hash_ids": [1, 7, 8, 9]}
{"chat_id": 3, "parent_chat_id": 3, "timestamp": 200, "input_length": 10, "output_length": 1, "type": "text", "turn": 1, "hash_ids": [20]}"#;
    let recs = parse(Cursor::new(text.as_bytes()), "b.jsonl").unwrap();
    let opts = ImportOptions {
        api: Some(crate::trace::Api::Messages),
        ..ImportOptions::default()
    };
    let t = import_records(recs, &opts, "b.jsonl", None).unwrap();
    assert!(
        t.requests()
            .iter()
            .all(|r| r.api == crate::trace::Api::Messages)
    );
    assert_eq!(t.sessions().len(), 2);
    assert_eq!(t.requests()[2].opened_by, TurnKind::User);
    let rep = report_of(&t).unwrap();
    assert_eq!(
        (
            rep.requests,
            rep.sessions,
            rep.orphans,
            rep.children_keep_less
        ),
        (3, 2, 1, 1)
    );
    assert_eq!(rep.children_shorter_than_parent_context, 0);
    assert_eq!(
        rep.to_string(),
        "2 sessions by parent chain from 3 requests (1 orphans whose parent is outside the trace)\n  \
         children keeping all parent blocks 0, all but the re-hashed last 0, fewer 1; \
         prompts shorter than parent prompt + output 0"
    );
}
