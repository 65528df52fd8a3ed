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

/// The upstream's answer carrying response id `id`: a response object (with
/// its `content-length`), or an SSE stream (split into small chunks, so the
/// id is cut across them) whose lifecycle events name it.
fn responses_answer(id: &str, stream: bool) -> tether_wasm_host::UpstreamResponse {
    let object = json!({"id": id, "object": "response", "created_at": 1764640000, "status": "completed", "model": "gpt-5-codex", "output": [{"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]});
    let (ctype, body) = if stream {
        let mut created = object.clone();
        created["status"] = json!("in_progress");
        created["output"] = json!([]);
        let sse = format!(
            "event: response.created\ndata: {}\n\nevent: response.in_progress\ndata: {}\n\nevent: response.output_text.delta\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
            json!({"type": "response.created", "sequence_number": 0, "response": created}),
            json!({"type": "response.in_progress", "sequence_number": 1, "response": created}),
            json!({"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_1", "delta": "done"}),
            json!({"type": "response.completed", "sequence_number": 3, "response": object}),
        );
        ("text/event-stream", sse.into_bytes())
    } else {
        ("application/json", object.to_string().into_bytes())
    };
    let mut headers =
        tether_wasm_host::HeaderMap::from_pairs([(":status", "200"), ("content-type", ctype)]);
    if !stream {
        headers.add(b"content-length", body.len().to_string().as_bytes());
    }
    tether_wasm_host::UpstreamResponse {
        headers,
        body_chunks: tether_wasm_host::Request::chunked(&body, 24),
        trailers: tether_wasm_host::HeaderMap::new(),
    }
}

/// One Responses turn as a client sees it.
#[derive(Debug)]
struct Turn {
    key: String,
    source: String,
    /// `previous_response_id` as the engine got it.
    upstream_previous: Option<String>,
    /// The response id the client got (what it sends next), checked to be
    /// the same in every event of a stream.
    client_id: String,
}

/// The answer's response ids as the client got them: the object's `id`, or
/// every SSE lifecycle event's `response.id`.
fn client_ids(body: &[u8], stream: bool) -> Vec<String> {
    if !stream {
        let v: Value = serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}"));
        return vec![v["id"].as_str().unwrap_or_default().to_owned()];
    }
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"));
            v["response"]["id"].as_str().map(str::to_owned)
        })
        .collect()
}

/// Sends one Responses turn answered with `answer_id`, with the tenant
/// headers `extra`.
fn chain_turn_as(
    vm: &mut tether_wasm_host::FilterVm,
    extra: &[(&str, &str)],
    body: &Value,
    answer_id: &str,
    stream: bool,
) -> Turn {
    let bytes = body.to_string().into_bytes();
    let length = bytes.len().to_string();
    let headers = [
        &[
            ("content-type", "application/json"),
            ("content-length", length.as_str()),
        ],
        extra,
    ]
    .concat();
    let req = tether_wasm_host::Request {
        body_chunks: tether_wasm_host::Request::chunked(&bytes, 4096),
        response: responses_answer(answer_id, stream),
        ..tether_wasm_host::Request::post(RESPONSES, &headers, &[])
    };
    let out = vm.run(&req).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.stalled, None, "{out:#?}");
    let down = out
        .downstream
        .as_ref()
        .expect("the answer reaches the client");
    let up = out
        .upstream
        .as_ref()
        .expect("the request reaches the engine");
    assert_eq!(
        up.headers.get(b"content-length").map(|v| v.to_vec()),
        Some(up.body.len().to_string().into_bytes()),
        "the engine's content-length stays true"
    );
    let sent: Value = serde_json::from_slice(&up.body).unwrap_or_else(|e| panic!("{e}"));
    let ids = client_ids(&down.body, stream);
    assert!(
        !ids.is_empty() && ids.iter().all(|i| i == &ids[0]),
        "one id in every event: {ids:?}"
    );
    if ids[0] != answer_id {
        assert_eq!(down.headers.get(b"content-length"), None, "the answer grew");
    }
    let (key, source) = key_of(&out);
    Turn {
        key,
        source,
        upstream_previous: sent["previous_response_id"].as_str().map(str::to_owned),
        client_id: ids[0].clone(),
    }
}

