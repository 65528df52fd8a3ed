//! The tether filter (`filter/`, contract in docs/gateway.md) in the harness:
//! multi-turn agent conversations with subagents, the body path, pick mode,
//! bad inputs and configuration errors — fast and in-process.

use crate::common::options;
use serde_json::{Value, json};
use std::sync::OnceLock;
use tether_wasm_host::{Action, FilterVm, HostError, Outcome, Plugin, Request};

pub(crate) fn plugin() -> &'static Plugin {
    static P: OnceLock<Plugin> = OnceLock::new();
    P.get_or_init(|| {
        let path = tether_wasm_host::module_path("TETHER_FILTER_WASM", "tether_filter.wasm")
            .unwrap_or_else(|e| panic!("{e}"));
        Plugin::from_file(path).expect("tether filter compiles")
    })
}

/// A VM with every header output on (`"outputs": "all"`) unless the
/// configuration names its own: these tests look at every marker.
fn vm(mut config: Value) -> FilterVm {
    if let Some(o) = config.as_object_mut() {
        o.entry("outputs").or_insert(json!("all"));
    }
    plugin()
        .start(options(&config.to_string()))
        .unwrap_or_else(|e| panic!("{config}: {e}"))
}

const CHAT: &str = "/v1/chat/completions";

pub(crate) fn send(
    vm: &mut FilterVm,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Outcome {
    let bytes = body.to_string().into_bytes();
    let req = Request {
        body_chunks: Request::chunked(&bytes, 4096),
        ..Request::post(
            path,
            &[&[("content-type", "application/json")], headers].concat(),
            &[],
        )
    };
    let out = vm.run(&req).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.stalled, None, "{out:#?}");
    out
}

