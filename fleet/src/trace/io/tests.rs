use super::*;
use crate::trace::model::{AgentSpec, SessionSpec};
use std::io::Cursor;

fn sample() -> Trace {
    let mut b = TraceBuilder::with_header(Header {
        block_size: 64,
        name: Some("sample".into()),
        source: Some(serde_json::json!({"generator": "test"})),
    })
    .unwrap();
    let s = b
        .session(SessionSpec {
            id: "s1".into(),
            start_ms: Some(500),
            tenant: Some("acme".into()),
            user: Some("u7".into()),
        })
        .unwrap();
    let main = b
        .agent(
            s,
            AgentSpec {
                id: "main".into(),
                agent_type: "planner".into(),
                system_tokens: Some(100),
                tool_tokens: Some(28),
                ..AgentSpec::default()
            },
        )
        .unwrap();
    let mut first = RequestSpec::new(0, 150, 20, TurnKind::First);
    first.ended_by = Some(EndReason::Handoff);
    first.model = Some("m1".into());
    first.messages =
        Some(RawValue::from_string(r#"[{"role":"user","content":"hi"}]"#.to_owned()).unwrap());
    b.request(main, first, &[10, 11, 12]).unwrap();
    let sub = b
        .agent(
            s,
            AgentSpec {
                id: "agent_001".into(),
                agent_type: "explore".into(),
                parent: Some("main".into()),
                spawned_by_turn: Some(0),
                ..AgentSpec::default()
            },
        )
        .unwrap();
    let mut sr = RequestSpec::new(900, 80, 5, TurnKind::Handoff);
    sr.api = Api::Messages;
    sr.gap_ms = Some(20);
    sr.ended_by = Some(EndReason::EndTurn);
    b.request(sub, sr, &[10, 40]).unwrap();
    let mut back = RequestSpec::new(2_000, 260, 9, TurnKind::Handoff);
    back.gap_ms = Some(0);
    b.request(main, back, &[10, 11, 12, 13]).unwrap();
    b.build().unwrap()
}

fn write(t: &Trace, form: IdForm) -> String {
    let mut out = Vec::new();
    write_trace(t, form, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

fn read(text: &str) -> Result<Trace, TraceError> {
    read_trace_from(Cursor::new(text.as_bytes()), "t.jsonl")
}

#[test]
fn written_traces_read_back_identically_in_both_id_forms() {
    let t = sample();
    let runs = write(&t, IdForm::Runs);
    let flat = write(&t, IdForm::Flat);
    assert!(runs.contains(r#""hash_runs":[[10,3]]"#), "{runs}");
    assert!(flat.contains(r#""hash_ids":[10,11,12]"#), "{flat}");
    for text in [&runs, &flat] {
        let back = read(text).unwrap();
        assert_eq!(write(&back, IdForm::Runs), runs);
        assert_eq!(content_hash(&back), content_hash(&t));
        assert_eq!(back.header(), t.header());
    }
    let first = runs.lines().next().unwrap();
    assert_eq!(
        first,
        r#"{"type":"trace","format":"tether-trace","version":1,"block_size":64,"name":"sample","source":{"generator":"test"}}"#
    );
    assert!(runs.contains(r#""spawned_by_turn":0"#));
    assert!(runs.contains(r#""messages":[{"role":"user","content":"hi"}]"#));
}

#[test]
fn the_content_hash_follows_what_a_replay_sends_not_the_name() {
    let t = sample();
    let h = content_hash(&t);
    assert!(h.starts_with("xxh3-128:") && h.len() == 9 + 32, "{h}");
    let renamed = write(&t, IdForm::Runs).replacen(r#""name":"sample""#, r#""name":"other""#, 1);
    assert_eq!(content_hash(&read(&renamed).unwrap()), h);
    let changed =
        write(&t, IdForm::Runs).replacen(r#""input_tokens":260"#, r#""input_tokens":261"#, 1);
    assert_ne!(content_hash(&read(&changed).unwrap()), h);
}

const HEAD: &str = r#"{"type":"trace","format":"tether-trace","version":1,"block_size":16}"#;
const SESSION: &str = r#"{"type":"session","id":"s"}"#;
const AGENT: &str = r#"{"type":"agent","session":"s","id":"main","agent_type":"main"}"#;
const REQ: &str = r#"{"type":"request","session":"s","agent":"main","at_ms":0,"input_tokens":5,"output_tokens":1,"opened_by":"first","hash_ids":[1]}"#;

fn err(lines: &[&str]) -> String {
    read(&lines.join("\n")).unwrap_err().to_string()
}

#[test]
fn bad_input_names_file_line_and_reason() {
    assert!(read(&[HEAD, SESSION, AGENT, REQ].join("\n")).is_ok());
    let e = err(&[HEAD, SESSION, "{oops", REQ]);
    assert!(e.starts_with("t.jsonl:3: "), "{e}");
    let e = err(&[
        HEAD,
        SESSION,
        AGENT,
        &REQ.replace("\"at_ms\"", "\"at_sec\""),
    ]);
    assert!(e.starts_with("t.jsonl:4: ") && e.contains("at_sec"), "{e}");
    let e = err(&[
        HEAD,
        SESSION,
        AGENT,
        &REQ.replace(r#""hash_ids":[1]"#, r#""start_ms":1"#),
    ]);
    assert!(
        e.contains("`start_ms` is not allowed on a `request` line"),
        "{e}"
    );
    let e = err(&[HEAD, SESSION, AGENT, &REQ.replace("first", "tool_result")]);
    assert!(e.contains("unknown `opened_by` `tool_result`"), "{e}");
    let e = err(&[
        HEAD,
        SESSION,
        AGENT,
        &REQ.replace(r#""type":"request""#, r#""type":"turn""#),
    ]);
    assert!(e.contains("unknown line type `turn`"), "{e}");
    let e = err(&[
        HEAD,
        SESSION,
        AGENT,
        &REQ.replace(r#""agent":"main""#, r#""agent":"x""#),
    ]);
    assert!(
        e.starts_with("t.jsonl:4: ") && e.contains("unknown agent `x`"),
        "{e}"
    );
    let e = err(&[
        HEAD,
        SESSION,
        AGENT,
        &REQ.replace(r#""hash_ids":[1]"#, r#""hash_ids":[1],"hash_runs":[[1,1]]"#),
    ]);
    assert!(e.contains("not both"), "{e}");
    let e = err(&[HEAD, SESSION, AGENT]);
    assert!(e.contains("has no requests"), "{e}");
    let e = err(&[HEAD]);
    assert!(e.contains("the trace has no requests"), "{e}");
    assert!(err(&[]).contains("empty file"));
    let e = err(&[&HEAD.replace("\"version\":1", "\"version\":2"), SESSION]);
    assert!(
        e.starts_with("t.jsonl:1: ") && e.contains("version 2 is not supported"),
        "{e}"
    );
    let e = err(&[&HEAD.replace("tether-trace", "weka"), SESSION]);
    assert!(e.contains("unknown trace format `weka`"), "{e}");
    let e = err(&[HEAD, HEAD]);
    assert!(e.contains("second `trace` header"), "{e}");
}

#[test]
fn other_formats_are_recognised_and_pointed_to_the_importer() {
    let e = err(&[
        r#"{"timestamp": 0, "input_length": 6755, "output_length": 500, "hash_ids": [0, 1]}"#,
    ]);
    assert!(
        e.contains("Mooncake") && e.contains("--format mooncake"),
        "{e}"
    );
    let e = err(&[
        r#"{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 9, "output_length": 2, "type": "text", "turn": 1, "hash_ids": [1]}"#,
    ]);
    assert!(e.contains("--format bailian"), "{e}");
    let e = err(&["not json at all"]);
    assert!(e.starts_with("t.jsonl:1: not a tether-trace file"), "{e}");
}
