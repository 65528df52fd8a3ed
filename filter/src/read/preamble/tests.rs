use crate::api::Api;
use crate::read::scan::scan_full;
use crate::testkit::whole_view;

/// A Claude Code-shaped Messages body (SDK key order): `turns` user turns
/// of tool results, `system` after the messages with the billing-header
/// block first (its `cch` varying per request), tools last.
fn claude_code(cch: &str, turns: usize, agent_prompt: &str) -> Vec<u8> {
    let mut messages = String::from(r#"{"role":"user","content":"Fix the failing test"}"#);
    for i in 1..turns {
        messages.push_str(&format!(
            r#",{{"role":"assistant","content":[{{"type":"tool_use","id":"t{i}","name":"Bash","input":{{}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t{i}","content":"ok"}}]}}"#
        ));
    }
    format!(
        r#"{{"max_tokens":32000,"messages":[{messages}],"model":"claude-sonnet-4-5","system":[{{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.37; cch={cch};"}},{{"type":"text","text":"{agent_prompt}","cache_control":{{"type":"ephemeral"}}}}],"tools":[{{"name":"Bash","input_schema":{{}}}}],"metadata":{{"user_id":"u-1"}}}}"#
    )
    .into_bytes()
}

fn head(body: &[u8]) -> u64 {
    let doc = scan_full(body, Api::Messages).unwrap();
    crate::read::head::head_hash(Api::Messages, &doc, &whole_view(body)).unwrap()
}

#[test]
fn the_billing_header_block_does_not_change_the_head() {
    let prompt = "You are Claude Code, Anthropic's official CLI for Claude.";
    let heads: Vec<u64> = ["8f1a2", "03bc9", "e77d0", "1a2b3"]
        .iter()
        .enumerate()
        .map(|(turn, cch)| head(&claude_code(cch, turn + 1, prompt)))
        .collect();
    assert!(heads.iter().all(|h| *h == heads[0]), "{heads:x?}");
    // Another agent (a subagent's own prompt) still has its own head.
    assert_ne!(
        head(&claude_code("8f1a2", 1, "You are a code reviewer.")),
        heads[0]
    );
}

#[test]
fn a_system_without_varying_blocks_hashes_as_before() {
    // Raw bytes, exactly as the other top-level parts: keys of every other
    // Messages client are unchanged.
    for system in [
        serde_json::json!("You are terse."),
        serde_json::json!([{"type": "text", "text": "You are terse."}]),
    ] {
        let body = serde_json::to_vec(&serde_json::json!({
            "messages": [{"role": "user", "content": "hi"}],
            "system": system,
            "max_tokens": 5,
        }))
        .unwrap();
        let doc = scan_full(&body, Api::Messages).unwrap();
        let view = whole_view(&body);
        let mut a = xxhash_rust::xxh3::Xxh3::new();
        let mut b = xxhash_rust::xxh3::Xxh3::new();
        let s = doc.member(&view, "system").unwrap();
        super::feed_system(&mut a, s);
        b.update(b"system");
        b.update(&(s.bytes().len() as u64).to_le_bytes());
        b.update(s.bytes());
        assert_eq!(a.digest(), b.digest());
    }
}

#[test]
fn only_blocks_that_start_with_a_varying_prefix_are_left_out() {
    fn v(s: &str) -> crate::json::Value<'_> {
        crate::json::Value(s.as_bytes())
    }
    assert!(super::varies(v(
        r#"{"type":"text","text":"x-anthropic-billing-header: cch=1;"}"#
    )));
    assert!(!super::varies(v(
        r#"{"type":"text","text":"see x-anthropic-billing-header: in docs"}"#
    )));
    assert!(!super::varies(v(
        r#"{"type":"text","text":"You are Claude Code."}"#
    )));
    assert!(!super::varies(v(
        r#""x-anthropic-billing-header: as a bare string""#
    )));
}