fn is_hex16(v: Option<&str>) -> bool {
    v.is_some_and(|v| {
        v.len() == 16
            && v.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

/// A chat conversation: system, first user turn, then alternating
/// assistant-with-tool-call / tool-result turns, `turns` of them.
fn chat(system: &str, first: &str, tool_turns: usize) -> Value {
    let mut messages = vec![
        json!({"role":"system","content":system}),
        json!({"role":"user","content":first}),
    ];
    for i in 0..tool_turns {
        messages.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":format!("c{i}"),"type":"function","function":{"name":"read_file","arguments":"{}"}}]}));
        messages.push(json!({"role":"tool","tool_call_id":format!("c{i}"),"content":format!("file contents {i}")}));
    }
    json!({"model":"m","messages":messages})
}

fn body_callbacks(out: &Outcome) -> Vec<(bool, Action)> {
    out.callbacks
        .iter()
        .filter(|c| c.callback == "proxy_on_request_body")
        .map(|c| (c.end_of_stream, c.action))
        .collect()
}

mod header_path {
    use super::*;

    #[test]
    fn session_header_decides_without_buffering_and_keys_are_stable() {
        let mut vm = vm(json!({}));
        let mut keys = Vec::new();
        for turns in 0..4 {
            let out = send(
                &mut vm,
                CHAT,
                &[("x-session-id", "run-1")],
                &chat("sys", "fix the bug", turns),
            );
            assert!(is_hex16(out.upstream_header("x-tether-key")), "{out:#?}");
            assert_eq!(
                out.upstream_header("x-tether-key-source"),
                Some("header:x-session-id")
            );
            assert!(
                body_callbacks(&out)
                    .iter()
                    .all(|(_, a)| *a == Action::Continue),
                "header path never pauses the body"
            );
            assert!(out.filter_state.is_empty() && out.properties_set.is_empty());
            keys.push(out.upstream_header("x-tether-key").unwrap().to_owned());
        }
        assert!(
            keys.windows(2).all(|w| w[0] == w[1]),
            "every turn of a run keeps its key: {keys:?}"
        );
        let other = send(
            &mut vm,
            CHAT,
            &[("x-session-id", "run-2")],
            &chat("sys", "fix the bug", 0),
        );
        assert_ne!(
            other.upstream_header("x-tether-key"),
            Some(keys[0].as_str())
        );
        // Counts reach the host on the root context's tick.
        vm.tick().unwrap();
        assert_eq!(vm.state().metric("tether_requests_header_path"), Some(5));
    }

    #[test]
    fn subagents_of_one_run_get_their_own_keys() {
        let mut vm = vm(json!({}));
        let session = ("x-claude-code-session-id", "cc-run");
        let main = send(&mut vm, CHAT, &[session], &chat("main", "plan", 1));
        let a = send(
            &mut vm,
            CHAT,
            &[
                session,
                ("x-claude-code-agent-id", "planner"),
                ("x-claude-code-parent-agent-id", "main"),
            ],
            &chat("planner", "plan it", 0),
        );
        let b = send(
            &mut vm,
            CHAT,
            &[
                session,
                ("x-claude-code-agent-id", "verifier"),
                ("x-claude-code-parent-agent-id", "main"),
            ],
            &chat("verifier", "check it", 0),
        );
        let a2 = send(
            &mut vm,
            CHAT,
            &[
                session,
                ("x-claude-code-agent-id", "planner"),
                ("x-claude-code-parent-agent-id", "main"),
            ],
            &chat("planner", "plan it", 1),
        );
        let key = |o: &Outcome| o.upstream_header("x-tether-key").map(str::to_owned);
        assert_eq!(
            main.upstream_header("x-tether-subagent"),
            Some("0000000000000000")
        );
        for sub in [&a, &b] {
            assert_eq!(
                sub.upstream_header("x-tether-session"),
                main.upstream_header("x-tether-session"),
                "same run"
            );
            assert_ne!(key(sub), key(&main), "a subagent is not the main agent");
            assert!(is_hex16(sub.upstream_header("x-tether-parent")));
        }
        assert_ne!(key(&a), key(&b), "two subagents, two keys");
        assert_eq!(key(&a), key(&a2), "a subagent keeps its key across turns");
    }

    #[test]
    fn tenant_is_part_of_the_key() {
        let mut vm = vm(json!({"tenant_header": "x-auth-tenant"}));
        let a = send(
            &mut vm,
            CHAT,
            &[("x-session-id", "s"), ("x-auth-tenant", "acme")],
            &chat("s", "u", 0),
        );
        let b = send(
            &mut vm,
            CHAT,
            &[("x-session-id", "s"), ("x-auth-tenant", "globex")],
            &chat("s", "u", 0),
        );
        assert_ne!(
            a.upstream_header("x-tether-key"),
            b.upstream_header("x-tether-key")
        );
        assert_ne!(
            a.upstream_header("x-tether-tenant"),
            b.upstream_header("x-tether-tenant")
        );
    }
}

mod body_path {
    use super::*;

    /// Turn markers need the conversation, so they exist on the body path
    /// only (the header path never reads the body).
    #[test]
    fn turn_markers_follow_the_conversation() {
        let mut vm = vm(json!({}));
        let mut turn = |body: Value| {
            let mut body = body;
            body["session_id"] = json!("turns");
            let out = send(&mut vm, CHAT, &[], &body);
            let get = |h: &str| {
                out.filter_state_value(&format!("wasm.tether.{h}"))
                    .map(str::to_owned)
            };
            (
                get("x-tether-turn-kind"),
                get("x-tether-turn"),
                get("x-tether-retention-ms"),
                get("x-tether-prompt-end"),
            )
        };
        let (kind, first_turn, retention, end) = turn(chat("sys", "go", 0));
        assert_eq!(
            (kind.as_deref(), retention.as_deref(), end.as_deref()),
            (Some("first"), Some("300000"), Some("1"))
        );
        let (kind, tool_turn, retention, _) = turn(chat("sys", "go", 2));
        assert_eq!(
            (kind.as_deref(), retention.as_deref()),
            (Some("tool"), Some("120000"))
        );
        let n = |t: Option<String>| t.and_then(|t| t.parse::<u32>().ok()).unwrap_or(0);
        assert!(
            n(tool_turn.clone()) > n(first_turn.clone()),
            "turn counter grows: {first_turn:?} → {tool_turn:?}"
        );
        let mut user = chat("sys", "go", 1);
        user["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role":"assistant","content":"done"}));
        user["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role":"user","content":"thanks, now the tests"}));
        let (kind, _, retention, _) = turn(user);
        assert_eq!(
            (kind.as_deref(), retention.as_deref()),
            (Some("user"), Some("300000"))
        );
    }

    #[test]
    fn subagent_first_turn_is_a_handoff_and_keeps_its_key() {
        let mut vm = vm(json!({}));
        let agent = |agent: &str, turns: usize| {
            let mut body = chat(&format!("You are {agent}."), "work", turns);
            body["vllm_xargs"] = json!({"agentic_context": {"session_id": "run-9", "agent_id": agent, "parent_id": "main"}});
            body
        };
        let key = |o: &Outcome| {
            o.filter_state_value("wasm.tether.x-tether-key")
                .map(str::to_owned)
        };
        let first = send(&mut vm, CHAT, &[], &agent("planner", 0));
        assert_eq!(
            first.filter_state_value("wasm.tether.x-tether-turn-kind"),
            Some("handoff"),
            "{first:#?}"
        );
        assert!(is_hex16(
            first.filter_state_value("wasm.tether.x-tether-parent")
        ));
        let later = send(&mut vm, CHAT, &[], &agent("planner", 2));
        assert_eq!(key(&later), key(&first));
        let other = send(&mut vm, CHAT, &[], &agent("verifier", 0));
        assert_ne!(key(&other), key(&first));
        assert_eq!(
            other.filter_state_value("wasm.tether.x-tether-session"),
            first.filter_state_value("wasm.tether.x-tether-session")
        );
    }

    #[test]
    fn body_field_decides_through_filter_state_after_buffering() {
        let mut vm = vm(json!({"outputs": ["all", "hashable_string"]}));
        let mut body = chat("sys", "hello", 3);
        body["session_id"] = json!("run-7");
        let bytes = body.to_string().into_bytes();
        let req = Request {
            body_chunks: Request::chunked(&bytes, 100),
            ..Request::post(CHAT, &[], &[])
        };
        let out = vm.run(&req).unwrap();
        let calls = body_callbacks(&out);
        assert!(calls.len() > 1, "the body arrived in several chunks");
        assert!(
            calls[..calls.len() - 1]
                .iter()
                .all(|(eos, a)| !eos && *a == Action::Pause),
            "{calls:?}"
        );
        assert_eq!(calls.last(), Some(&(true, Action::Continue)));
        let key = out
            .filter_state_value("wasm.tether.x-tether-key")
            .map(str::to_owned);
        assert!(is_hex16(key.as_deref()), "{out:#?}");
        assert_eq!(
            out.filter_state_value("envoy.hashable_string"),
            key.as_deref(),
            "hash mode hands the key to hash_policy"
        );
        assert_eq!(
            out.filter_state_value("wasm.tether.x-tether-key-source"),
            Some("body:session_id")
        );
        assert_eq!(
            out.upstream_header("x-tether-key"),
            None,
            "headers had already left"
        );
        // The same session named by a header is the same session (the key
        // differs: without a subagent id, a body field gets the head mixed in
        // as the subagent, since every subagent of a run may share it).
        let by_header = send(
            &mut vm,
            CHAT,
            &[("x-session-id", "run-7")],
            &chat("sys", "hello", 3),
        );
        assert_eq!(
            by_header.upstream_header("x-tether-session"),
            out.filter_state_value("wasm.tether.x-tether-session")
        );
        // Counts reach the host on the root context's tick.
        vm.tick().unwrap();
        assert_eq!(vm.state().metric("tether_requests_body_path"), Some(1));
    }

    #[test]
    fn chunking_does_not_change_the_decision() {
        let mut body = chat("sys", "hello", 5);
        body["metadata"] = json!({"session_id": "chunky"});
        let bytes = body.to_string().into_bytes();
        let mut keys = Vec::new();
        for size in [1usize << 20, 4096, 97, 1] {
            let mut vm = vm(json!({}));
            let req = Request {
                body_chunks: Request::chunked(&bytes, size),
                ..Request::post(CHAT, &[], &[])
            };
            let out = vm.run(&req).unwrap();
            keys.push(
                out.filter_state_value("wasm.tether.x-tether-key")
                    .map(str::to_owned),
            );
        }
        assert!(
            keys[0].is_some() && keys.iter().all(|k| *k == keys[0]),
            "{keys:?}"
        );
    }

    #[test]
    fn subagents_sharing_prompt_cache_key_are_told_apart_by_their_head() {
        let mut vm = vm(json!({}));
        let mut planner = chat("You are the planner.", "plan the refactor", 0);
        let mut verifier = chat("You are the verifier.", "verify the refactor", 0);
        planner["prompt_cache_key"] = json!("shared-run");
        verifier["prompt_cache_key"] = json!("shared-run");
        let p = send(&mut vm, CHAT, &[], &planner);
        let v = send(&mut vm, CHAT, &[], &verifier);
        let key = |o: &Outcome| {
            o.filter_state_value("wasm.tether.x-tether-key")
                .map(str::to_owned)
        };
        assert!(key(&p).is_some());
        assert_ne!(key(&p), key(&v));
        // The planner's next turn keeps the planner's key.
        let mut planner2 = chat("You are the planner.", "plan the refactor", 2);
        planner2["prompt_cache_key"] = json!("shared-run");
        assert_eq!(key(&send(&mut vm, CHAT, &[], &planner2)), key(&p));
    }

    #[test]
    fn anthropic_messages_with_system_after_messages() {
        let mut vm = vm(json!({}));
        let body = json!({"max_tokens":100,"messages":[{"role":"user","content":"hi"}],"model":"claude","metadata":{"user_id":"u-1"},"system":"be brief"});
        let out = send(&mut vm, "/v1/messages", &[], &body);
        assert!(
            is_hex16(out.filter_state_value("wasm.tether.x-tether-key")),
            "{out:#?}"
        );
        let source = out
            .filter_state_value("wasm.tether.x-tether-key-source")
            .unwrap_or_default();
        assert!(source.starts_with("body:metadata.user_id"), "{source}");
    }

    #[test]
    fn conversation_head_is_the_fallback_identity() {
        let mut vm = vm(json!({}));
        let a = send(&mut vm, CHAT, &[], &chat("sys A", "task A", 0));
        let a2 = send(&mut vm, CHAT, &[], &chat("sys A", "task A", 3));
        let b = send(&mut vm, CHAT, &[], &chat("sys B", "task B", 0));
        let key = |o: &Outcome| {
            o.filter_state_value("wasm.tether.x-tether-key")
                .map(str::to_owned)
        };
        assert_eq!(
            a.filter_state_value("wasm.tether.x-tether-key-source"),
            Some("head")
        );
        assert_eq!(key(&a), key(&a2), "same head, same conversation");
        assert_ne!(key(&a), key(&b));
    }
}

