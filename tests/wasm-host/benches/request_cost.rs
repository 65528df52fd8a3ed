//! Per-request cost of filters in the harness, side by side in one run: the
//! header path (no body) and the body path at 4 KB / 400 KB / 4 MB (plus 4 MB
//! with the identity field truly in the middle), as wasmtime fuel (≈ wasm
//! operators executed, host-independent), as wall time per request and as
//! time spent inside the module (median of repeated runs, unmetered engine).
//! The tether filter also gets the 4 KB and 400 KB bodies gzip- and
//! zstd-compressed (`content-encoding`), beside the same bodies plain; their
//! fuel/B and GB/s are per byte of the decoded body.
//!
//! Run: `make bench-host` or
//! `cargo bench -p tether-wasm-host --bench request_cost [-- <module.wasm> <config-json> <label>]...`
//! With no arguments it measures the floor filter (header and body modes) and,
//! if built, the tether filter (`TETHER_FILTER_WASM`, configuration from
//! `TETHER_BENCH_CONFIG`, default `{}`).
//!
//! A configuration with `load` is measured on a fresh view: the VM's first
//! tick polls every endpoint and each poll is answered with an idle report
//! whose residency summary lists [`PRIMED_ENTRIES`] keys, the bench session's
//! among them — so `load` and `residency` place on a full view, as in a fleet.

use std::time::{Duration, Instant};
use tether_placement::keys::{session_hash, tenant_hash};
use tether_placement::{Held, Resident, resident_key};
use tether_wasm_host::{FilterVm, HeaderMap, HostOptions, HttpCallResponse, Plugin, Request};

/// Residency entries per endpoint in a primed view (10,000 retained sessions).
const PRIMED_ENTRIES: u64 = 10_000;

/// Answers the VM's first polls (see the module docs); nothing without `load`.
fn prime(vm: &mut FilterVm, config: &str) -> Result<(), String> {
    if !config.contains("\"load\"") {
        return Ok(());
    }
    let bench = resident_key(
        u128::from(tenant_hash(b"")),
        u128::from(session_hash(b"", b"bench-session")),
        0,
    );
    let keys = (0..PRIMED_ENTRIES - 1)
        .map(|i| tether_placement::hash_parts(&[b"bench", &i.to_le_bytes()]))
        .chain([bench]);
    let held = keys.map(|k| {
        (
            k,
            Held {
                tokens: 4096,
                device: true,
            },
        )
    });
    let summary = Resident::from_entries(held, usize::MAX).0.encode(0);
    let body = serde_json::json!({"server_load": 0, "sim_ms": 1.0, "speedup": 1.0,
        "ranks": [{"dp_rank": 0, "running": 0, "waiting": 0, "restoring": 0,
                   "queued_prefill_tokens": 0, "kv_usage": 0.0, "kv_blocks": 10, "retentions": 0}],
        "residency": summary})
    .to_string()
    .into_bytes();
    vm.tick().map_err(|e| e.to_string())?;
    let tokens: Vec<u32> = vm.state().http_calls.iter().map(|c| c.token).collect();
    for t in tokens {
        let reply = HttpCallResponse {
            headers: HeaderMap::from_pairs([(":status", "200")]),
            body: body.clone(),
            ..HttpCallResponse::default()
        };
        vm.respond_http_call(t, reply).map_err(|e| e.to_string())?;
    }
    vm.tick().map_err(|e| e.to_string())?;
    Ok(())
}

struct Subject {
    label: String,
    module: Vec<u8>,
    config: String,
}

fn conversation(size: usize) -> String {
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
    s
}

