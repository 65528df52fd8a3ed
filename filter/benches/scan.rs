//! Scanner benchmark: full structural scan throughput and the head+tail
//! decision cost at 4 KB, 400 KB and 4 MB agent bodies, side by side with a
//! serde_json DOM parse. Runs natively (`cargo bench -p tether-filter --bench scan`)
//! and inside V8 (build for wasm32-wasip1, run with `node filter/benches/run-wasm.mjs`).

use std::hint::black_box;
use std::time::Instant;
use tether_filter::api::Api;
use tether_filter::config::Config;
use tether_filter::decide;
use tether_filter::decide::BodyCall;
use tether_filter::emit::Plan;
use tether_filter::place::{Pools, Snapshot};
use tether_filter::read::identity::Headers;
use tether_filter::read::scan::{self, ReadLimits};

/// A Claude-Code-like Anthropic body or an OpenAI Chat body of about `target`
/// bytes, keys in the official SDKs' order (role/type first, identity fields
/// after the conversation): tools and system prompt, then tool-call turns with
/// file-sized results full of escapes.
fn body(api: Api, target: usize) -> Vec<u8> {
    let text = |n: usize, seed: usize| -> String {
        let words = [
            "fn",
            "let",
            "match",
            "\"quoted\"",
            "path\\to",
            "x",
            "{",
            "}",
            "\n",
            "return",
        ];
        let mut s = String::with_capacity(n);
        let mut i = seed;
        while s.len() < n {
            s.push_str(words[i % words.len()]);
            s.push(' ');
            i = i.wrapping_mul(31).wrapping_add(7);
        }
        s
    };
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut msgs: Vec<String> = Vec::new();
    match api {
        Api::Messages => msgs.push(format!(
            r#"{{"role":"user","content":[{{"type":"text","text":{}}}]}}"#,
            q(&text(2000, 1))
        )),
        _ => {
            msgs.push(format!(
                r#"{{"role":"system","content":{}}}"#,
                q(&text(3000, 9))
            ));
            msgs.push(format!(
                r#"{{"role":"user","content":{}}}"#,
                q(&text(2000, 1))
            ));
        }
    }
    let mut i = 0;
    let mut size = 6000;
    while size < target {
        let result = q(&text(3000, i));
        size += result.len() + 300;
        match api {
            Api::Messages => {
                msgs.push(format!(r#"{{"role":"assistant","content":[{{"type":"tool_use","id":"t{i}","name":"Read","input":{{"path":"a.rs"}}}}]}}"#));
                msgs.push(format!(r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t{i}","content":{result}}}]}}"#));
            }
            _ => {
                msgs.push(format!(r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"t{i}","type":"function","function":{{"name":"Read","arguments":"{{}}"}}}}]}}"#));
                msgs.push(format!(
                    r#"{{"role":"tool","tool_call_id":"t{i}","content":{result}}}"#
                ));
            }
        }
        i += 1;
    }
    let msgs = msgs.join(",");
    let tools: Vec<String> = (0..8)
        .map(|k| match api {
            Api::Messages => format!(r#"{{"name":"tool{k}","description":{},"input_schema":{{"type":"object"}}}}"#, q(&text(300, k))),
            _ => format!(r#"{{"type":"function","function":{{"name":"tool{k}","description":{},"parameters":{{"type":"object"}}}}}}"#, q(&text(300, k))),
        })
        .collect();
    let tools = tools.join(",");
    let out = match api {
        Api::Messages => format!(
            r#"{{"max_tokens":4096,"messages":[{msgs}],"model":"m","metadata":{{"user_id":"user_abc_session_123"}},"system":{},"tools":[{tools}]}}"#,
            q(&text(3000, 9))
        ),
        _ => format!(
            r#"{{"model":"m","messages":[{msgs}],"tools":[{tools}],"metadata":{{"session_id":"s-1"}},"user":"u"}}"#
        ),
    };
    out.into_bytes()
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

/// The body decision as the filter makes it, with no load view.
fn decide_on(
    cfg: &Config,
    pools: &Pools,
    api: Api,
    headers: &Headers,
    size: usize,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Plan {
    let call = BodyCall::new(api, headers, size);
    decide::on_body(cfg, pools, Snapshot::NONE, call, fetch, &mut |_| {})
}

fn main() {
    let cfg = Config::default();
    let pools = Pools::new(&cfg);
    let headers = vec![(":path".to_owned(), b"/v1/messages".to_vec())];
    // `--profile-decide`: only the 400 KB decision, in a loop (for `perf record`).
    if std::env::args().any(|a| a == "--profile-decide") {
        let b = body(Api::Messages, 400_000);
        for _ in 0..20_000 {
            let mut fetch = |s: usize, l: usize| b.get(s..s + l).map(<[u8]>::to_vec);
            black_box(decide_on(
                &cfg,
                &pools,
                Api::Messages,
                &headers,
                b.len(),
                &mut fetch,
            ));
        }
        return;
    }
    // `--file PATH API`: the decision on a body from a file (e.g. a captured request).
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--file") {
        let (Some(path), Some(api)) = (args.get(i + 1), args.get(i + 2)) else {
            return;
        };
        let api = match api.as_str() {
            "messages" => Api::Messages,
            "responses" => Api::Responses,
            "completions" => Api::Completions,
            _ => Api::Chat,
        };
        let Ok(b) = std::fs::read(path) else { return };
        let run = || {
            let mut fetch = |s: usize, l: usize| b.get(s..s + l).map(<[u8]>::to_vec);
            black_box(decide_on(&cfg, &pools, api, &headers, b.len(), &mut fetch));
        };
        for _ in 0..500 {
            run();
        }
        // `--cold`: 8 MiB of other memory written before each timed decision
        // (untimed), as a proxy's own work between two requests evicts the
        // caches: the decision as it runs inside a busy Envoy, not in a hot loop.
        let cold = args.iter().any(|a| a == "--cold");
        let mut other = vec![0u8; if cold { 8 << 20 } else { 0 }];
        let mut t: Vec<f64> = (0..500)
            .map(|k| {
                for x in other.iter_mut().step_by(64) {
                    *x = x.wrapping_add(k as u8);
                }
                black_box(&other);
                let s = Instant::now();
                run();
                s.elapsed().as_secs_f64()
            })
            .collect();
        t.sort_by(f64::total_cmp);
        println!(
            "{path}: {} bytes, decide {:.1} µs{}",
            b.len(),
            t[t.len() / 2] * 1e6,
            if cold { " (cold caches)" } else { "" }
        );
        return;
    }
    // `--phases`: where the 400 KB decision spends its time.
    if std::env::args().any(|a| a == "--phases") {
        for api in [Api::Messages, Api::Chat] {
            let b = body(api, 400_000);
            let mut fetch = |s: usize, l: usize| b.get(s..s + l).map(<[u8]>::to_vec);
            let read = median(2000, || {
                black_box(scan::read_doc(api, b.len(), ReadLimits::default(), &mut fetch).ok());
            });
            let Ok((view, doc, stats)) =
                scan::read_doc(api, b.len(), ReadLimits::default(), &mut fetch)
            else {
                return;
            };
            if let Some(scan::Conv::Array { first, last, .. }) = &doc.conv {
                let size =
                    |v: &[tether_filter::json::Span]| v.iter().map(|s| s.len()).sum::<usize>();
                println!(
                    "{}: {stats:?}; first {} elems {} B, last {} elems {} B",
                    api.name(),
                    first.len(),
                    size(first),
                    last.len(),
                    size(last)
                );
            }
            let head = median(2000, || {
                black_box(tether_filter::read::head::head_hash(api, &doc, &view));
            });
            let h = tether_filter::read::head::head_hash(api, &doc, &view);
            let ident = median(2000, || {
                let body = tether_filter::read::identity::BodyRef {
                    doc: &doc,
                    view: &view,
                    head: h,
                };
                black_box(tether_filter::read::identity::resolve(
                    &cfg,
                    &headers,
                    Some(body),
                ));
            });
            let turn = median(2000, || {
                black_box(tether_filter::read::turn::classify(
                    api,
                    &doc,
                    &view,
                    &cfg.subagent_tools,
                    false,
                ));
            });
            println!(
                "{}: read_doc {:.1} µs, head {:.1} µs, identity {:.1} µs, turn {:.1} µs",
                api.name(),
                read * 1e6,
                head * 1e6,
                ident * 1e6,
                turn * 1e6
            );
        }
        return;
    }
    // Warm-up: V8 compiles wasm with a baseline tier first and optimizes hot
    // functions later; a long-running Envoy only ever runs the optimized code.
    for api in [Api::Messages, Api::Chat] {
        for target in [4_000usize, 30_000, 400_000] {
            let b = body(api, target);
            for _ in 0..300 {
                let mut fetch = |s: usize, l: usize| b.get(s..s + l).map(<[u8]>::to_vec);
                black_box(decide_on(&cfg, &pools, api, &headers, b.len(), &mut fetch));
                black_box(scan::scan_full(black_box(&b), api).ok());
            }
        }
    }
    println!(
        "{:<10} {:>9} {:>10} {:>12} {:>12} {:>12} {:>10} {:>9}",
        "api", "bytes", "full GB/s", "full µs", "decide µs", "serde µs", "fetched", "serde/dec"
    );
    for api in [Api::Messages, Api::Chat] {
        for target in [4_000usize, 30_000, 400_000, 4_000_000] {
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
                black_box(decide_on(&cfg, &pools, api, &headers, b.len(), &mut fetch));
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