mod pick_mode {
    use super::*;

    fn config() -> Value {
        json!({"mode":"pick","endpoints":[
            {"address":"10.0.0.1:8000","dp_size":4},
            {"address":"10.0.0.2:8000","dp_size":4},
            {"address":"10.0.0.3:8000","dp_size":4}]})
    }

    #[test]
    fn header_path_names_endpoint_fallbacks_and_rank() {
        let mut vm = vm(config());
        let out = send(&mut vm, CHAT, &[("x-session-id", "p1")], &chat("s", "u", 0));
        let dest = out
            .upstream_header("x-gateway-destination-endpoint")
            .expect("destination header");
        let list: Vec<&str> = dest.split(',').collect();
        assert_eq!(list.len(), 3, "primary + 2 fallbacks: {dest}");
        assert!(list.iter().all(|e| e.starts_with("10.0.0.")));
        assert_eq!(
            list.iter().collect::<std::collections::HashSet<_>>().len(),
            3,
            "distinct"
        );
        let rank: u32 = out
            .upstream_header("x-data-parallel-rank")
            .unwrap()
            .parse()
            .unwrap();
        assert!(rank < 4);
        let again = send(&mut vm, CHAT, &[("x-session-id", "p1")], &chat("s", "u", 2));
        assert_eq!(
            again.upstream_header("x-gateway-destination-endpoint"),
            Some(dest)
        );
    }

