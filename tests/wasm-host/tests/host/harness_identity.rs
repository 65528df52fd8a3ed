//! Held-out harness identities, turn after turn, through the wasmtime host
//! with every output on: Claude Code's per-request billing-header block in
//! `system` (its `cch` changes on every request) leaves the key alone, with
//! and without `metadata.user_id`; OpenAI Responses chains
//! (`previous_response_id`, streamed and not) keep one key each and stay
//! apart; gzip and zstd bodies are read like plain ones, and bombs, cut
//! streams and bad magic fall back without a VM failure.

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
    key_of(&send(vm, "/v1/messages", &[], body))
}

/// The (key, key source) the filter handed to Envoy as filter state.
fn key_of(out: &tether_wasm_host::Outcome) -> (String, String) {
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

const RESPONSES: &str = "/v1/responses";

/// Turn `turn` of a Codex-shaped Responses chain: turn 1 holds the first
/// user message, later turns only the new tool output and `previous_response_id`.
fn responses_turn(turn: usize, first: &str, previous: Option<&str>, stream: bool) -> Value {
    let input = if turn == 1 {
        json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": first}]}])
    } else {
        json!([{"type": "function_call_output", "call_id": format!("call_{turn}"), "output": "exit status 0"}])
    };
    let mut body = json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI.",
        "input": input,
        "tools": [{"type": "function", "name": "shell", "description": "Runs a shell command", "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}],
        "tool_choice": "auto",
        "store": true,
        "stream": stream,
    });
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    body
}

/// The upstream's answer carrying response id `id`: a response object, or
/// an SSE stream (split into small chunks) whose first event names it.
fn responses_answer(id: &str, stream: bool) -> tether_wasm_host::UpstreamResponse {
    let object = json!({"id": id, "object": "response", "created_at": 1764640000, "status": "completed", "model": "gpt-5-codex", "output": [{"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]});
    let (ctype, body) = if stream {
        let mut created = object.clone();
        created["status"] = json!("in_progress");
        let sse = format!(
            "event: response.created\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
            json!({"type": "response.created", "sequence_number": 0, "response": created}),
            json!({"type": "response.completed", "sequence_number": 1, "response": object}),
        );
        ("text/event-stream", sse.into_bytes())
    } else {
        ("application/json", object.to_string().into_bytes())
    };
    tether_wasm_host::UpstreamResponse {
        headers: tether_wasm_host::HeaderMap::from_pairs([
            (":status", "200"),
            ("content-type", ctype),
        ]),
        body_chunks: tether_wasm_host::Request::chunked(&body, 24),
        trailers: tether_wasm_host::HeaderMap::new(),
    }
}

/// Sends one Responses turn answered with `answer_id`; returns (key, source).
fn chain_turn(
    vm: &mut tether_wasm_host::FilterVm,
    body: &Value,
    answer_id: &str,
    stream: bool,
) -> (String, String) {
    let bytes = body.to_string().into_bytes();
    let req = tether_wasm_host::Request {
        body_chunks: tether_wasm_host::Request::chunked(&bytes, 4096),
        response: responses_answer(answer_id, stream),
        ..tether_wasm_host::Request::post(RESPONSES, &[("content-type", "application/json")], &[])
    };
    let out = vm.run(&req).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.stalled, None, "{out:#?}");
    assert!(out.downstream.is_some(), "the answer reaches the client");
    key_of(&out)
}

#[test]
fn responses_chains_keep_one_key_each_streamed_or_not() {
    let mut vm = plugin()
        .start(options(&json!({"outputs": "all"}).to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    for stream in [true, false] {
        // Two chains at once, same instructions and tools, interleaved turn by turn.
        let firsts = [
            "fix the failing parser test",
            "add a --json flag to the CLI",
        ];
        let mut keys: [Vec<(String, String)>; 2] = [Vec::new(), Vec::new()];
        for turn in 1..=4 {
            for (c, first) in firsts.iter().enumerate() {
                let prev = (turn > 1).then(|| format!("resp_{stream}_{c}_{}", turn - 1));
                let body = responses_turn(turn, first, prev.as_deref(), stream);
                let got = chain_turn(&mut vm, &body, &format!("resp_{stream}_{c}_{turn}"), stream);
                keys[c].push(got);
            }
        }
        for chain in &keys {
            assert_eq!(chain[0].1, "head", "{chain:?}");
            assert!(
                chain[1..].iter().all(|k| k.1 == "chain"),
                "stream={stream}: {chain:?}"
            );
            assert!(
                chain.iter().all(|k| k.0 == chain[0].0),
                "stream={stream}: one key: {chain:?}"
            );
        }
        assert_ne!(
            keys[0][0].0, keys[1][0].0,
            "stream={stream}: chains stay apart"
        );
    }
    vm.tick().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(vm.state().metric("tether_chain_learned"), Some(16));
    assert_eq!(vm.state().metric("tether_chain_hit"), Some(12));
    assert_eq!(vm.state().metric("tether_chain_unseen"), Some(0));
    // A gateway that saw none of it (a fresh VM: another replica): each
    // continuation is keyed by the response it continues — stable, and apart.
    let mut other = plugin()
        .start(options(&json!({"outputs": "all"}).to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    let a3 = chain_turn(
        &mut other,
        &responses_turn(3, "x", Some("resp_true_0_2"), true),
        "resp_o_a3",
        true,
    );
    let b3 = chain_turn(
        &mut other,
        &responses_turn(3, "x", Some("resp_true_1_2"), true),
        "resp_o_b3",
        true,
    );
    assert_eq!(a3.1, "chain:unseen");
    assert_ne!(a3.0, b3.0);
    // From there on this replica carries the chain along.
    let a4 = chain_turn(
        &mut other,
        &responses_turn(4, "x", Some("resp_o_a3"), true),
        "resp_o_a4",
        true,
    );
    assert_eq!(a4, (a3.0.clone(), "chain".to_owned()));
    assert!(!other.failed());
}

#[test]
fn an_error_answer_teaches_nothing() {
    let mut vm = plugin()
        .start(options(&json!({"outputs": "all"}).to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    let bytes = responses_turn(1, "hi", None, false)
        .to_string()
        .into_bytes();
    let mut answer = responses_answer("resp_err", false);
    answer.headers = tether_wasm_host::HeaderMap::from_pairs([
        (":status", "500"),
        ("content-type", "application/json"),
    ]);
    let req = tether_wasm_host::Request {
        body_chunks: vec![bytes],
        response: answer,
        ..tether_wasm_host::Request::post(RESPONSES, &[("content-type", "application/json")], &[])
    };
    vm.run(&req).unwrap_or_else(|e| panic!("{e}"));
    let next = chain_turn(
        &mut vm,
        &responses_turn(2, "hi", Some("resp_err"), false),
        "resp_2",
        false,
    );
    assert_eq!(next.1, "chain:unseen");
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(body).unwrap_or_else(|e| panic!("{e}"));
    e.finish().unwrap_or_else(|e| panic!("{e}"))
}

fn zstd(body: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(body, ruzstd::encoding::CompressionLevel::Fastest)
}

#[test]
fn compressed_bodies_keep_their_key_turn_after_turn() {
    let mut vm = plugin()
        .start(options(
            &json!({"outputs": "all", "max_decompressed_bytes": 1_048_576}).to_string(),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    let send_packed = |vm: &mut tether_wasm_host::FilterVm, enc: &str, packed: Vec<u8>| {
        let req = tether_wasm_host::Request {
            body_chunks: tether_wasm_host::Request::chunked(&packed, 4096),
            ..tether_wasm_host::Request::post(
                "/v1/messages",
                &[
                    ("content-type", "application/json"),
                    ("content-encoding", enc),
                ],
                &[],
            )
        };
        let out = vm.run(&req).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.stalled, None);
        let up = out
            .upstream
            .as_ref()
            .map(|u| u.body.clone())
            .unwrap_or_default();
        assert_eq!(up, packed, "forwarded as sent");
        key_of(&out)
    };
    let main = "You are Claude Code, Anthropic's official CLI for Claude.";
    let plain = key_and_source(&mut vm, &claude_code(1, "00000", main, None));
    for (enc, pack) in [("gzip", gzip as fn(&[u8]) -> Vec<u8>), ("zstd", zstd)] {
        let keys: Vec<_> = ["8f1a2", "03bc9", "e77d0", "1a2b3"]
            .iter()
            .enumerate()
            .map(|(i, cch)| {
                send_packed(
                    &mut vm,
                    enc,
                    pack(claude_code(i + 1, cch, main, None).to_string().as_bytes()),
                )
            })
            .collect();
        assert!(
            keys.iter().all(|k| k == &plain),
            "{enc}: {keys:?} vs {plain:?}"
        );
        // A bomb (4 MiB of spaces behind the JSON) and a cut stream: fallbacks, counted, no VM failure.
        let mut big = claude_code(1, "x", main, None).to_string().into_bytes();
        big.extend(std::iter::repeat_n(b' ', 4 << 20));
        let bomb = send_packed(&mut vm, enc, pack(&big));
        assert_eq!(bomb.1, "fallback:decompressed_too_large");
        let packed = pack(claude_code(2, "y", main, None).to_string().as_bytes());
        let cut = send_packed(&mut vm, enc, packed[..packed.len() / 2].to_vec());
        assert_eq!(cut.1, "fallback:compressed_corrupt");
        let magic = send_packed(&mut vm, enc, b"\x1f\x8c not really".to_vec());
        assert_eq!(magic.1, "fallback:compressed_corrupt");
    }
    assert!(!vm.failed());
    vm.tick().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(vm.state().metric("tether_body_decompressed"), Some(8));
    assert_eq!(
        vm.state().metric("tether_fallback_decompressed_too_large"),
        Some(2)
    );
    assert_eq!(
        vm.state().metric("tether_fallback_compressed_corrupt"),
        Some(4)
    );
}

#[test]
fn a_compressed_answer_is_learned_too() {
    let mut vm = plugin()
        .start(options(&json!({"outputs": "all"}).to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    for (enc, pack) in [("gzip", gzip as fn(&[u8]) -> Vec<u8>), ("zstd", zstd)] {
        let first_id = format!("resp_{enc}_1");
        let mut answer = responses_answer(&first_id, false);
        let body = pack(&answer.body_chunks.concat());
        answer.body_chunks = tether_wasm_host::Request::chunked(&body, 32);
        answer.headers.add(b"content-encoding", enc.as_bytes());
        let bytes = responses_turn(1, enc, None, false).to_string().into_bytes();
        let req = tether_wasm_host::Request {
            body_chunks: vec![bytes],
            response: answer,
            ..tether_wasm_host::Request::post(
                RESPONSES,
                &[("content-type", "application/json")],
                &[],
            )
        };
        let first = key_of(&vm.run(&req).unwrap_or_else(|e| panic!("{e}")));
        let next = chain_turn(
            &mut vm,
            &responses_turn(2, enc, Some(&first_id), false),
            "resp_n",
            false,
        );
        assert_eq!(next, (first.0, "chain".to_owned()), "{enc}");
    }
}
