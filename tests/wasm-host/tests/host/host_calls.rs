//! What tether's body path asks of the host per request, against the body
//! floors in tether's chain (gateway-bench h, l and m): body callbacks, host
//! calls by kind and bytes copied into the VM, at the benchmark's two sizes.
//! Counted here rather than timed, so the figures do not depend on a quiet
//! machine (BENCHMARKS.md, "Where the body path's time goes").

use crate::common::{floor_plugin, options};
use crate::tether::plugin;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tether_wasm_host::{Action, Outcome, Plugin, Request};

/// Envoy hands a wasm filter the request body in pieces of at most 16 KiB
/// here (one socket read each); the count of callbacks follows the chunking.
const CHUNK: usize = 16 * 1024;

/// A Chat Completions agent transcript of about `size` bytes, its
/// `prompt_cache_key` after the messages (gateway-bench's shape).
fn transcript(size: usize) -> Vec<u8> {
    let mut messages = vec![
        json!({"role":"system","content":"You are a coding agent."}),
        json!({"role":"user","content":"Fix the failing test."}),
    ];
    let mut i = 0;
    loop {
        let body = json!({"model":"m","messages":messages,"prompt_cache_key":"run-1"});
        let bytes = body.to_string().into_bytes();
        if bytes.len() >= size {
            return bytes;
        }
        messages.push(json!({"role":"assistant","content":null,"tool_calls":[{"id":format!("c{i}"),"type":"function","function":{"name":"read_file","arguments":"{\"path\":\"src/lib.rs\"}"}}]}));
        messages.push(json!({"role":"tool","tool_call_id":format!("c{i}"),"content":"fn main() {\n    println!(\"hello\");\n}\n".repeat(4)}));
        i += 1;
    }
}

fn run(plugin: &Plugin, config: Value, body: &[u8]) -> Outcome {
    let mut vm = plugin.start(options(&config.to_string())).unwrap();
    let req = Request {
        body_chunks: Request::chunked(body, CHUNK),
        ..Request::post(
            "/v1/chat/completions",
            &[("content-type", "application/json")],
            &[],
        )
    };
    // The second request of a warm VM, as in the benchmark.
    vm.run(&req).unwrap();
    let out = vm.run(&req).unwrap();
    assert_eq!(out.stalled, None, "{out:#?}");
    out
}

fn body_callbacks(out: &Outcome) -> Vec<Action> {
    out.callbacks
        .iter()
        .filter(|c| c.callback == "proxy_on_request_body")
        .map(|c| c.action)
        .collect()
}

/// Host calls of the request path only (the response path is the same for all).
fn calls(out: &Outcome) -> BTreeMap<String, u64> {
    out.host_calls.clone()
}

#[test]
fn tether_makes_the_body_floors_host_calls_and_copies_no_more() {
    for size in [4463, 409_677] {
        let body = transcript(size);
        let tether = run(plugin(), json!({"mode": "hash"}), &body);
        let state = run(
            floor_plugin(),
            json!({"mode": "body-state", "key": "k"}),
            &body,
        );
        let read = run(
            floor_plugin(),
            json!({"mode": "body-read", "key": "k"}),
            &body,
        );
        let least = run(
            floor_plugin(),
            json!({"mode": "body-key", "field": "prompt_cache_key"}),
            &body,
        );
        println!(
            "{} bytes, {} chunks of 16 KiB:",
            body.len(),
            body.len().div_ceil(CHUNK)
        );
        for (name, out) in [
            ("tether", &tether),
            ("h body-state", &state),
            ("l body-read", &read),
            ("m body-key", &least),
        ] {
            println!(
                "  {name}: body callbacks {}, host calls {:?}, bytes into the VM {}",
                body_callbacks(out).len(),
                calls(out),
                out.bytes_to_guest
            );
        }
        // Wasm operators per callback (metered modules): where the VM's work is.
        for (name, var, module, config) in [
            (
                "tether",
                "TETHER_FILTER_WASM",
                "tether_filter.wasm",
                json!({"mode": "hash"}),
            ),
            (
                "l body-read",
                "TETHER_FLOOR_WASM",
                "tether_floor_filter.wasm",
                json!({"mode": "body-read", "key": "k"}),
            ),
            (
                "m body-key",
                "TETHER_FLOOR_WASM",
                "tether_floor_filter.wasm",
                json!({"mode": "body-key", "field": "prompt_cache_key"}),
            ),
        ] {
            let path = tether_wasm_host::module_path(var, module).unwrap();
            let metered = Plugin::new(&std::fs::read(path).unwrap(), true).unwrap();
            println!(
                "  {name}, wasm operators by callback: {:?}",
                run(&metered, config, &body).fuel
            );
        }
        // Same callbacks: every floor and tether pause each chunk until the end.
        assert_eq!(body_callbacks(&tether), body_callbacks(&state));
        assert_eq!(body_callbacks(&tether), body_callbacks(&read));
        assert_eq!(
            tether
                .filter_state_value("wasm.tether.x-tether-key")
                .map(str::len),
            Some(16)
        );
        // tether's request path makes exactly the calls of the floor that
        // makes its reads, and copies the same bytes into the VM.
        assert_eq!(calls(&tether), calls(&read), "{size}");
        assert_eq!(tether.bytes_to_guest, read.bytes_to_guest, "{size}");
        // The least body-key decision makes them too, and keys by the field.
        assert_eq!(calls(&least), calls(&read), "{size}");
        assert_eq!(least.bytes_to_guest, read.bytes_to_guest, "{size}");
        let want = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(b"run-1"));
        assert_eq!(
            least.filter_state_value("wasm.tether.x-tether-key"),
            Some(want.as_str())
        );
    }
}