    #[test]
    fn body_path_sets_original_dst_to_the_primary() {
        let mut cfg = config();
        cfg["outputs"] = json!(["all", "original_dst"]);
        let mut vm = vm(cfg);
        let mut body = chat("s", "u", 1);
        body["user"] = json!("someone");
        body["session_id"] = json!("p2");
        let out = send(&mut vm, CHAT, &[], &body);
        let dst = out
            .filter_state_value("envoy.network.transport_socket.original_dst_address")
            .expect("original dst");
        let dest = out
            .filter_state_value("wasm.tether.x-gateway-destination-endpoint")
            .expect("destination state");
        assert_eq!(dest.split(',').next(), Some(dst));
    }

    #[test]
    fn sessions_spread_over_endpoints() {
        let mut vm = vm(config());
        let mut seen = std::collections::HashSet::new();
        for i in 0..40 {
            let out = send(
                &mut vm,
                CHAT,
                &[("x-session-id", &format!("spread-{i}"))],
                &chat("s", "u", 0),
            );
            seen.insert(
                out.upstream_header("x-gateway-destination-endpoint")
                    .unwrap()
                    .split(',')
                    .next()
                    .unwrap()
                    .to_owned(),
            );
        }
        assert_eq!(seen.len(), 3, "40 sessions reach every endpoint: {seen:?}");
    }
}

mod bad_input {
    use super::*;

    /// Request headers, body, and the key source the filter must report.
    type BadCase = (
        &'static [(&'static str, &'static str)],
        &'static [u8],
        &'static str,
    );

    fn raw(vm: &mut FilterVm, headers: &[(&str, &str)], body: &[u8]) -> Outcome {
        let out = vm
            .run(&Request {
                body_chunks: Request::chunked(body, 1000),
                ..Request::post(CHAT, headers, &[])
            })
            .unwrap_or_else(|e| panic!("the filter must not fail on client input: {e}"));
        assert!(out.stalled.is_none() && out.upstream.is_some(), "{out:#?}");
        out
    }

