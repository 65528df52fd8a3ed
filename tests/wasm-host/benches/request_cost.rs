//! Per-request cost of filters in the harness, side by side in one run: the
//! header path (no body) and the body path at 4 KB / 400 KB / 4 MB, as
//! wasmtime fuel (≈ wasm operators executed, host-independent) and as wall
//! time per request (median of repeated runs, unmetered engine).
//!
//! Run: `make bench-host` or
//! `cargo bench -p tether-wasm-host --bench request_cost [-- <module.wasm> <config-json> <label>]...`
//! With no arguments it measures the floor filter (header and body modes) and,
//! if built, the tether filter (`TETHER_FILTER_WASM`, configuration from
//! `TETHER_BENCH_CONFIG`, default `{}`).

use std::time::{Duration, Instant};
use tether_wasm_host::{HostOptions, Plugin, Request};

struct Subject {
    label: String,
    module: Vec<u8>,
    config: String,
}

/// A chat-completions body of about `size` bytes: many turns, identity at the end.
fn body(size: usize) -> Vec<u8> {
    let mut s = String::from(
        r#"{"model":"m","messages":[{"role":"system","content":"You are a coding agent."}"#,
    );
    let mut i = 0;
    while s.len() + 200 < size {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        s.push_str(&format!(
            r#",{{"role":"{role}","content":"turn {i}: please look at src/lib.rs line {i} and explain \"why\" it fails \\n with context"}}"#
        ));
        i += 1;
    }
    s.push_str(r#"],"metadata":{"session_id":"bench-session"},"user":"u1"}"#);
    s.into_bytes()
}

fn request(body: Option<&[u8]>) -> Request {
    match body {
        None => {
            let mut r = Request::post(
                "/v1/chat/completions",
                &[("x-session-id", "bench-session")],
                &[],
            );
            r.headers.replace(b":method", b"GET");
            r
        }
        Some(b) => Request {
            body_chunks: Request::chunked(b, 64 * 1024),
            ..Request::post(
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                &[],
            )
        },
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn measure(subject: &Subject, name: &str, req: &Request, body_len: usize) -> Result<(), String> {
    let opts = || HostOptions {
        plugin_config: subject.config.clone().into_bytes(),
        ..HostOptions::default()
    };
    let metered = Plugin::new(&subject.module, true).map_err(|e| e.to_string())?;
    let mut vm = metered.start(opts()).map_err(|e| e.to_string())?;
    let out = vm.run(req).map_err(|e| e.to_string())?;
    let fuel: u64 = out.fuel.values().sum();
    let plain = Plugin::new(&subject.module, false).map_err(|e| e.to_string())?;
    let mut vm = plain.start(opts()).map_err(|e| e.to_string())?;
    let iters = if body_len > 1_000_000 {
        30
    } else if body_len > 100_000 {
        100
    } else {
        2000
    };
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        vm.run(req).map_err(|e| e.to_string())?;
        times.push(t.elapsed());
    }
    let med = median(times);
    let rate = if body_len > 0 {
        format!("{:8.2} GB/s", body_len as f64 / med.as_secs_f64() / 1e9)
    } else {
        "      -     ".into()
    };
    println!(
        "{:<28} {:<12} {:>14} fuel {:>10.1} µs/request {}  ({} fuel/byte)",
        subject.label,
        name,
        fuel,
        med.as_secs_f64() * 1e6,
        rate,
        if body_len > 0 {
            format!("{:.2}", fuel as f64 / body_len as f64)
        } else {
            "-".into()
        }
    );
    Ok(())
}

fn subjects() -> Vec<Subject> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.len() >= 3 {
        return args
            .chunks(3)
            .filter(|c| c.len() == 3)
            .filter_map(|c| {
                Some(Subject {
                    label: c[2].clone(),
                    module: std::fs::read(&c[0]).ok()?,
                    config: c[1].clone(),
                })
            })
            .collect();
    }
    let mut out = Vec::new();
    if let Ok(path) = tether_wasm_host::module_path("TETHER_FLOOR_WASM", "tether_floor_filter.wasm")
    {
        let module = std::fs::read(path).unwrap_or_default();
        out.push(Subject {
            label: "floor header".into(),
            module: module.clone(),
            config: r#"{"mode":"header"}"#.into(),
        });
        out.push(Subject {
            label: "floor body".into(),
            module,
            config: r#"{"mode":"body","dst":"127.0.0.1:9000"}"#.into(),
        });
    } else {
        eprintln!("floor filter not built: run `make wasm`");
    }
    match tether_wasm_host::module_path("TETHER_FILTER_WASM", "tether_filter.wasm") {
        Ok(path) => out.push(Subject {
            label: "tether".into(),
            module: std::fs::read(path).unwrap_or_default(),
            config: std::env::var("TETHER_BENCH_CONFIG").unwrap_or_else(|_| "{}".into()),
        }),
        Err(e) => eprintln!("tether filter skipped: {e}"),
    }
    out
}

fn main() {
    let bodies = [
        ("header", None),
        ("body 4KB", Some(body(4 << 10))),
        ("body 400KB", Some(body(400 << 10))),
        ("body 4MB", Some(body(4 << 20))),
    ];
    for subject in subjects() {
        for (name, b) in &bodies {
            let req = request(b.as_deref());
            if let Err(e) = measure(&subject, name, &req, b.as_ref().map_or(0, Vec::len)) {
                println!("{:<28} {:<12} failed: {e}", subject.label, name);
            }
        }
    }
}
