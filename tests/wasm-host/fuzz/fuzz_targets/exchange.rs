//! Arbitrary headers, body chunkings and plugin configurations through a
//! filter module in the harness. Findings: a host panic, or a trap in the
//! module (a filter must never trap on client input; Envoy would turn every
//! later request into a 503).
//!
//! Module: `TETHER_FUZZ_WASM`, else `TETHER_FILTER_WASM`, else the floor filter.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tether_wasm_host::{HostError, HostOptions, Plugin, Request};

fn plugin() -> &'static Plugin {
    static P: OnceLock<Plugin> = OnceLock::new();
    P.get_or_init(|| {
        let path = std::env::var("TETHER_FUZZ_WASM")
            .map(std::path::PathBuf::from)
            .or_else(|_| tether_wasm_host::module_path("TETHER_FILTER_WASM", "tether_filter.wasm"))
            .or_else(|_| {
                tether_wasm_host::module_path("TETHER_FLOOR_WASM", "tether_floor_filter.wasm")
            })
            .expect("no module: set TETHER_FUZZ_WASM or run `make wasm`");
        Plugin::new(&std::fs::read(path).expect("module readable"), true).expect("module compiles")
    })
}

/// Plugin configurations: the valid shapes of the floor and tether filters
/// plus broken ones; selector 255 takes raw bytes from the input instead.
const CONFIGS: &[&str] = &[
    r#"{"mode":"header"}"#,
    r#"{"mode":"body","dst":"127.0.0.1:9000"}"#,
    r#"{"mode":"probe"}"#,
    r#"{}"#,
    r#"{"mode":"hash"}"#,
    r#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","dp_size":4},{"address":"10.0.0.2:8000"}]}"#,
    r#"{"mode":"hash","session_sources":["body:metadata.user_id+head","header:x-session-id"],"outputs":"all"}"#,
    r#"{"outputs":["vllm","retain","turn"],"cache_salt":{"secret":"k"}}"#,
    r#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","dp_size":2}],"outputs":["all","routed_dp_rank","body_session_id","original_dst","kv_transfer_params"]}"#,
    r#"{"mode":"pick","endpoints":[]}"#,
    r#"{"mode":"body","dst":"nope"}"#,
    "not json",
];

/// Input layout: [config selector][header count][chunk count] then
/// NUL-separated fields: config (if raw), header names/values, body chunks.
struct Reader<'a> {
    fields: std::iter::Peekable<std::slice::Split<'a, u8, fn(&u8) -> bool>>,
}

impl<'a> Reader<'a> {
    fn next(&mut self) -> &'a [u8] {
        self.fields.next().unwrap_or_default()
    }
}

fuzz_target!(|data: &[u8]| {
    let [sel, n_headers, n_chunks, rest @ ..] = data else {
        return;
    };
    let is_nul: fn(&u8) -> bool = |b| *b == 0;
    let mut r = Reader {
        fields: rest.split(is_nul).peekable(),
    };
    let config = match CONFIGS.get(*sel as usize % (CONFIGS.len() + 1)) {
        Some(c) => c.as_bytes().to_vec(),
        None => r.next().to_vec(),
    };
    let path = [
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/other",
    ][(*sel as usize >> 4) % 4];
    let mut req = Request::post(path, &[], &[]);
    for _ in 0..(*n_headers % 12) {
        let (name, value) = (r.next(), r.next());
        req.headers.add(name, value);
    }
    for _ in 0..(*n_chunks % 8) {
        req.body_chunks.push(r.next().to_vec());
    }
    // Whatever is left becomes one more chunk: bodies are mostly JSON-ish bytes.
    let tail: Vec<u8> = r
        .fields
        .by_ref()
        .flat_map(|f| f.iter().copied().chain([b'"']))
        .collect();
    if !tail.is_empty() {
        req.body_chunks.push(tail);
    }
    req.body_chunks.retain(|c| !c.is_empty());
    let options = HostOptions {
        plugin_config: config,
        fuel_per_callback: Some(2_000_000_000),
        ..HostOptions::default()
    };
    let mut vm = match plugin().start(options) {
        Ok(vm) => vm,
        Err(HostError::ConfigureRejected { .. }) => return,
        Err(e) => panic!("start failed: {e}"),
    };
    for _ in 0..2 {
        if let Err(e) = vm.run(&req) {
            panic!("filter failed on client input: {e}");
        }
    }
});