    fn source(out: &Outcome) -> String {
        out.upstream_header("x-tether-key-source")
            .or(out.filter_state_value("wasm.tether.x-tether-key-source"))
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn broken_bodies_fall_back_with_a_reason() {
        let mut vm = vm(json!({}));
        let cases: [BadCase; 5] = [
            (
                &[("content-type", "text/plain")],
                b"this is not json",
                "fallback:not_json",
            ),
            (&[], b"this is not json", "fallback:malformed_json"),
            (
                &[("content-encoding", "gzip")],
                b"\x1f\x8b\x08\x00\x00\x00",
                "fallback:compressed_corrupt",
            ),
            (
                &[],
                br#"{"model":"m","messages":[{"role":"user","content":"unterminated"#,
                "fallback:truncated",
            ),
            (
                &[],
                br#"{"model":"m","messages":[}]]"#,
                "fallback:malformed_json",
            ),
        ];
        for (headers, body, want) in cases {
            let out = raw(&mut vm, headers, body);
            assert_eq!(source(&out), want, "{}", String::from_utf8_lossy(body));
            assert_eq!(
                out.upstream.unwrap().body,
                body,
                "the body passes unchanged"
            );
        }
        // Each request counted once, under its own reason.
        for (reason, n) in [
            ("not_json", 1),
            ("malformed_json", 2),
            ("compressed_corrupt", 1),
            ("truncated", 1),
        ] {
            let name = format!("tether_fallback_{reason}");
            // Counts reach the host on the root context's tick.
            vm.tick().unwrap();
            assert_eq!(vm.state().metric(&name), Some(n), "{name}");
        }
    }

    #[test]
    fn empty_and_oversized_bodies() {
        let mut vm = vm(json!({"max_body_bytes": 10000}));
        let out = raw(&mut vm, &[], b"");
        assert_eq!(source(&out), "fallback:no_body");
        let mut big = chat("s", "u", 0);
        big["padding"] = json!("x".repeat(50_000));
        big["session_id"] = json!("late");
        let out = raw(&mut vm, &[], big.to_string().as_bytes());
        assert_eq!(source(&out), "fallback:too_large");
    }

    #[test]
    fn unknown_paths_pass_through_untouched() {
        let mut vm = vm(json!({}));
        let out = vm
            .run(&Request::post(
                "/healthz",
                &[("x-session-id", "s")],
                &[b"{}"],
            ))
            .unwrap();
        assert_eq!(out.upstream_header("x-tether-key"), None);
        assert!(out.properties_set.is_empty() && out.filter_state.is_empty());
        // Counts reach the host on the root context's tick.
        vm.tick().unwrap();
        assert_eq!(vm.state().metric("tether_requests_untouched"), Some(1));
    }

    #[test]
    fn spoofed_internal_headers_are_removed() {
        let mut vm = vm(json!({"mode":"pick","endpoints":[{"address":"10.0.0.1:8000"}]}));
        let out = raw(
            &mut vm,
            &[
                ("x-session-id", "s"),
                ("x-tether-key", "ffffffffffffffff"),
                ("x-gateway-destination-endpoint", "6.6.6.6:80"),
                ("x-data-parallel-rank", "7"),
                ("x-tether-pull-from", "6.6.6.6:80"),
            ],
            b"{}",
        );
        assert_ne!(
            out.upstream_header("x-tether-key"),
            Some("ffffffffffffffff")
        );
        assert_eq!(out.upstream_header("x-tether-pull-from"), None);
        assert_eq!(
            out.upstream_header("x-gateway-destination-endpoint"),
            Some("10.0.0.1:8000")
        );
        assert_ne!(out.upstream_header("x-data-parallel-rank"), Some("7"));
        // One count per spoofed header removed.
        // Counts reach the host on the root context's tick.
        vm.tick().unwrap();
        assert_eq!(vm.state().metric("tether_spoofed_header_removed"), Some(4));
    }

    #[test]
    fn unusable_identity_headers_are_skipped_and_counted() {
        let mut vm = vm(json!({}));
        let long = "x".repeat(2000);
        let mut req = Request::post(
            CHAT,
            &[("x-session-id", &long)],
            &[chat("s", "u", 0).to_string().as_bytes()],
        );
        req.headers.add(b"x-claude-code-session-id", b"\xff\xfe");
        let out = vm.run(&req).unwrap();
        assert!(!source(&out).starts_with("header:"), "{}", source(&out));
        // Both unusable headers (too long, not UTF-8), each counted once.
        // Counts reach the host on the root context's tick.
        vm.tick().unwrap();
        assert_eq!(vm.state().metric("tether_bad_header"), Some(2));
    }

    #[test]
    fn multi_megabyte_conversations_do_not_trap() {
        let mut vm = vm(json!({}));
        let mut body = chat("s", "u", 20_000);
        body["session_id"] = json!("big");
        let bytes = body.to_string().into_bytes();
        assert!(bytes.len() > 2_000_000);
        let out = vm
            .run(&Request {
                body_chunks: Request::chunked(&bytes, 64 * 1024),
                ..Request::post(CHAT, &[], &[])
            })
            .unwrap();
        assert_eq!(
            out.filter_state_value("wasm.tether.x-tether-key-source"),
            Some("body:session_id")
        );
        assert_eq!(out.upstream.unwrap().body.len(), bytes.len());
    }
}

mod configuration {
    use super::*;