/// [`chain_turn_as`] without a tenant; returns (key, source).
fn chain_turn(
    vm: &mut tether_wasm_host::FilterVm,
    body: &Value,
    answer_id: &str,
    stream: bool,
) -> (String, String) {
    let t = chain_turn_as(vm, &[], body, answer_id, stream);
    (t.key, t.source)
}

/// Turn `turn` of the chain "fix it", continuing `previous`, answered with `answer`.
fn fix_it(
    vm: &mut tether_wasm_host::FilterVm,
    turn: usize,
    previous: Option<&str>,
    answer: &str,
    stream: bool,
) -> Turn {
    let body = responses_turn(turn, "fix it", previous, stream);
    chain_turn_as(vm, &[], &body, answer, stream)
}

fn vm_with(config: Value) -> tether_wasm_host::FilterVm {
    plugin()
        .start(options(&config.to_string()))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn responses_chains_keep_one_key_on_two_replicas_alternating_streamed_or_not() {
    // Two gateway replicas that share nothing (two VMs: two Envoys).
    let mut replicas = [
        vm_with(json!({"outputs": "all"})),
        vm_with(json!({"outputs": "all"})),
    ];
    for stream in [true, false] {
        // Two chains at once, same instructions and tools, interleaved turn by turn.
        let firsts = [
            "fix the failing parser test",
            "add a --json flag to the CLI",
        ];
        let mut turns: [Vec<Turn>; 2] = [Vec::new(), Vec::new()];
        for turn in 1..=4 {
            for (c, first) in firsts.iter().enumerate() {
                let prev = turns[c].last().map(|t| t.client_id.clone());
                let body = responses_turn(turn, first, prev.as_deref(), stream);
                let engine_id = format!("resp_{stream}_{c}_{turn}");
                // Each turn of a chain reaches the other replica.
                let vm = &mut replicas[(turn + c) % 2];
                let got = chain_turn_as(vm, &[], &body, &engine_id, stream);
                assert!(got.client_id.starts_with("resp_tt1"), "{got:?}");
                assert!(got.client_id.ends_with(&engine_id), "{got:?}");
                let engine_prev = (turn > 1).then(|| format!("resp_{stream}_{c}_{}", turn - 1));
                assert_eq!(
                    got.upstream_previous, engine_prev,
                    "the engine sees its own id"
                );
                turns[c].push(got);
            }
        }
        for chain in &turns {
            assert_eq!(chain[0].source, "head", "{chain:?}");
            assert!(
                chain[1..].iter().all(|t| t.source == "chain"),
                "stream={stream}: {chain:?}"
            );
            assert!(
                chain.iter().all(|t| t.key == chain[0].key),
                "stream={stream}: one key on both replicas: {chain:?}"
            );
        }
        assert_ne!(
            turns[0][0].key, turns[1][0].key,
            "stream={stream}: chains stay apart"
        );
    }
    let mut sum = |name: &str| -> u64 {
        replicas
            .iter_mut()
            .map(|vm| {
                vm.tick().unwrap_or_else(|e| panic!("{e}"));
                vm.state().metric(name).unwrap_or(0)
            })
            .sum()
    };
    assert_eq!(sum("tether_chain_wrapped"), 16);
    assert_eq!(sum("tether_chain_carried"), 12);
    assert_eq!(sum("tether_chain_unwrapped"), 12);
    assert_eq!(sum("tether_chain_learned"), 0, "no table needed");
    assert_eq!(sum("tether_chain_unseen"), 0);
    assert_eq!(sum("tether_chain_not_wrapped"), 0);
    assert!(replicas.iter().all(|vm| !vm.failed()));
}

#[test]
fn a_forged_or_malformed_chain_id_falls_back_and_is_forwarded_as_sent() {
    let config =
        json!({"outputs": "all", "tenant_header": "x-tenant", "chains": {"secret": "k3y"}});
    let mut vm = vm_with(config.clone());
    let acme = [("x-tenant", "acme")];
    let first = chain_turn_as(
        &mut vm,
        &acme,
        &responses_turn(1, "fix it", None, false),
        "resp_e1",
        false,
    );
    let good = first.client_id.clone();
    let tampered = good.replace("resp_e1", "resp_e9");
    for (tenant, id) in [
        (&acme, tampered.as_str()),
        (&[("x-tenant", "globex")], good.as_str()),
        (&acme, "resp_tt1zz-not-hex"),
        (&acme, "resp_tt1"),
    ] {
        for stream in [false, true] {
            let got = chain_turn_as(
                &mut vm,
                tenant,
                &responses_turn(2, "fix it", Some(id), stream),
                "resp_e2",
                stream,
            );
            assert_eq!(got.source, "chain:forged", "{id}");
            assert_ne!(got.key, first.key, "{id}");
            assert_eq!(got.upstream_previous.as_deref(), Some(id), "never opened");
        }
    }
    // A different secret on another replica cannot open it either.
    let mut other = vm_with(
        json!({"outputs": "all", "tenant_header": "x-tenant", "chains": {"secret": "other"}}),
    );
    let got = chain_turn_as(
        &mut other,
        &acme,
        &responses_turn(2, "fix it", Some(&good), false),
        "resp_e2",
        false,
    );
    assert_eq!(got.source, "chain:forged");
    // The same secret can.
    let mut same = vm_with(config);
    let got = chain_turn_as(
        &mut same,
        &acme,
        &responses_turn(2, "fix it", Some(&good), false),
        "resp_e2",
        false,
    );
    assert_eq!(
        (got.key.as_str(), got.source.as_str()),
        (first.key.as_str(), "chain")
    );
    assert_eq!(got.upstream_previous.as_deref(), Some("resp_e1"));
    vm.tick().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(vm.state().metric("tether_chain_forged"), Some(8));
    assert!(!vm.failed() && !other.failed() && !same.failed());
}

#[test]
fn a_chain_begun_before_the_upgrade_goes_on_and_then_needs_no_table() {
    // Before: chain ids off (the per-Envoy table alone), turns 1 and 2.
    let mut old = vm_with(json!({"outputs": "all", "chains": {"wrap": false}}));
    let t1 = fix_it(&mut old, 1, None, "resp_old1", true);
    let t2 = fix_it(&mut old, 2, Some(&t1.client_id), "resp_old2", true);
    assert_eq!(t1.client_id, "resp_old1", "plain engine ids");
    assert_eq!(
        (t2.key.as_str(), t2.source.as_str()),
        (t1.key.as_str(), "chain:table")
    );
    // The upgraded module in the same Envoy keeps the process's shared data.
    let mut new = vm_with(json!({"outputs": "all"}));
    new.state_mut().shared_data = old.state().shared_data.clone();
    let t3 = fix_it(&mut new, 3, Some(&t2.client_id), "resp_new3", true);
    assert_eq!(
        (t3.key.as_str(), t3.source.as_str()),
        (t1.key.as_str(), "chain:table")
    );
    assert_eq!(t3.upstream_previous.as_deref(), Some("resp_old2"));
    assert!(
        t3.client_id.starts_with("resp_tt1"),
        "from here on a chain id"
    );
    // Turn 4 on a replica that never saw the chain.
    let mut fresh = vm_with(json!({"outputs": "all"}));
    let t4 = fix_it(&mut fresh, 4, Some(&t3.client_id), "resp_new4", true);
    assert_eq!(
        (t4.key.as_str(), t4.source.as_str()),
        (t1.key.as_str(), "chain")
    );
    assert_eq!(t4.upstream_previous.as_deref(), Some("resp_new3"));
    // A plain id a replica never learned: keyed by that id, and carried on from there.
    let u = fix_it(&mut fresh, 3, Some("resp_old2"), "resp_u3", false);
    assert_eq!(u.source, "chain:unseen");
    let mut fresh2 = vm_with(json!({"outputs": "all"}));
    let u4 = fix_it(&mut fresh2, 4, Some(&u.client_id), "resp_u4", false);
    assert_eq!(
        (u4.key.as_str(), u4.source.as_str()),
        (u.key.as_str(), "chain")
    );
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
        assert_eq!(next, (first.0, "chain:table".to_owned()), "{enc}");
    }
}

