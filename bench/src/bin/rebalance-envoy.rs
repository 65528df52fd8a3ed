//! Rebalancing in tool gaps through real Envoy (issue 27 part 2): the same
//! trace replayed through Envoy + the tether filter (pick mode, body path,
//! load + residency, `migrate: "pull"`) in front of `--ranks` real
//! `tether-rank` processes, without and with `--rebalance` on the ranks
//! (docs/rank.md "Rebalancing in tool gaps"), side by side in one run.
//!
//! Figures per setting — the Dynamo proposal's four (ai-dynamo/dynamo#12060,
//! BENCHMARKS.md "Rebalancing in tool gaps"): the P95 over time of the
//! busiest rank's device KV in use over the mean, minus 1 (every rank's
//! `/load` sampled every `--sample-ms` of wall time during the replay);
//! throughput (prompt + output tokens per engine busy second, the copies'
//! steps included); TTFT p99; the hit ratio (share of the shared cache's
//! hits) — plus saved prefill, busiest/mean busy time and the copies counted
//! by the ranks. Bodies carry the session in `metadata` (the body path: the
//! filter reads the turn kinds, so the ranks see `tool` prompt ends) and the
//! filter sends `x-tether-key`, which the ranks' rule needs.
//!
//! Run: `cargo run --release -p tether-bench --bin rebalance-envoy`

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tether_bench::root;
use tether_e2e::stack::{rank_args, replay_blocking};
use tether_e2e::{SimRank, Stack, StackSpec};
use tether_envoy::Mode;
use tether_fleet::cli::replay::write_report;
use tether_fleet::import::{Format, ImportOptions, import};
use tether_fleet::replay::assemble::Source;
use tether_fleet::replay::{Options, Route, Schedule};
use tether_fleet::synth::{Identity, SynthOptions};
use tether_fleet::trace::Trace;

#[derive(Parser, Debug)]
#[command(about = "rebalancing in tool gaps through Envoy, against none")]
struct Args {
    /// Bundled traces (examples/traces/<name>.jsonl), comma-separated.
    #[arg(
        long,
        default_value = "agent-subagents,agent-tenants",
        value_delimiter = ','
    )]
    traces: Vec<String>,
    /// Ranks behind the gateway.
    #[arg(long, default_value_t = 8)]
    ranks: usize,
    /// Trace time per wall time (the ranks run this many times faster too).
    #[arg(long, default_value_t = 20.0)]
    speedup: f64,
    /// Device KV tokens per rank (default: the profile's).
    #[arg(long)]
    kv_tokens: Option<u64>,
    /// The ranks poll each other every this many wall ms (`--peer-poll-ms`).
    #[arg(long, default_value_t = 50)]
    peer_poll_ms: u64,
    /// KV sampling period, wall ms.
    #[arg(long, default_value_t = 25)]
    sample_ms: u64,
    /// Pairs of runs per trace (verdicts on the medians).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Reports go here.
    #[arg(long, default_value = "target/rebalance-envoy")]
    out: PathBuf,
}

/// One setting's figures.
#[derive(Clone, Copy, Debug)]
struct Figures {
    kv_imbalance_p95: f64,
    tokens_per_busy_s: f64,
    ttft_p50: f64,
    ttft_p99: f64,
    hit: f64,
    saved: f64,
    busy_max_over_mean: f64,
}

/// Samples every rank's device KV in use until `stop`: per sample the
/// busiest over the mean, minus 1 (samples with no KV in use are skipped).
fn sample_kv(addrs: Vec<std::net::SocketAddr>, every: Duration, stop: Arc<AtomicBool>) -> Vec<f64> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let kv: Vec<f64> = addrs
            .iter()
            .filter_map(|a| {
                let (status, body) = tether_e2e::envoy::admin_get(*a, "/load").ok()?;
                let v: Value = serde_json::from_slice(&body)
                    .ok()
                    .filter(|_| status == 200)?;
                let ranks = v["ranks"].as_array()?;
                let n = ranks.len().max(1) as f64;
                Some(
                    ranks
                        .iter()
                        .filter_map(|r| r["kv_usage"].as_f64())
                        .sum::<f64>()
                        / n,
                )
            })
            .collect();
        let mean = kv.iter().sum::<f64>() / kv.len().max(1) as f64;
        if kv.len() == addrs.len() && mean > 0.0 {
            out.push(kv.iter().copied().fold(0.0, f64::max) / mean - 1.0);
        }
        std::thread::sleep(every);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn p95(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * 0.95).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The ranks' rebalancing counters, summed: `event n` each.
