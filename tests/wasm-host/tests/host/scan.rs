//! The tether filter's body scanner as built for wasm (SIMD `simd128` in the
//! block classification) against its native build: random agent bodies, with
//! the identity at either end or truly in the middle (a full structural scan),
//! must give the same outputs in the harness as `decide::on_body` natively.

use crate::common::options;
use std::sync::OnceLock;
use tether_filter::api::Api;
use tether_filter::config::Config;
use tether_filter::decide;
use tether_filter::place::Pools;
use tether_wasm_host::{Plugin, Request};

fn module() -> &'static [u8] {
    static M: OnceLock<Vec<u8>> = OnceLock::new();
    M.get_or_init(|| {
        let path = tether_wasm_host::module_path("TETHER_FILTER_WASM", "tether_filter.wasm")
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::read(path).expect("module readable")
    })
}

fn plugin() -> &'static Plugin {
    static P: OnceLock<Plugin> = OnceLock::new();
    P.get_or_init(|| Plugin::new(module(), false).expect("tether filter compiles"))
}

/// xorshift64*: deterministic bodies without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Text with the characters that matter to a JSON scanner: quotes,
    /// backslashes, brackets, commas, newlines, non-ASCII.
    fn text(&mut self, max: usize) -> String {
        const PIECES: [&str; 12] = [
            "fn", " ", "\"", "\\", "{", "}", "[", "]", ",", "\n", "é", "x\\\"y",
        ];
        (0..self.below(max + 1))
            .map(|_| PIECES[self.below(PIECES.len())])
            .collect()
    }
}

/// A Chat body: messages (user / assistant tool calls / tool results), a
/// `tools` array of small objects, and `session_id` before, between or after them.
fn body(rng: &mut Rng) -> Vec<u8> {
    let mut messages = vec![serde_json::json!({"role": "system", "content": rng.text(40)})];
    for i in 0..rng.below(120) {
        messages.push(match i % 3 {
            0 => serde_json::json!({"role": "user", "content": rng.text(300)}),
            1 => serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}"), "type": "function", "function": {"name": "read", "arguments": rng.text(20)}}]}),
            _ => serde_json::json!({"role": "tool", "tool_call_id": format!("c{}", i - 1), "content": rng.text(2000)}),
        });
    }
    let tools: Vec<serde_json::Value> = (0..rng.below(400))
        .map(|i| {
            serde_json::json!({"type": "function", "function": {"name": format!("t{i}"),
            "description": rng.text(30), "parameters": {"type": "object", "properties": {}}}})
        })
        .collect();
    let session = serde_json::json!(format!("s-{}", rng.next()));
    let m = serde_json::json!(messages).to_string();
    let t = serde_json::json!(tools).to_string();
    let s = session.to_string();
    let parts = match rng.below(3) {
        0 => format!(r#"{{"session_id":{s},"model":"m","messages":{m},"tools":{t}}}"#),
        1 => format!(r#"{{"model":"m","messages":{m},"session_id":{s},"tools":{t}}}"#),
        _ => format!(r#"{{"model":"m","messages":{m},"tools":{t},"session_id":{s}}}"#),
    };
    parts.into_bytes()
}

#[test]
fn wasm_build_decides_like_the_native_build() {
    // Every header output, so every marker is compared.
    let config = r#"{"outputs":"all"}"#;
    let cfg = Config::parse(config.as_bytes()).unwrap();
    let pools = Pools::new(&cfg);
    let mut vm = plugin().start(options(config)).unwrap();
    let mut rng = Rng(0x7e7e_7e7e_1234_5678);
    let (mut full, mut ends) = (0, 0);
    for round in 0..120 {
        let body = body(&mut rng);
        let d = decide::on_whole_body(&cfg, &pools, Api::Chat, &body);
        if d.read.stats.full {
            full += 1;
        } else {
            ends += 1;
        }
        let want: Vec<(String, String)> = d
            .request_headers(&cfg, &pools)
            .into_iter()
            .map(|(k, v)| (format!("wasm.tether.{k}"), v))
            .collect();
        let chunk = 1 + rng.below(70_000);
        let out = vm
            .run(&Request {
                body_chunks: Request::chunked(&body, chunk),
                ..Request::post(
                    "/v1/chat/completions",
                    &[("content-type", "application/json")],
                    &[],
                )
            })
            .unwrap();
        let mut got: Vec<(String, String)> = out.properties_set.into_iter().collect();
        let mut want = want;
        got.sort();
        want.sort();
        assert_eq!(got, want, "round {round}: {} bytes", body.len());
        assert!(
            d.read.source.starts_with("body:session_id"),
            "round {round}: {}",
            d.read.source
        );
    }
    assert!(
        full > 10 && ends > 10,
        "both read paths covered: {full} full, {ends} ends-only"
    );
}

/// The scanner's SIMD is really in the module Envoy and the harness run: the
/// code section holds `i8x16.eq` / `i8x16.bitmask` (built with `+simd128`,
/// `.cargo/config.toml`). That Envoy's V8 runs them is shown end to end
/// (tests/e2e, `body_scan::identity_in_the_middle_routes_like_the_native_build`).
#[test]
fn module_uses_wasm_simd() {
    use wasmparser::{Operator, Parser, Payload};
    let (mut eq, mut bitmask) = (0, 0);
    for payload in Parser::new(0).parse_all(module()) {
        if let Ok(Payload::CodeSectionEntry(body)) = payload {
            let mut ops = body.get_operators_reader().expect("operators");
            while !ops.eof() {
                match ops.read() {
                    Ok(Operator::I8x16Eq) => eq += 1,
                    Ok(Operator::I8x16Bitmask) => bitmask += 1,
                    Ok(_) => {}
                    Err(e) => panic!("bad code: {e}"),
                }
            }
        }
    }
    assert!(
        eq > 0 && bitmask > 0,
        "no SIMD: {eq} i8x16.eq, {bitmask} i8x16.bitmask"
    );
}
