use super::*;
use crate::trace::{RequestId, SessionId};

/// A Claude-Code-like run as the WEKA/AgentX format records it: the main
/// agent reads, calls a tool, hands a task to an Explore subagent (which
/// itself spawns one), gets the result back and ends its turn; an
/// `async_launched` subagent left no requests.
pub(crate) const RUN: &str = r#"{
  "id": "run-1", "models": ["claude"], "block_size": 64, "hash_id_scope": "local",
  "tool_tokens": 900, "system_tokens": 2600,
  "requests": [
    {"t": 100.0, "type": "s", "model": "claude", "in": 3600, "out": 120, "hash_ids": [1, 2, 3],
     "input_types": ["text"], "output_types": ["thinking", "tool_use"], "stop": "tool_use", "api_time": 4.0, "think_time": 0.0},
    {"t": 107.5, "type": "n", "model": "claude", "in": 4100, "out": 80, "hash_ids": [1, 2, 3, 4],
     "input_types": ["tool_result"], "output_types": ["tool_use"], "stop": "tool_use", "api_time": 2.0},
    {"t": 110.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore", "status": "completed",
     "duration_ms": 20000, "models": ["claude"], "tool_tokens": 500, "system_tokens": 700,
     "requests": [
       {"t": 110.5, "type": "n", "model": "claude", "in": 1300, "out": 60, "hash_ids": [1, 9],
        "input_types": ["text"], "stop": "tool_use", "api_time": 1.0},
       {"t": 112.0, "type": "subagent", "agent_id": "agent_002", "subagent_type": "general-purpose", "status": "completed",
        "requests": [{"t": 112.2, "type": "n", "model": "claude", "in": 800, "out": 30, "hash_ids": [1, 12], "stop": "end_turn"}]},
       {"t": 118.0, "type": "n", "model": "claude", "in": 1500, "out": 200, "hash_ids": [1, 9, 10],
        "input_types": ["tool_result"], "stop": "end_turn", "api_time": 3.0}
     ]},
    {"t": 131.0, "type": "n", "model": "claude", "in": 4600, "out": 300, "hash_ids": [1, 2, 3, 4, 5],
     "input_types": ["tool_result"], "stop": "tool_use", "api_time": 5.0},
    {"t": 140.0, "type": "subagent", "agent_id": "agent_003", "subagent_type": "Explore", "status": "async_launched", "requests": []},
    {"t": 140.5, "type": "n", "model": "claude", "in": 4700, "out": 90, "hash_ids": [1, 2, 3, 4, 5, 6],
     "input_types": ["tool_result"], "stop": "end_turn", "api_time": 1.0, "think_time": 0.25}
  ]
}"#;

