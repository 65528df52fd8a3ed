use super::*;
use crate::read::scan::{ReadLimits, read_doc, scan_full};
use crate::testkit::{ALL_ORDERS, Convo, SliceFetch, Step};

fn tools() -> Vec<String> {
    vec!["Task".to_owned()]
}

/// Classifies a body both by a whole walk and by a head/tail read with tiny limits.
fn both(api: Api, body: &[u8], parent: bool) -> (Option<Turn>, Option<Turn>) {
    let doc = scan_full(body, api).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    let whole = classify(api, &doc, &view, &tools(), parent);
    let mut f = SliceFetch::new(body);
    let limits = ReadLimits {
        full_max: 0,
        head: 64,
        tail: 64,
    };
    let (view, doc, _) = read_doc(api, body.len(), limits, &mut |s, l| f.fetch(s, l)).unwrap();
    let ends = classify(api, &doc, &view, &tools(), parent);
    (whole, ends)
}

fn kinds(api: Api, c: &Convo, parent: bool) -> Vec<(TurnKind, Option<u32>)> {
    let mut out = Vec::new();
    for order in ALL_ORDERS {
        let (whole, ends) = both(api, &c.body(api, order), parent);
        let (whole, ends) = (whole.unwrap(), ends.unwrap());
        assert_eq!(
            whole.kind, ends.kind,
            "{api:?} {order:?}: whole walk and ends disagree"
        );
        assert!(ends.count.is_none() || ends.count == whole.count);
        out.push((whole.kind, whole.count));
    }
    out.dedup();
    assert_eq!(out.len(), 1, "{api:?}: orders disagree: {out:?}");
    out
}

#[test]
fn turn_kinds_per_format() {
    for api in [Api::Chat, Api::Responses, Api::Messages] {
        let first = Convo::new("sys", "task");
        assert_eq!(
            kinds(api, &first, false),
            vec![(TurnKind::First, Some(1))],
            "{api:?}"
        );
        assert_eq!(
            kinds(api, &first, true),
            vec![(TurnKind::Handoff, Some(1))],
            "{api:?} subagent start"
        );
        let user = first.clone().with(Step::User("again".into()));
        assert_eq!(
            kinds(api, &user, false),
            vec![(TurnKind::User, Some(2))],
            "{api:?}"
        );
        let tool = user.clone().with(Step::Tool {
            id: "c1".into(),
            tool: "Read".into(),
            result: "file".into(),
        });
        assert_eq!(
            kinds(api, &tool, false),
            vec![(TurnKind::Tool, Some(3))],
            "{api:?}"
        );
        let handoff = tool.clone().with(Step::Tool {
            id: "c2".into(),
            tool: "Task".into(),
            result: "sub done".into(),
        });
        assert_eq!(
            kinds(api, &handoff, false),
            vec![(TurnKind::Handoff, Some(4))],
            "{api:?}"
        );
        let parallel = tool.clone().with(Step::Parallel(vec![
            ("p1".into(), "Read".into()),
            ("p2".into(), "Task".into()),
        ]));
        assert_eq!(
            kinds(api, &parallel, false),
            vec![(TurnKind::Handoff, Some(4))],
            "{api:?}"
        );
        let parallel_plain = tool.clone().with(Step::Parallel(vec![
            ("p1".into(), "Read".into()),
            ("p2".into(), "Grep".into()),
        ]));
        assert_eq!(
            kinds(api, &parallel_plain, false),
            vec![(TurnKind::Tool, Some(4))],
            "{api:?}"
        );
        // A tool result whose id matches no Task call is a plain tool turn even if the name appears elsewhere.
        let mismatched = user.clone().with(Step::Tool {
            id: "c9".into(),
            tool: "Read".into(),
            result: "Task".into(),
        });
        assert_eq!(
            kinds(api, &mismatched, false),
            vec![(TurnKind::Tool, Some(3))],
            "{api:?}"
        );
    }
}

