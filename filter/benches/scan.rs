//! Scanner benchmark: full structural scan throughput and the head+tail
//! decision cost at 4 KB, 400 KB and 4 MB agent bodies, side by side with a
//! serde_json DOM parse. Runs natively (`cargo bench -p tether-filter --bench scan`)
//! and inside V8 (build for wasm32-wasip1, run with `node filter/benches/run-wasm.mjs`).

use std::hint::black_box;
use std::time::Instant;
use tether_filter::api::Api;
use tether_filter::config::Config;
use tether_filter::decide;
use tether_filter::placement::Placement;
use tether_filter::scan::{self, ReadLimits};

/// A Claude-Code-like Anthropic body or an OpenAI Chat body of about `target` bytes:
/// tools and system prompt, then tool-call turns with file-sized results.
fn body(api: Api, target: usize) -> Vec<u8> {
    let text = |n: usize, seed: usize| -> String {
        let words = ["fn", "let", "match", "\"quoted\"", "path\\to", "x", "{", "}", "\n", "return"];
        let mut s = String::with_capacity(n);
        let mut i = seed;
        while s.len() < n {
            s.push_str(words[i % words.len()]);
            s.push(' ');
            i = i.wrapping_mul(31).wrapping_add(7);
        }
        s
    };
    let mut msgs = Vec::new();
    msgs.push(serde_json::json!({"role": "user", "content": text(2000, 1)}));
    let mut i = 0;
    let mut size = 6000;
    while size < target {
        let result = text(3000, i);
        size += result.len() + 300;
        match api {
            Api::Messages => {
                msgs.push(serde_json::json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("t{i}"), "name": "Read", "input": {"path": "a.rs"}}]}));
                msgs.push(serde_json::json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{i}"), "content": result}]}));
            }
            _ => {
                msgs.push(serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("t{i}"), "type": "function", "function": {"name": "Read", "arguments": "{}"}}]}));
                msgs.push(serde_json::json!({"role": "tool", "tool_call_id": format!("t{i}"), "content": result}));
            }
        }
        i += 1;
    }
    let tools: Vec<serde_json::Value> = (0..8).map(|k| serde_json::json!({"name": format!("tool{k}"), "description": text(300, k), "input_schema": {"type": "object"}})).collect();
    let v = match api {
        Api::Messages => serde_json::json!({"max_tokens": 4096, "messages": msgs, "model": "m", "metadata": {"user_id": "user_abc_session_123"}, "system": text(3000, 9), "tools": tools}),
        _ => serde_json::json!({"model": "m", "messages": msgs, "tools": tools, "metadata": {"session_id": "s-1"}, "user": "u"}),
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Median seconds of `f` over `runs` runs.
fn median(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let cfg = Config::default();
    let placement = Placement::new(&cfg.endpoints);
    let headers = vec![(":path".to_owned(), b"/v1/messages".to_vec())];
    println!("{:<10} {:>9} {:>10} {:>12} {:>12} {:>12} {:>10} {:>9}", "api", "bytes", "full GB/s", "full µs", "decide µs", "serde µs", "fetched", "serde/dec");
    for api in [Api::Messages, Api::Chat] {
        for target in [4_000usize, 400_000, 4_000_000] {
            let b = body(api, target);
            let runs = if b.len() > 1_000_000 { 30 } else { 300 };
            let full = median(runs, || {
                black_box(scan::scan_full(black_box(&b), api).ok());
            });
            let mut fetched = 0;
            let dec = median(runs, || {
                fetched = 0;
                let mut fetch = |s: usize, l: usize| {
                    fetched += l;
                    b.get(s..s + l).map(<[u8]>::to_vec)
                };
                black_box(decide::on_body(&cfg, &placement, api, &headers, b.len(), None, &mut fetch));
            });
            let serde = median(runs.min(50), || {
                black_box(serde_json::from_slice::<serde_json::Value>(black_box(&b)).ok());
            });
            let _ = ReadLimits::default();
            println!(
                "{:<10} {:>9} {:>10.2} {:>12.1} {:>12.1} {:>12.1} {:>10} {:>9.1}",
                api.name(),
                b.len(),
                b.len() as f64 / full / 1e9,
                full * 1e6,
                dec * 1e6,
                serde * 1e6,
                fetched,
                serde / dec
            );
        }
    }
}