fn copies(ranks: &[SimRank]) -> String {
    let m: Vec<_> = ranks.iter().filter_map(|r| r.metrics().ok()).collect();
    [
        "copied",
        "copy_failed",
        "demoted",
        "adopted",
        "used",
        "unused",
        "late",
        "released",
        "forget_failed",
        "no_key",
    ]
    .iter()
    .map(|e| {
        let n: f64 = m
            .iter()
            .filter_map(|x| x.get("tether_rank_rebalance_total", &[("event", e)]))
            .sum();
        format!("{e} {n}")
    })
    .collect::<Vec<_>>()
    .join(", ")
}

fn run(
    a: &Args,
    name: &str,
    trace: &Arc<Trace>,
    source: &Source,
    rebalance: bool,
    rep: usize,
) -> Result<Figures> {
    let profile = tether_rank_engine::profile::Profile::from_json(&std::fs::read_to_string(
        root().join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"),
    )?)?;
    let kv_tokens = a.kv_tokens.unwrap_or(profile.max_kv_tokens);
    let host_gib = 4.0 * (kv_tokens * profile.kv_bytes_per_token) as f64 / f64::from(1u32 << 30);
    let mut spec = StackSpec::new(a.ranks, Mode::Pick, &[]);
    spec.rank_args = rank_args(a.speedup, "retention-host", kv_tokens, host_gib);
    if rebalance {
        spec.rank_args.extend([
            "--rebalance".to_owned(),
            "--peer-poll-ms".to_owned(),
            a.peer_poll_ms.to_string(),
        ]);
        spec.peers = true;
    }
    spec.concurrency = 2;
    // The view polled every 200 ms of trace time, as in resident-bench.
    let poll_ms = ((200.0 / a.speedup).round() as u64).max(10);
    if let Value::Object(m) = json!({"load": {"poll_ms": poll_ms}, "residency": {},
                                     "outputs": ["pick", "retain", "key"]})
    {
        spec.plugin_config = m;
    }
    let label = if rebalance { "rebalance" } else { "none" };
    let stack = Stack::start(&spec).with_context(|| format!("{name} / {label}: the stack"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (addrs, stop) = (
            stack.ranks.iter().map(SimRank::addr).collect(),
            stop.clone(),
        );
        let every = Duration::from_millis(a.sample_ms);
        std::thread::spawn(move || sample_kv(addrs, every, stop))
    };
    let opts = stack.options(Options {
        targets: Vec::new(),
        route: Route::Session,
        schedule: Schedule::Fixed,
        max_inflight: 512,
        speedup: Some(a.speedup),
        max_gap_ms: 10_000,
        synth: SynthOptions {
            identity: Identity::Metadata,
            ..Default::default()
        },
        timeout: Duration::from_secs(600),
        sessions: None,
        ranks: Vec::new(),
        gateway_admin: None,
        progress: false,
    });
    let replayed = replay_blocking(trace, source, &opts, label);
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap_or_default();
    let (r, out) = replayed?;
    // Saved prefill as resident-bench counts it: every prompt token not
    // computed (cached, restored or transferred).
    let metrics: Vec<_> = stack
        .ranks
        .iter()
        .filter_map(|k| k.metrics().ok())
        .collect();
    let computed: f64 = metrics
        .iter()
        .filter_map(|m| {
            m.get(
                "vllm:prompt_tokens_by_source_total",
                &[("source", "local_compute")],
            )
            .or(Some(0.0))
        })
        .sum();
    let prompt: u64 = out
        .observations
        .iter()
        .filter_map(|o| o.served())
        .map(|s| s.prompt_tokens)
        .sum();
    let output: u64 = out
        .observations
        .iter()
        .filter_map(|o| o.served())
        .map(|s| s.output_tokens)
        .sum();
    let saved = (1.0 - computed / (prompt as f64).max(1.0))
        / r.hit_ratio.ideal_global.max(f64::MIN_POSITIVE);
    let busy: Vec<f64> = r.load.engines.iter().filter_map(|e| e.busy_s).collect();
    let total_busy: f64 = busy.iter().sum();
    let mean = total_busy / busy.len().max(1) as f64;
    let f = Figures {
        kv_imbalance_p95: p95(samples.clone()),
        tokens_per_busy_s: (prompt + output) as f64 / total_busy.max(f64::MIN_POSITIVE),
        ttft_p50: r.latency.ttft_ms.p50,
        ttft_p99: r.latency.ttft_ms.p99,
        hit: r.hit_ratio.of_shared_cache,
        saved,
        busy_max_over_mean: busy.iter().copied().fold(0.0, f64::max) / mean.max(f64::MIN_POSITIVE),
    };
    let envoy = stack.envoy.prometheus().unwrap_or_default();
    let decisions: Vec<String> = ["stay", "least", "migrate", "recompute", "bounded", "unseen"]
        .iter()
        .map(|d| format!("{d} {}", envoy.sum(&format!("tether_residency_{d}"))))
        .collect();
    println!(
        "  {label:<9} KV imbalance p95 {:.3} ({} samples), {:.0} tokens per busy s, TTFT p50 {:.0} p99 {:.0} ms, {:.1} % of the shared cache's hits, saved prefill {:.1} %, busiest/mean busy {:.2}, errors {}",
        f.kv_imbalance_p95,
        samples.len(),
        f.tokens_per_busy_s,
        f.ttft_p50,
        f.ttft_p99,
        f.hit * 100.0,
        f.saved * 100.0,
        f.busy_max_over_mean,
        r.requests.errors
    );
    println!("            placement: {}", decisions.join(", "));
    println!("            copies: {}", copies(&stack.ranks));
    drop(stack);
    let dir = a.out.join(name).join(format!("{label}-{rep}"));
    write_report(&r, &out.observations, &dir)?;
    Ok(f)
}

fn main() -> Result<()> {
    let a = Args::parse();
    for t in &a.traces {
        let p = root().join(format!("examples/traces/{t}.jsonl"));
        let trace = Arc::new(import(Format::Tether, &p, &ImportOptions::default())?);
        let source = Source {
            path: p.display().to_string(),
            format: "tether".into(),
        };
        println!(
            "{t} through Envoy, {} ranks, {} requests at {}x:",
            a.ranks,
            trace.requests().len(),
            a.speedup
        );
        let mut pairs = Vec::new();
        for rep in 0..a.repeat.max(1) {
            let none = run(&a, t, &trace, &source, false, rep)?;
            let reb = run(&a, t, &trace, &source, true, rep)?;
            pairs.push((none, reb));
        }
        let med = |f: &dyn Fn(&(Figures, Figures)) -> f64| median(pairs.iter().map(f).collect());
        let lower = med(&|(n, r)| 1.0 - r.kv_imbalance_p95 / n.kv_imbalance_p95);
        let thr = med(&|(n, r)| r.tokens_per_busy_s / n.tokens_per_busy_s);
        let p99 = med(&|(n, r)| r.ttft_p99 / n.ttft_p99);
        let hit = med(&|(n, r)| (r.hit - n.hit) * 100.0);
        println!(
            "  medians of {} pairs: none KV imbalance p95 {:.3}, TTFT p99 {:.0} ms, hits {:.1} %; rebalance {:.3}, {:.0} ms, {:.1} %",
            pairs.len(),
            med(&|(n, _)| n.kv_imbalance_p95),
            med(&|(n, _)| n.ttft_p99),
            med(&|(n, _)| n.hit * 100.0),
            med(&|(_, r)| r.kv_imbalance_p95),
            med(&|(_, r)| r.ttft_p99),
            med(&|(_, r)| r.hit * 100.0),
        );
        let ok = |b: bool| if b { "MET" } else { "MISSED" };
        println!(
            "  rebalance vs none (medians of the pairs' ratios): KV imbalance p95 {:+.0} % ({}, target >= 20 % lower), throughput {:.3}x ({}, >= 0.98), TTFT p99 {:.3}x ({}, <= 1.05), hit ratio {:+.1} points ({}, >= -2)",
            -lower * 100.0,
            ok(lower >= 0.2),
            thr,
            ok(thr >= 0.98),
            p99,
            ok(p99 <= 1.05),
            hit,
            ok(hit >= -2.0)
        );
    }
    Ok(())
}