#[test]
fn responses_string_input_and_completions() {
    let body = br#"{"model":"m","input":"hello","instructions":"be brief"}"#;
    let doc = scan_full(body, Api::Responses).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    assert_eq!(
        classify(Api::Responses, &doc, &view, &tools(), false).map(|t| t.kind),
        Some(TurnKind::First)
    );
    let body = br#"{"model":"m","prompt":"once upon"}"#;
    let doc = scan_full(body, Api::Completions).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    let t = classify(Api::Completions, &doc, &view, &tools(), false).unwrap();
    assert_eq!((t.kind, t.count), (TurnKind::User, None));
}

#[test]
fn assistant_prefill_is_not_a_prompt_end() {
    let body =
        br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure,"}]}"#;
    let doc = scan_full(body, Api::Messages).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    let t = classify(Api::Messages, &doc, &view, &tools(), false).unwrap();
    assert!(!t.prompt_end);
}

/// One body per format from (calls made, results returned) rounds after a user
/// message: each round is one assistant turn of tool calls `(id, tool)` and the
/// results of the ids listed (a call may go unanswered).
/// One assistant turn: its tool calls `(id, tool)` and the ids answered.
type Round<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);

fn tool_rounds(api: Api, rounds: &[Round<'_>]) -> Vec<u8> {
    use serde_json::{Value as J, json};
    let mut items: Vec<J> = vec![json!({"role": "user", "content": "go"})];
    for (calls, answered) in rounds {
        match api {
            Api::Chat => {
                let tc: Vec<J> = calls
                    .iter()
                    .map(|(id, name)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}))
                    .collect();
                items.push(json!({"role": "assistant", "content": null, "tool_calls": tc}));
                for id in *answered {
                    items.push(json!({"role": "tool", "tool_call_id": id, "content": "ok"}));
                }
            }
            Api::Messages => {
                let uses: Vec<J> = calls
                    .iter()
                    .map(|(id, name)| json!({"type": "tool_use", "id": id, "name": name, "input": {}}))
                    .collect();
                items.push(json!({"role": "assistant", "content": uses}));
                let results: Vec<J> = answered
                    .iter()
                    .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"}))
                    .collect();
                items.push(json!({"role": "user", "content": results}));
            }
            Api::Responses => {
                for (id, name) in *calls {
                    items.push(json!({"type": "function_call", "call_id": id, "name": name, "arguments": "{}"}));
                }
                for id in *answered {
                    items.push(
                        json!({"type": "function_call_output", "call_id": id, "output": "ok"}),
                    );
                }
            }
            Api::Completions => unreachable!("no tool calls in legacy completions"),
        }
    }
    let key = if api == Api::Responses {
        "input"
    } else {
        "messages"
    };
    serde_json::to_vec(&json!({"model": "m", key: items})).unwrap()
}

/// A tool result is a handoff only when its own id answers a subagent-tool call:
/// a `Task` call elsewhere in the run (unanswered in this round, or answered in
/// an earlier round) does not make a plain tool result a handoff.
#[test]
fn handoff_needs_the_result_of_the_task_call_itself() {
    for api in [Api::Chat, Api::Responses, Api::Messages] {
        let kind = |rounds: &[Round<'_>]| {
            let (whole, ends) = both(api, &tool_rounds(api, rounds), false);
            let (whole, ends) = (whole.unwrap(), ends.unwrap());
            assert_eq!(
                whole.kind, ends.kind,
                "{api:?}: whole walk and ends disagree"
            );
            whole.kind
        };
        let task_and_read: &[(&str, &str)] = &[("t1", "Task"), ("r1", "Read")];
        // Both calls made, only the Read answered so far.
        assert_eq!(kind(&[(task_and_read, &["r1"])]), TurnKind::Tool, "{api:?}");
        // The Task answered: a handoff, whichever order the results come in.
        assert_eq!(
            kind(&[(task_and_read, &["t1"])]),
            TurnKind::Handoff,
            "{api:?}"
        );
        assert_eq!(
            kind(&[(task_and_read, &["r1", "t1"])]),
            TurnKind::Handoff,
            "{api:?}"
        );
        // A Task round earlier in the same run, then a plain tool round.
        assert_eq!(
            kind(&[(&[("t1", "Task")], &["t1"]), (&[("r2", "Read")], &["r2"])]),
            TurnKind::Tool,
            "{api:?}"
        );
        // A result whose id matches no call at all, next to an unanswered Task call.
        assert_eq!(
            kind(&[(&[("t1", "Task")], &["zz"])]),
            TurnKind::Tool,
            "{api:?}"
        );
    }
}

