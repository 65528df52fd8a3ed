//! Held-out harness identities, turn after turn, through the wasmtime host
//! with every output on: Claude Code's per-request billing-header block in
//! `system` (its `cch` changes on every request) leaves the key alone, with
//! and without `metadata.user_id`.

use crate::common::options;
use crate::tether::{plugin, send};
use serde_json::{Value, json};

/// Turn `turn` (1-based) of a Claude Code-shaped Messages request.
fn claude_code(turn: usize, cch: &str, agent_prompt: &str, user_id: Option<&str>) -> Value {
    let mut messages = vec![
        json!({"role": "user", "content": [{"type": "text", "text": "Fix the failing test in parser.rs"}]}),
    ];
    for i in 1..turn {
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"command": "cargo test"}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": "ok"}]}));
    }
    let mut body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "messages": messages,
        "system": [
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.37.e4f; cc_entrypoint=cli; cch={cch};")},
            {"type": "text", "text": agent_prompt, "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}],
        "stream": true,
    });
    if let Some(u) = user_id {
        body["metadata"] = json!({"user_id": u});
    }
    body
}

fn key_and_source(vm: &mut tether_wasm_host::FilterVm, body: &Value) -> (String, String) {
    let out = send(vm, "/v1/messages", &[], body);
    let get = |n: &str| {
        out.filter_state_value(&format!("wasm.tether.{n}"))
            .unwrap_or_default()
            .to_owned()
    };
    (get("x-tether-key"), get("x-tether-key-source"))
}

#[test]
fn claude_code_keeps_one_key_over_four_turns_despite_the_billing_header() {
    let mut vm = plugin()
        .start(options(&json!({"outputs": "all"}).to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    for user_id in [None, Some("user_1f2e_account_9a8b_session_77c1")] {
        let main = "You are Claude Code, Anthropic's official CLI for Claude.";
        let keys: Vec<(String, String)> = ["8f1a2", "03bc9", "e77d0", "1a2b3"]
            .iter()
            .enumerate()
            .map(|(i, cch)| key_and_source(&mut vm, &claude_code(i + 1, cch, main, user_id)))
            .collect();
        assert!(!keys[0].0.is_empty(), "{keys:?}");
        assert!(
            keys.iter().all(|k| k == &keys[0]),
            "{user_id:?}: 4 turns, 4 cch values, one key: {keys:?}"
        );
        // A subagent (its own prompt) of the same session still gets its own key.
        let sub = key_and_source(
            &mut vm,
            &claude_code(1, "5d5d5", "You are a code reviewer subagent.", user_id),
        );
        assert_ne!(sub.0, keys[0].0, "{user_id:?}");
    }
}