/// An SSE answer of `deltas` text deltas, one event per chunk, as vLLM streams it.
fn streamed_answer(id: &str, deltas: usize) -> tether_wasm_host::UpstreamResponse {
    let object = |status: &str| json!({"id": id, "object": "response", "status": status, "model": "gpt-5-codex", "output": []});
    let event = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n").into_bytes();
    let mut chunks = vec![
        event(
            "response.created",
            json!({"type": "response.created", "response": object("in_progress")}),
        ),
        event(
            "response.in_progress",
            json!({"type": "response.in_progress", "response": object("in_progress")}),
        ),
    ];
    for i in 0..deltas {
        chunks.push(event(
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": format!(" word{i}"), "sequence_number": i + 2}),
        ));
    }
    chunks.push(event(
        "response.completed",
        json!({"type": "response.completed", "response": object("completed")}),
    ));
    tether_wasm_host::UpstreamResponse {
        headers: tether_wasm_host::HeaderMap::from_pairs([
            (":status", "200"),
            ("content-type", "text/event-stream"),
        ]),
        body_chunks: chunks,
        trailers: tether_wasm_host::HeaderMap::new(),
    }
}

/// What chain ids add to a streamed chained turn, in wasm operators (fuel):
/// the same turn-2 exchange with `chains.wrap` on and off, side by side.
#[test]
fn chain_ids_cost_on_the_response_path() {
    let path = tether_wasm_host::module_path("TETHER_FILTER_WASM", "tether_filter.wasm")
        .unwrap_or_else(|e| panic!("{e}"));
    let metered =
        tether_wasm_host::Plugin::new(&std::fs::read(path).unwrap_or_else(|e| panic!("{e}")), true)
            .unwrap_or_else(|e| panic!("{e}"));
    let deltas = 200;
    let mut per_mode = Vec::new();
    for wrap in [false, true] {
        let mut vm = metered
            .start(options(
                &json!({"outputs": ["hash", "key_source"], "chains": {"wrap": wrap}}).to_string(),
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        let run = |vm: &mut tether_wasm_host::FilterVm, previous: Option<&str>, answer: &str| {
            let body = responses_turn(
                if previous.is_some() { 2 } else { 1 },
                "fix it",
                previous,
                true,
            )
            .to_string()
            .into_bytes();
            let req = tether_wasm_host::Request {
                body_chunks: vec![body],
                response: streamed_answer(answer, deltas),
                ..tether_wasm_host::Request::post(
                    RESPONSES,
                    &[("content-type", "application/json")],
                    &[],
                )
            };
            vm.run(&req).unwrap_or_else(|e| panic!("{e}"))
        };
        let first = run(&mut vm, None, "resp_0123456789abcdef");
        let id = client_ids(
            &first
                .downstream
                .as_ref()
                .map(|d| d.body.clone())
                .unwrap_or_default(),
            true,
        )
        .first()
        .cloned()
        .unwrap_or_default();
        assert_eq!(id.starts_with("resp_tt1"), wrap, "{id}");
        let second = run(&mut vm, Some(&id), "resp_fedcba9876543210");
        let (_, source) = key_of(&second);
        assert_eq!(source, if wrap { "chain" } else { "chain:table" });
        let total: u64 = second.fuel.values().sum();
        println!(
            "wrap={wrap}: turn 2, {deltas} deltas in {} chunks: wasm operators by callback {:?}, total {total}",
            deltas + 3,
            second.fuel
        );
        per_mode.push((total, second.fuel.clone()));
    }
    let body_fuel = |i: usize| {
        per_mode[i]
            .1
            .get("proxy_on_response_body")
            .copied()
            .unwrap_or(0)
    };
    println!(
        "response body callbacks: {} operators without chain ids, {} with ({:.0} per chunk more)",
        body_fuel(0),
        body_fuel(1),
        (body_fuel(1) as f64 - body_fuel(0) as f64) / (deltas + 3) as f64
    );
    assert!(body_fuel(1) > body_fuel(0), "the rewrite reads every chunk");
}