#[test]
fn new_turn_bytes_is_what_follows_the_last_assistant_entry() {
    let body = br#"{"messages":[{"role":"user","content":"first"},{"role":"assistant","content":"ok"},{"role":"user","content":"again please"}]}"#;
    let doc = scan_full(body, Api::Chat).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    let tail = br#",{"role":"user","content":"again please"}"#;
    assert_eq!(new_turn_bytes(Api::Chat, &doc, &view), Some(tail.len()));
    let first = br#"{"messages":[{"role":"user","content":"first"}]}"#;
    let doc = scan_full(first, Api::Chat).unwrap();
    let view = View {
        head: first.to_vec(),
        tail: Vec::new(),
        tail_base: first.len(),
        size: first.len(),
    };
    assert_eq!(new_turn_bytes(Api::Chat, &doc, &view), None);
}

/// Classifies a body walked whole (kind, count, prompt end).
fn whole(api: Api, body: &[u8]) -> (TurnKind, Option<u32>, bool) {
    let t = both(api, body, false).0.expect("a conversation");
    (t.kind, t.count, t.prompt_end)
}

/// A prompt of system messages only opens the conversation; one ending with an
/// assistant entry (message or reasoning) is a prefill, not a prompt end
/// (cargo-mutants survivors: deleted arms in `entry`).
#[test]
fn system_only_prompts_are_first_and_assistant_endings_are_no_prompt_end() {
    let chat =
        br#"{"messages":[{"role":"system","content":"a"},{"role":"developer","content":"b"}]}"#;
    assert_eq!(whole(Api::Chat, chat).0, TurnKind::First);
    for item in [
        r#"{"role":"system","content":"a"}"#,
        r#"{"type":"message","role":"developer","content":"a"}"#,
    ] {
        let body = format!(r#"{{"input":[{item}]}}"#);
        assert_eq!(
            whole(Api::Responses, body.as_bytes()).0,
            TurnKind::First,
            "{item}"
        );
    }
    for last in [
        r#"{"type":"reasoning","summary":[]}"#,
        r#"{"type":"message","role":"assistant","content":"Sure,"}"#,
        r#"{"role":"assistant","content":"Sure,"}"#,
    ] {
        let body = format!(r#"{{"input":[{{"role":"user","content":"hi"}},{last}]}}"#);
        let (kind, _, end) = whole(Api::Responses, body.as_bytes());
        assert_eq!((kind, end), (TurnKind::User, false), "{last}");
    }
}

/// Responses items carry a `type`: typed user messages open turns, typed
/// assistant items (reasoning, tool calls) close them (cargo-mutants
/// survivors: `==` -> `!=` and `||` -> `&&` in `count_turns`).
#[test]
fn responses_turn_count_reads_item_types() {
    let body = br#"{"input":[
        {"type":"message","role":"user","content":"fix it"},
        {"type":"reasoning","summary":[]},
        {"type":"function_call","call_id":"c1","name":"bash","arguments":"{}"},
        {"type":"function_call_output","call_id":"c1","output":"ok"},
        {"type":"function_call","call_id":"c2","name":"bash","arguments":"{}"},
        {"type":"function_call_output","call_id":"c2","output":"ok"}
    ]}"#;
    assert_eq!(whole(Api::Responses, body), (TurnKind::Tool, Some(3), true));
}

/// Chat turns counted with `role` read in place (first member): system and
/// developer entries are skipped, an assistant greeting before the first user
/// message closes nothing (cargo-mutants survivors: `==` -> `!=` on the raw
/// role, `||` -> `&&` in the system-role skip). The kind is `user`: the
/// conversation opened with the greeting (`first` and `user` share one
/// retention interval, docs/wire.md).
#[test]
fn chat_turn_count_skips_system_roles_read_in_place() {
    let body = br#"{"messages":[
        {"role":"system","content":"a"},
        {"role":"developer","content":"b"},
        {"role":"assistant","content":"Hi, how can I help?"},
        {"role":"user","content":"fix it"}
    ]}"#;
    assert_eq!(whole(Api::Chat, body), (TurnKind::User, Some(1), true));
}
