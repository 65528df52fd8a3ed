//! Fixtures written from TraceLab's published schema (`artifacts/utils/DB_SCHEMA.md`,
//! `artifacts/utils/timing.py` of uw-syfi/TraceLab): rounds of a Claude Code
//! session with tool calls, a compaction, an untimed round, and a Codex session.

use super::*;

fn round(
    session: &str,
    index: i64,
    input: u64,
    prefix: Option<u64>,
    first_input: &str,
    tools: usize,
    events: &[(&str, &str)],
) -> String {
    serde_json::json!({
        "provider": if session.starts_with("codex") { "codex" } else { "claude" },
        "project": "repo-a",
        "session_id": session,
        "session_file": format!("{session}.jsonl"),
        "round_index": index,
        "round_id": "dup",
        "model": "claude-sonnet-4-5",
        "input_tokens_total": input,
        "prefix_tokens": prefix,
        "newly_append_tokens": prefix.map(|p| input - p),
        "output_tokens": 120,
        "reasoning_output_tokens": null,
        "first_input_event_type": first_input,
        "current_tool_result_count": usize::from(first_input == "tool_result"),
        "current_user_message_count": usize::from(first_input == "user_message"),
        "tools": (0..tools).map(|i| serde_json::json!({"tool_name": "Bash", "tool_call_id": format!("t{i}")})).collect::<Vec<_>>(),
        "timing_events": events.iter().map(|(k, t)| serde_json::json!({"event_type": k, "source": "x", "timestamp": t})).collect::<Vec<_>>(),
    })
    .to_string()
}

pub(crate) fn fixture() -> String {
    [
        // Out of order in the file: round 1 before round 0 (sorted by round_index).
        round(
            "s1",
            1,
            12_000,
            Some(10_000),
            "tool_result",
            0,
            &[
                ("tool_result", "2026-03-01T10:00:07.000Z"),
                ("text", "2026-03-01T10:00:09.500Z"),
            ],
        ),
        round(
            "s1",
            0,
            10_000,
            Some(0),
            "user_message",
            1,
            &[
                ("user_message", "2026-03-01T10:00:00.000Z"),
                ("reasoning", "2026-03-01T10:00:01.000Z"),
                ("tool_call", "2026-03-01T10:00:02.000Z"),
            ],
        ),
        // A user reply a minute later, then a compaction (prefix far shorter).
        round(
            "s1",
            2,
            12_500,
            Some(12_000),
            "user_message",
            0,
            &[
                ("user_message", "2026-03-01T10:01:10+00:00"),
                ("text", "2026-03-01T10:01:12+00:00"),
            ],
        ),
        round("s1", 3, 3_000, Some(1_000), "user_message", 0, &[]),
        round(
            "codex-1",
            0,
            5_000,
            None,
            "user_message",
            0,
            &[("user_message", "2026-03-01T09:59:58")],
        ),
    ]
    .join("\n")
}

fn import_text(text: &str, opts: &ImportOptions) -> Result<Trace, TraceError> {
    let dir = std::env::temp_dir().join(format!(
        "tether-tracelab-{}-{}",
        std::process::id(),
        text.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.jsonl");
    std::fs::write(&p, text).unwrap();
    let r = import_file(&p, opts);
    std::fs::remove_dir_all(&dir).ok();
    r
}

#[test]
fn rounds_become_sessions_with_made_up_prefix_chains() {
    let t = import_text(&fixture(), &ImportOptions::default()).unwrap();
    assert_eq!(t.sessions().len(), 2);
    assert_eq!(t.block_size(), BLOCK_SIZE);
    let sid = |id: &str| {
        let i = t.sessions().iter().position(|s| s.id == id).unwrap();
        crate::trace::SessionId(i as u32)
    };
    let (s1, codex) = (sid("repo-a/s1"), sid("repo-a/codex-1"));
    // The Codex session's round (09:59:58) is the trace's origin.
    assert_eq!(t.session(s1).start_ms, Some(2_000));
    assert_eq!(t.session(codex).start_ms, Some(0));
    let reqs = t.session_requests(s1);
    let r: Vec<_> = reqs.iter().map(|&q| t.request(q)).collect();
    assert_eq!(
        r.iter().map(|q| q.input_tokens).collect::<Vec<_>>(),
        [10_000, 12_000, 12_500, 3_000]
    );
    assert_eq!(
        r.iter().map(|q| q.at_ms).collect::<Vec<_>>(),
        [0, 7_000, 70_000, 70_000],
        "untimed round sent with its predecessor"
    );
    assert_eq!(
        r.iter().map(|q| q.opened_by).collect::<Vec<_>>(),
        [
            TurnKind::First,
            TurnKind::Tool,
            TurnKind::User,
            TurnKind::User
        ]
    );
    assert_eq!(r[0].ended_by, Some(EndReason::ToolCall));
    assert_eq!(r[1].ended_by, Some(EndReason::EndTurn));
    assert_eq!(
        r[1].gap_ms,
        Some(5_000),
        "tool time: last output to the tool result"
    );
    assert_eq!(r[0].api, Api::Messages);
    // Round 1 shares the 10,000-token prefix: its 156 full blocks repeat round 0's.
    let ids: Vec<Vec<u64>> = reqs.iter().map(|&q| t.hash_ids(q)).collect();
    assert_eq!(ids[0].len(), 157);
    assert_eq!(ids[1].len(), 188);
    assert_eq!(ids[1][..156], ids[0][..156]);
    assert_ne!(ids[1][156], ids[0][156], "a partial block is not shared");
    assert_eq!(ids[2][..187], ids[1][..187]);
    // The compaction keeps 1,000 tokens: 15 blocks.
    assert_eq!(ids[3][..15], ids[2][..15]);
    assert_ne!(ids[3][15], ids[2][15]);
    let rep = report_of(&t).unwrap();
    assert_eq!(rep.rounds, 5);
    assert_eq!(rep.untimed, 1);
    assert_eq!(rep.prefix_breaks, 1);
    assert_eq!(rep.providers.get("codex"), Some(&1));
    assert_eq!(t.request(t.session_requests(codex)[0]).api, Api::Responses);
    assert!(rep.to_string().contains("5 TraceLab rounds"), "{rep}");
}

#[test]
fn api_can_be_forced_and_bad_rounds_are_named_by_line() {
    let opts = ImportOptions {
        api: Some(Api::Chat),
        ..ImportOptions::default()
    };
    let t = import_text(&fixture(), &opts).unwrap();
    assert!(t.requests().iter().all(|r| r.api == Api::Chat));
    let bad = format!("{}\n{{\"session_id\": \"s\"}}\n", fixture());
    let e = import_text(&bad, &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains(":6: not a TraceLab round"), "{e}");
    assert!(e.contains("input_tokens_total"), "{e}");
    let huge = round("s", 0, u64::MAX, Some(7), "user_message", 0, &[]);
    let t = import_text(&huge, &ImportOptions::default()).unwrap();
    assert_eq!(t.requests()[0].input_tokens, 1 << 24);
    assert_eq!(report_of(&t).unwrap().clamped, 1);
    let e = import_text("\n\n", &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no rounds"), "{e}");
}

#[test]
fn timestamps_parse_with_or_without_an_offset() {
    assert_eq!(parse_ms("1970-01-01T00:00:01.5Z"), Some(1_500));
    assert_eq!(parse_ms("1970-01-01T01:00:00+01:00"), Some(0));
    assert_eq!(parse_ms("1970-01-01T00:00:02"), Some(2_000));
    assert_eq!(parse_ms("yesterday"), None);
    assert_eq!(parse_ms(""), None);
}