    #[test]
    fn invalid_configurations_are_rejected_with_the_field() {
        for (config, field) in [
            (json!({"no_such_field": 1}), "no_such_field"),
            (json!({"mode": 3}), "mode"),
            (json!({"mode": "pick", "endpoints": []}), "endpoints"),
            (
                json!({"mode": "pick", "endpoints": [{"address": "nowhere"}]}),
                "address",
            ),
            (
                json!({"mode": "pick", "endpoints": [{"address": "10.0.0.1:80", "weight": 0}]}),
                "weight",
            ),
            (
                json!({"session_sources": ["cookie:sid"]}),
                "session_sources",
            ),
        ] {
            match plugin().start(options(&config.to_string())) {
                Err(HostError::ConfigureRejected { logs }) => {
                    let text = logs.join("\n");
                    assert!(
                        text.contains("tether: invalid configuration") && text.contains(field),
                        "{config}: {text}"
                    );
                }
                other => panic!("{config}: expected a rejection, got {other:?}"),
            }
        }
        let err = plugin().start(options("not json")).unwrap_err();
        assert!(matches!(err, HostError::ConfigureRejected { .. }));
    }

    /// An empty configuration is the documented defaults (docs/gateway.md,
    /// "Configuration"), spelled out here: every request below gets the same
    /// headers, filter state and body upstream as under the explicit defaults,
    /// and the behaviours each default stands for are checked directly.
    #[test]
    fn empty_configuration_means_defaults() {
        let explicit = json!({
            "mode": "hash",
            "fallbacks": 2,
            "session_sources": [
                "header:x-session-id", "header:x-claude-code-session-id", "header:session-id",
                "header:session_id", "header:x-session-affinity", "header:x-opencode-session",
                "header:x-dynamo-session-id", "body:session_id",
                "body:vllm_xargs.agentic_context.session_id", "body:nvext.agent_context.session_id",
                "body:prompt_cache_key", "body:metadata.session_id", "body:metadata.user_id",
                "body:user+head"
            ],
            "subagent_sources": [
                "header:x-claude-code-agent-id", "header:thread-id",
                "body:vllm_xargs.agentic_context.agent_id", "body:nvext.agent_context.agent_id",
                "body:metadata.agent_id"
            ],
            "parent_sources": [
                "header:x-parent-session-id", "header:x-claude-code-parent-agent-id",
                "header:x-codex-parent-thread-id", "header:x-dynamo-parent-session-id",
                "body:vllm_xargs.agentic_context.parent_id", "body:nvext.agent_context.parent_id"
            ],
            "retention_ms": {"first": 300000, "user": 300000, "tool": 120000, "handoff": 300000},
            "subagent_tools": ["Task", "Agent", "spawn_agent", "delegate"],
            "outputs": "hash",
            "max_body_bytes": 16777216,
            "header_fast_path": true,
            "turn_count_max_bytes": 32768
        });
        let mut with_user = chat("s", "u", 0);
        with_user["user"] = json!("alice");
        let mut task = chat("s", "u", 0);
        task["metadata"] = json!({"session_id": "run-1", "agent_id": "a1"});
        task["messages"].as_array_mut().unwrap().extend([
            json!({"role":"assistant","content":null,"tool_calls":[{"id":"t1","type":"function","function":{"name":"Task","arguments":"{}"}}]}),
            json!({"role":"tool","tool_call_id":"t1","content":"sub done"}),
        ]);
        let mut big = chat("s", "u", 0);
        big["padding"] = json!("x".repeat(1 << 20));
        big["session_id"] = json!("big-1");
        // (what, headers, body)
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Value);
        let requests: Vec<Case<'_>> = vec![
            (
                "header session",
                vec![("x-session-id", "r1")],
                chat("s", "u", 1),
            ),
            (
                "later header source",
                vec![("x-dynamo-session-id", "r2")],
                chat("s", "u", 0),
            ),
            (
                "subagent and parent headers",
                vec![
                    ("session-id", "r3"),
                    ("thread-id", "t"),
                    ("x-dynamo-parent-session-id", "p"),
                ],
                chat("s", "u", 0),
            ),
            ("tool turn in the body", vec![], {
                let mut b = chat("s", "u", 2);
                b["prompt_cache_key"] = json!("k");
                b
            }),
            ("user + head", vec![], with_user),
            ("Task result, body agent id", vec![], task),
            ("1 MiB body", vec![], big),
            ("long conversation", vec![], {
                let mut b = chat("s", "u", 400);
                b["session_id"] = json!("long-1");
                b
            }),
            ("no identity", vec![], chat("s", "u", 0)),
        ];
        let mut reference = vm(explicit);
        let mut outs = Vec::new();
        for config in ["", "{}"] {
            let mut vm = plugin()
                .start(options(config))
                .unwrap_or_else(|e| panic!("{config:?}: {e}"));
            for (what, headers, body) in &requests {
                let (a, b) = (
                    send(&mut vm, CHAT, headers, body),
                    send(&mut reference, CHAT, headers, body),
                );
                assert_eq!(
                    format!("{:?}", a.upstream),
                    format!("{:?}", b.upstream),
                    "{config:?} {what}"
                );
                assert_eq!(a.properties_set, b.properties_set, "{config:?} {what}");
                assert_eq!(
                    format!("{:?}", a.filter_state),
                    format!("{:?}", b.filter_state),
                    "{config:?} {what}"
                );
                // Hash mode emits the key alone by default.
                let emitted: Vec<String> = a
                    .properties_set
                    .keys()
                    .cloned()
                    .chain(
                        a.upstream
                            .iter()
                            .flat_map(|u| u.headers.iter().map(|(k, _)| k.to_owned()))
                            .filter(|k| k.starts_with("x-tether-")),
                    )
                    .collect();
                assert!(
                    emitted
                        .iter()
                        .all(|k| k == "x-tether-key" || k == "wasm.tether.x-tether-key"),
                    "{config:?} {what}: {emitted:?}"
                );
                outs.push((*what, a));
            }
        }
        // The other defaults (sources, retention table, subagent tools), seen
        // through every output.
        let mut all = vm(json!({"outputs": "all"}));
        let everything: Vec<(&str, Outcome)> = requests
            .iter()
            .map(|(what, headers, body)| (*what, send(&mut all, CHAT, headers, body)))
            .collect();
        // An output as the rank gets it: a header (header path) or the filter-state
        // value Envoy copies into one (body path).
        let get = |what: &str, h: &str| {
            everything
                .iter()
                .find(|(w, _)| *w == what)
                .and_then(|(_, o)| {
                    o.upstream_header(h)
                        .or(o.filter_state_value(&format!("wasm.tether.{h}")))
                })
                .map(str::to_owned)
        };
        // Header sources in the default order, decided without reading the body.
        assert_eq!(
            get("header session", "x-tether-key-source").as_deref(),
            Some("header:x-session-id")
        );
        assert_eq!(
            get("later header source", "x-tether-key-source").as_deref(),
            Some("header:x-dynamo-session-id")
        );
        assert_ne!(
            get("subagent and parent headers", "x-tether-subagent").as_deref(),
            Some("0000000000000000")
        );
        assert!(is_hex16(
            get("subagent and parent headers", "x-tether-parent").as_deref()
        ));
        // Hash mode: a key, no endpoint pick.
        assert!(is_hex16(get("header session", "x-tether-key").as_deref()));
        assert_eq!(
            get("header session", "x-gateway-destination-endpoint"),
            None
        );
        // The engine gets the session hash and the retention table.
        assert!(is_hex16(
            get("header session", "x-tether-session").as_deref()
        ));
        assert_eq!(
            get("tool turn in the body", "x-tether-turn-kind").as_deref(),
            Some("tool")
        );
        assert_eq!(
            get("tool turn in the body", "x-tether-retention-ms").as_deref(),
            Some("120000")
        );
        assert_eq!(
            get("user + head", "x-tether-key-source").as_deref(),
            Some("body:user+head")
        );
        assert_eq!(
            get("user + head", "x-tether-retention-ms").as_deref(),
            Some("300000")
        );
        // `Task` is a subagent tool; metadata.agent_id names the subagent.
        assert_eq!(
            get("Task result, body agent id", "x-tether-turn-kind").as_deref(),
            Some("handoff")
        );
        assert_ne!(
            get("Task result, body agent id", "x-tether-subagent").as_deref(),
            Some("0000000000000000")
        );
        // 1 MiB is far below the 16 MiB limit; without identity the head hash keys the run.
        assert_eq!(
            get("1 MiB body", "x-tether-key-source").as_deref(),
            Some("body:session_id")
        );
        assert_eq!(
            get("no identity", "x-tether-key-source").as_deref(),
            Some("head")
        );
        // Whole bodies up to 32 KiB are counted; a longer conversation is read from
        // its ends and not counted.
        assert_eq!(
            get("tool turn in the body", "x-tether-turn").as_deref(),
            Some("3")
        );
        assert_eq!(
            get("long conversation", "x-tether-turn-kind").as_deref(),
            Some("tool")
        );
        assert_eq!(get("long conversation", "x-tether-turn"), None);
        // No debug header by default, and the body is not rewritten.
        for (what, o) in &outs {
            assert!(
                !format!("{:?}", o.downstream).contains("x-tether-debug"),
                "{what}"
            );
            let sent = requests
                .iter()
                .find(|(w, ..)| w == what)
                .map(|(.., b)| b.to_string())
                .unwrap();
            assert_eq!(
                o.upstream.as_ref().map(|u| u.body.clone()),
                Some(sent.into_bytes()),
                "{what}"
            );
        }
    }
}