/// A chat-completions body of about `size` bytes: many turns, identity at the end.
fn body(size: usize) -> Vec<u8> {
    let mut s = conversation(size);
    s.push_str(r#"],"metadata":{"session_id":"bench-session"},"user":"u1"}"#);
    s.into_bytes()
}

/// The identity field truly in the middle: half the bytes in `messages`
/// before it, half in a `tools` array after it (forces a full scan).
fn body_mid(size: usize) -> Vec<u8> {
    let mut s = conversation(size / 2);
    s.push_str(r#"],"session_id":"bench-session","tools":["#);
    let tool = r#"{"type":"function","function":{"name":"read_file","description":"Read a file \"path\" from the repo","parameters":{"type":"object"}}}"#;
    let mut first = true;
    while s.len() + tool.len() + 4 < size {
        if !first {
            s.push(',');
        }
        first = false;
        s.push_str(tool);
    }
    s.push_str("]}");
    s.into_bytes()
}

/// `body` compressed with `content-encoding: enc` (`gzip` or `zstd`).
fn compress(enc: &str, body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    if enc == "zstd" {
        return ruzstd::encoding::compress_to_vec(
            body,
            ruzstd::encoding::CompressionLevel::Fastest,
        );
    }
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

fn request(body: Option<&[u8]>, enc: Option<&str>) -> Request {
    if let (Some(b), Some(enc)) = (body, enc) {
        return Request {
            body_chunks: Request::chunked(&compress(enc, b), 64 * 1024),
            ..Request::post(
                CHAT,
                &[
                    ("content-type", "application/json"),
                    ("content-encoding", enc),
                ],
                &[],
            )
        };
    }
    match body {
        None => {
            let mut r = Request::post(CHAT, &[("x-session-id", "bench-session")], &[]);
            r.headers.replace(b":method", b"GET");
            r
        }
        Some(b) => Request {
            body_chunks: Request::chunked(b, 64 * 1024),
            ..Request::post(CHAT, &[("content-type", "application/json")], &[])
        },
    }
}

const CHAT: &str = "/v1/chat/completions";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn measure(
    metered: &Plugin,
    plain: &Plugin,
    config: &str,
    req: &Request,
    body_len: usize,
) -> Result<(String, f64), String> {
    let opts = || HostOptions {
        plugin_config: config.as_bytes().to_vec(),
        ..HostOptions::default()
    };
    let mut vm = metered.start(opts()).map_err(|e| e.to_string())?;
    prime(&mut vm, config)?;
    let out = vm.run(req).map_err(|e| e.to_string())?;
    let fuel: u64 = out.fuel.values().sum();
    let mut vm = plain.start(opts()).map_err(|e| e.to_string())?;
    prime(&mut vm, config)?;
    let iters = if body_len > 1_000_000 {
        30
    } else if body_len > 100_000 {
        200
    } else {
        2000
    };
    let mut times = Vec::with_capacity(iters);
    let mut in_wasm = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let out = vm.run(req).map_err(|e| e.to_string())?;
        times.push(t.elapsed());
        in_wasm.push(Duration::from_nanos(out.wasm_nanos));
    }
    let (med, wasm) = (median(times), median(in_wasm));
    let (per_byte, rate) = if body_len > 0 {
        (
            format!("{:6.3}", fuel as f64 / body_len as f64),
            format!("{:7.2}", body_len as f64 / wasm.as_secs_f64() / 1e9),
        )
    } else {
        ("     -".into(), "      -".into())
    };
    Ok((
        format!(
            "{fuel:>9} {per_byte} {:>10.1} {:>10.1} {rate}",
            med.as_secs_f64() * 1e6,
            wasm.as_secs_f64() * 1e6
        ),
        body_len as f64 / wasm.as_secs_f64() / 1e9,
    ))
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
        ("header", None, None),
        ("body 4KB", Some(body(4 << 10)), None),
        ("gzip 4KB", Some(body(4 << 10)), Some("gzip")),
        ("zstd 4KB", Some(body(4 << 10)), Some("zstd")),
        ("body 400KB", Some(body(400 << 10)), None),
        ("gzip 400KB", Some(body(400 << 10)), Some("gzip")),
        ("zstd 400KB", Some(body(400 << 10)), Some("zstd")),
        ("body 4MB", Some(body(4 << 20)), None),
        (MID, Some(body_mid(4 << 20)), None),
    ];
    println!(
        "{:<13} {:<13} {:>9} {:>6} {:>10} {:>10} {:>7}",
        "filter", "request", "fuel", "fuel/B", "µs/req", "µs wasm", "GB/s*"
    );
    let mut verdicts = Vec::new();
    for subject in subjects() {
        let plugins = Plugin::new(&subject.module, true)
            .and_then(|m| Ok((m, Plugin::new(&subject.module, false)?)));
        let (metered, plain) = match plugins {
            Ok(p) => p,
            Err(e) => {
                println!("{:<13} failed to load: {e}", subject.label);
                continue;
            }
        };
        for (name, b, enc) in &bodies {
            // The floor filter does not decode: its compressed rows would say nothing.
            if enc.is_some() && subject.label.starts_with("floor") {
                continue;
            }
            let req = request(b.as_deref(), *enc);
            let line = match measure(
                &metered,
                &plain,
                &subject.config,
                &req,
                b.as_ref().map_or(0, Vec::len),
            ) {
                Ok((line, rate)) => {
                    if *name == MID && !subject.label.starts_with("floor") {
                        verdicts.push(scan_verdict(&subject.label, rate));
                    }
                    line
                }
                Err(e) => format!("failed: {e}"),
            };
            println!("{:<13} {:<13} {line}", subject.label, name);
        }
    }
    println!(
        "* body bytes per second of time inside the module (medians; µs/req includes the harness); gzip/zstd rows: per decoded byte"
    );
    for v in verdicts {
        println!("{v}");
    }
}

/// The row the body-scan target is judged on: 4 MB whose identity sits
/// between 2 MB of messages and 2 MB of small tool objects, so it is found
/// only by reading and scanning the whole body.
const MID: &str = "body 4MB mid";

/// Target: the full structural scan (the whole decision on the [`MID`] body,
/// ends tried first) at ≥ 1 GB/s of wasm time.
const SCAN_TARGET_GBPS: f64 = 1.0;

fn scan_verdict(label: &str, rate: f64) -> String {
    format!(
        "{}  {label}: full scan of structure-dense JSON (\"{MID}\") {rate:.2} GB/s in wasmtime, target ≥ {SCAN_TARGET_GBPS} GB/s",
        if rate >= SCAN_TARGET_GBPS {
            "PASS"
        } else {
            "MISS"
        }
    )
}