fn import_json(text: &str, ext: &str) -> Result<Trace, TraceError> {
    let dir = std::env::temp_dir().join(format!(
        "tether-agentx-{}-{}",
        std::process::id(),
        ext.len() + text.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("t.{ext}"));
    std::fs::write(&path, text).unwrap();
    let r = import_path(&path, &ImportOptions::default());
    std::fs::remove_dir_all(&dir).ok();
    r
}

#[test]
fn a_run_becomes_a_session_with_its_subagent_tree() {
    let t = import_json(RUN, "json").unwrap();
    assert_eq!(t.block_size(), 64);
    assert_eq!(t.sessions().len(), 1);
    assert_eq!(t.sessions()[0].id, "run-1");
    assert_eq!(t.sessions()[0].start_ms, None);
    let names: Vec<(&str, &str, Option<&str>)> = t
        .agents()
        .iter()
        .map(|a| {
            (
                a.id.as_str(),
                a.agent_type.as_str(),
                a.parent.map(|p| t.agent(p).id.as_str()),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            ("main", "main", None),
            ("agent_001", "Explore", Some("main")),
            ("agent_002", "general-purpose", Some("agent_001")),
        ]
    );
    let main = &t.agents()[0];
    assert_eq!(
        (main.system_tokens, main.tool_tokens),
        (Some(2600), Some(900))
    );
    let kinds: Vec<(u64, TurnKind, Option<EndReason>, Option<u64>)> = main
        .requests
        .iter()
        .map(|&r| {
            let q = t.request(r);
            (q.at_ms, q.opened_by, q.ended_by, q.gap_ms)
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            (0, TurnKind::First, Some(EndReason::ToolCall), Some(0)),
            // No think_time: gap = t − (previous t + its api_time) = 107.5 − 104.
            (7_500, TurnKind::Tool, Some(EndReason::Handoff), Some(3_500)),
            // Its tool call launched the (empty, skipped) async subagent: still a handoff.
            (
                31_000,
                TurnKind::Handoff,
                Some(EndReason::Handoff),
                Some(21_500)
            ),
            (
                40_500,
                TurnKind::Handoff,
                Some(EndReason::EndTurn),
                Some(250)
            ),
        ]
    );
    let explore = &t.agents()[1];
    assert_eq!(t.turn_of(explore.spawned_by.unwrap()), 1);
    let first_sub = t.request(explore.requests[0]);
    assert_eq!(
        (first_sub.at_ms, first_sub.opened_by),
        (10_500, TurnKind::Handoff)
    );
    assert_eq!(t.request(explore.requests[1]).opened_by, TurnKind::Handoff);
    assert_eq!(t.model_of(main.requests[0]), Some("claude"));
    // Local ids renumbered from 0 in order of appearance; shared ids stay shared.
    assert_eq!(t.hash_ids(main.requests[0]), vec![0, 1, 2]);
    assert_eq!(t.hash_ids(explore.requests[0]), vec![0, 4]);
    let rep = report_of(&t).unwrap();
    assert_eq!(
        (
            rep.traces,
            rep.requests,
            rep.subagents,
            rep.nested_subagents,
            rep.empty_subagents_skipped
        ),
        (1, 7, 2, 1, 1)
    );
}

#[test]
fn local_ids_of_two_traces_never_collide_and_global_ones_are_shared() {
    let one = |id: &str, scope: &str| {
        format!(
            r#"{{"id": "{id}", "models": ["m"], "block_size": 64, "hash_id_scope": "{scope}", "requests": [{{"t": 0, "type": "n", "model": "m", "in": 150, "out": 5, "hash_ids": [1, 2, 3]}}]}}"#
        )
    };
    let text = [
        one("a", "local"),
        one("b", "local"),
        one("c", "global"),
        one("d", "global"),
    ]
    .join("\n");
    let t = import_json(&text, "jsonl").unwrap();
    assert_eq!(t.sessions().len(), 4);
    let ids: Vec<Vec<u64>> = (0..4).map(|i| t.hash_ids(RequestId(i))).collect();
    assert_eq!(
        t.blocks().common_prefix(
            t.request(RequestId(0)).blocks,
            t.request(RequestId(1)).blocks
        ),
        0
    );
    assert_eq!(
        ids[2], ids[3],
        "global ids keep their identity across traces"
    );
    assert!(
        ids[0]
            .iter()
            .all(|x| !ids[1].contains(x) && !ids[2].contains(x))
    );
    // Multi-document .json without the .jsonl extension is read as JSONL too.
    let t2 = import_json(&text, "json").unwrap();
    assert_eq!(t2.requests().len(), 4);
    let rep = report_of(&t).unwrap();
    assert_eq!(rep.scopes["local"], 2);
    assert_eq!(rep.scopes["global"], 2);
}

#[test]
fn a_directory_of_traces_and_a_stagger() {
    let dir = std::env::temp_dir().join(format!("tether-agentx-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("b.json"), RUN.replace("run-1", "run-2")).unwrap();
    std::fs::write(dir.join("a.json"), RUN).unwrap();
    std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
    // Published drops nest traces in subdirectories: they are read too.
    std::fs::create_dir_all(dir.join("v2/deep")).unwrap();
    std::fs::write(dir.join("v2/deep/c.json"), RUN.replace("run-1", "run-3")).unwrap();
    std::fs::write(
        dir.join("v2/d.jsonl"),
        RUN.replace("run-1", "run-4").replace('\n', " "),
    )
    .unwrap();
    std::fs::write(dir.join("v2/README.md"), "# notes").unwrap();
    let opts = ImportOptions {
        agentx_stagger_ms: Some(60_000),
        ..ImportOptions::default()
    };
    let t = import_path(&dir, &opts).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(t.sessions().len(), 4);
    assert_eq!(t.session(SessionId(1)).start_ms, Some(60_000));
    let ids: Vec<&str> = t.sessions().iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["run-1", "run-2", "run-4", "run-3"], "path order");
    let rep = report_of(&t).unwrap();
    assert_eq!(rep.skipped_files.len(), 2, "{:?}", rep.skipped_files);
    assert!(
        rep.skipped_files
            .iter()
            .any(|f| f.ends_with("v2/README.md"))
    );
    assert!(rep.to_string().contains("2 files skipped"), "{rep}");
}

#[test]
fn a_far_early_subagent_marker_does_not_move_the_timeline() {
    // An older export's marker at t = -279,058 s: requests keep their own times.
    let t = import_json(
        &RUN.replace(
            "\"t\": 110.0, \"type\": \"subagent\"",
            "\"t\": -279058.0, \"type\": \"subagent\"",
        ),
        "json",
    )
    .unwrap();
    let at: Vec<u64> = t.requests().iter().map(|r| r.at_ms).collect();
    assert_eq!(at.iter().min(), Some(&0), "the first request is the origin");
    assert!(at.iter().all(|&a| a <= 40_500), "{at:?}");
    let rep = report_of(&t).unwrap();
    assert_eq!(rep.early_subagent_markers, 1);
    assert_eq!(rep.negative_starts, 0);
    assert!(
        rep.to_string().contains("1 subagent markers before"),
        "{rep}"
    );
    // A trace whose requests start at a negative t is shifted like any other.
    let t = import_json(&RUN.replace("\"t\": 100.0,", "\"t\": -5.0,"), "json").unwrap();
    assert_eq!(t.requests().iter().map(|r| r.at_ms).min(), Some(0));
    assert_eq!(t.requests().iter().map(|r| r.at_ms).max(), Some(145_500));
    assert_eq!(report_of(&t).unwrap().negative_starts, 1);
}

#[test]
fn the_api_follows_the_models_unless_given() {
    let api_of = |t: &Trace| t.requests()[0].api;
    let t = import_json(RUN, "json").unwrap();
    assert_eq!(
        api_of(&t),
        Api::Messages,
        "Claude models speak Anthropic Messages"
    );
    assert!(t.requests().iter().all(|r| r.api == Api::Messages));
    assert!(
        report_of(&t)
            .unwrap()
            .to_string()
            .contains("sent as 1 messages")
    );
    let codex = RUN.replace("claude", "gpt-5-codex");
    assert_eq!(
        api_of(&import_json(&codex, "json").unwrap()),
        Api::Responses
    );
    let other = RUN.replace("claude", "qwen3-coder");
    assert_eq!(api_of(&import_json(&other, "json").unwrap()), Api::Chat);
    let dir = std::env::temp_dir().join(format!("tether-agentx-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("t.json"), RUN).unwrap();
    let opts = ImportOptions {
        api: Some(Api::Chat),
        ..ImportOptions::default()
    };
    let t = import_path(&dir.join("t.json"), &opts).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(api_of(&t), Api::Chat, "--api wins");
}

#[test]
fn bad_traces_are_refused_with_the_reason() {
    let e = import_json(&RUN.replace("\"local\"", "\"per-tenant\""), "json").unwrap_err();
    assert!(
        e.to_string()
            .contains("unsupported hash_id_scope `per-tenant`"),
        "{e}"
    );
    let e = import_json(&RUN.replace("\"in\": 4100,", ""), "json").unwrap_err();
    assert!(e.to_string().contains("`in`"), "{e}");
    assert_eq!(e.line, None, "a field error has no line of its own: {e}");
    let two = format!(
        "{}\n{}",
        RUN.replace('\n', " "),
        RUN.replace('\n', " ")
            .replace("\"block_size\": 64", "\"block_size\": 16")
    );
    let e = import_json(&two, "jsonl").unwrap_err();
    assert!(
        e.to_string().contains("one block size") && e.line == Some(2),
        "{e}"
    );
    let e = import_json(r#"{"id": "x", "requests": []}"#, "json").unwrap_err();
    assert!(e.to_string().contains("no requests"), "{e}");
    let e = import_json("{\"id\": 1, \"requests\": [", "json").unwrap_err();
    assert!(e.to_string().contains("t.json"), "{e}");
}

/// A bad line of a JSONL file is named by its 1-based number; times before
/// the trace's start clamp to its start (cargo-mutants survivors: `i + 1` in
/// `read_file`, `&&` in `ms`).
#[test]
fn jsonl_errors_name_their_line_and_early_times_clamp() {
    let one = RUN.replace('\n', " ");
    let text = format!("{one}\n{one}\n{{\"id\": 3, \"requests\": [\n");
    let e = import_json(&text, "jsonl").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert_eq!(ms(99.5, 100.0), 0);
    assert_eq!(ms(f64::NAN, 100.0), 0);
    assert_eq!(ms(f64::INFINITY, 100.0), 0, "no time at infinity");
    assert_eq!(ms(100.25, 100.0), 250);
}

/// A `.json` file cut short is reported where serde stopped (its line), not
/// retried as JSONL: only a syntax error after the first line of text starting
/// with `{` means several objects (cargo-mutants survivors: the JSONL guard in
/// `read_file`, `l > 0` in `json_err`).
#[test]
fn a_truncated_json_file_is_reported_at_its_end() {
    let e = import_json("{\n  \"id\": \"x\",\n  \"requests\": [", "json").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
}