/// Preset `vllm`: the markers in the body's `kv_transfer_params.tether`, merged
/// with the client's parameters; a client's own `tether` never reaches the engine.
mod vllm_markers {
    use super::*;
    use tether_wire::TurnMarker;

    #[test]
    fn the_upstream_body_carries_the_markers_and_the_clients_params() {
        let mut vm = vm(json!({"outputs": ["vllm"]}));
        let mut body = chat("sys", "task", 2);
        body["session_id"] = json!("run-9");
        body["kv_transfer_params"] = json!({
            "do_remote_decode": false,
            "tether": {"session": "ffffffffffffffff", "prompt_end": "1", "turn_kind": "first"}
        });
        let out = send(&mut vm, CHAT, &[("content-length", "9999")], &body);
        let up = out.upstream.clone().expect("released upstream");
        let sent: Value = serde_json::from_slice(&up.body).expect("the body is still JSON");
        let kv = &sent["kv_transfer_params"];
        assert_eq!(kv["do_remote_decode"], json!(false), "{sent}");
        let tether = kv["tether"].as_object().expect("our markers");
        let m = TurnMarker::from_fields(
            tether
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("?"))),
        )
        .unwrap()
        .expect("a session");
        assert_ne!(tether["session"], json!("ffffffffffffffff"));
        assert_eq!(m.kind, tether_wire::TurnKind::Tool);
        assert!(m.prompt_end);
        // The session also reaches vLLM as request.session_id, through x-session-id.
        assert!(is_hex16(out.filter_state_value("wasm.tether.x-session-id")));
        // The rest of the body is the client's, byte for byte after the rewritten prefix.
        assert_eq!(sent["messages"], body["messages"]);
        // The old content-length is gone: Envoy's buffer filter sets the new one.
        assert_eq!(up.headers.get_str("content-length"), None);
        vm.tick().unwrap();
        assert_eq!(vm.state().metric("tether_body_rewritten"), Some(1));
        assert_eq!(
            vm.state().metric("tether_spoofed_body_marker_removed"),
            Some(1)
        );
        // A client's parameters without markers of its own are not counted.
        body["kv_transfer_params"] = json!({"do_remote_decode": false});
        send(&mut vm, CHAT, &[], &body);
        vm.tick().unwrap();
        assert_eq!(vm.state().metric("tether_body_rewritten"), Some(2));
        assert_eq!(
            vm.state().metric("tether_spoofed_body_marker_removed"),
            Some(1)
        );
    }

    #[test]
    fn a_body_that_cannot_be_rewritten_is_refused() {
        let mut vm = vm(json!({"outputs": "vllm", "max_body_bytes": 2000}));
        let mut body = chat("sys", &"x".repeat(3000), 0);
        body["kv_transfer_params"] = json!({"tether": {"session": "ff"}});
        let bytes = body.to_string().into_bytes();
        let out = vm
            .run(&Request {
                body_chunks: Request::chunked(&bytes, 1000),
                ..Request::post(CHAT, &[("content-type", "application/json")], &[])
            })
            .unwrap();
        let local = out.local_response.expect("refused locally");
        assert_eq!(local.status, 413);
        assert_eq!(local.details, "tether_body_not_rewritten");
    }
}
