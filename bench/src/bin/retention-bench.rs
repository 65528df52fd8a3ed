//! Policy benchmark: avoidable re-prefill on a multi-turn trace under (a) plain LRU prefix
//! caching, (b) interval retention on the device tier, (c) retention + host tier — one run,
//! the same policy code for all three.
//!
//! Each configuration is a run of the fleet simulator (`tether_fleet::sim`): the trace's
//! requests at their arrival times, placed by the gateway's tether key, served by simulated
//! engines (`tether_rank_engine::engine`, continuous batching timed by a GPU profile) whose cache
//! is the real `RetentionCache`. The trace is any format `tether trace import` reads
//! (`--format`). It prints its own verdict against the target: retention + host tier must
//! leave at least 5x less avoidable re-prefill than LRU.
//!
//! With `--prefetch` it measures prefetch in tool gaps instead: retention + host
//! tier without and with prefetch on the same trace, side by side, on the turns
//! whose state the run without prefetch restored from the host tier (TTFT p50/p90,
//! recomputed tokens; target: p50 at least 30 % lower, no extra recompute).
//!
//! Run: `cargo run --release -p tether-bench --bin retention-bench -- --trace examples/traces/mooncake_synthetic_trace.jsonl --format mooncake`

use anyhow::Result;
use clap::Parser;
use std::collections::HashSet;
use std::path::PathBuf;
use tether_fleet::import::{Format, ImportOptions, import, mooncake};
use tether_fleet::quantile;
use tether_fleet::report::{Observation, Served};
use tether_fleet::sim::config::HybridOptions;
use tether_fleet::sim::report::RetentionSummary;
use tether_fleet::sim::{
    CacheMode, FleetShape, Policy, RunOutput, RunReport, SimConfig, oracle_hits, simulate,
};
use tether_rank_engine::engine::EngineSettings;
use tether_rank_engine::profile::Profile;
use tether_wire::TurnKind;

/// The benchmark's target: LRU's avoidable re-prefill ÷ retention + host's.
const TARGET_RATIO: f64 = 5.0;

/// The prefetch target: TTFT p50 on returning host-tier turns at most this share
/// of the run without prefetch (≥ 30 % lower).
const PREFETCH_TARGET: f64 = 0.7;

#[derive(Parser, Debug)]
#[command(about = "Avoidable re-prefill: LRU vs retention vs retention + host tier")]
struct Args {
    /// The trace.
    #[arg(long)]
    trace: PathBuf,
    /// Its format: tether, mooncake, bailian or agentx.
    #[arg(long, default_value = "tether", value_parser = Format::parse)]
    format: Format,
    /// GPU profile timing the ranks (its KV bytes per token size blocks and the host tier).
    #[arg(
        long,
        default_value = "examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"
    )]
    profile: PathBuf,
    /// Ranks the sessions are spread over.
    #[arg(long, default_value_t = 8)]
    ranks: usize,
    /// Device KV capacity per rank, in tokens.
    #[arg(long, default_value_t = 512 * 1024)]
    device_tokens: u64,
    /// Host tier size as a multiple of the device capacity.
    #[arg(long, default_value_t = 4.0)]
    host_factor: f64,
    /// Tokens per KV block (must divide the trace's block size).
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Linear-state snapshot bytes, paid from the device KV budget (0 = the profile's
    /// `hybrid.state_bytes`; attention-only when it has none).
    #[arg(long, default_value_t = 0)]
    state_bytes: u64,
    /// Hybrid models: tokens between the boundaries a snapshot can be taken at, a
    /// multiple of `--block-size` (0 = the profile's `hybrid.align_tokens`, else every block).
    #[arg(long, default_value_t = 0)]
    state_align_tokens: usize,
    /// Hybrid models: extra state checkpoints every this many tokens (0 = prompt end only).
    #[arg(long, default_value_t = 0)]
    checkpoint_tokens: usize,
    /// Import: a continuation within this many ms of its predecessor is a tool turn.
    #[arg(long, default_value_t = ImportOptions::default().tool_gap_ms)]
    tool_gap_ms: u64,
    /// Import (Mooncake): common-head fan-out of the conversation derivation.
    #[arg(long, default_value_t = ImportOptions::default().head_fanout)]
    head_fanout: u32,
    /// Measure prefetch in tool gaps instead: retention + host tier without and
    /// with prefetch, side by side.
    #[arg(long)]
    prefetch: bool,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let opts = ImportOptions {
        tool_gap_ms: a.tool_gap_ms,
        head_fanout: a.head_fanout,
        ..ImportOptions::default()
    };
    let trace = import(a.format, &a.trace, &opts)?;
    if let Some(d) = mooncake::derivation_of(&trace) {
        println!("{d}");
    }
    let profile = Profile::from_file(&a.profile)?;
    let device_bytes = a.device_tokens as f64 * profile.kv_bytes_per_token as f64;
    let base = SimConfig {
        policy: Policy::Tether,
        fleet: FleetShape::aggregated(a.ranks),
        engine: EngineSettings {
            block_size: a.block_size,
            device_kv_tokens: Some(a.device_tokens),
            ..EngineSettings::default()
        },
        host_bytes: (device_bytes * a.host_factor) as u64,
        track_reusable: true,
        hybrid: HybridOptions {
            state_bytes: a.state_bytes,
            align_tokens: a.state_align_tokens,
            checkpoint_tokens: a.checkpoint_tokens,
        },
        ..SimConfig::default()
    };
    let state = profile.hybrid.map_or(0, |h| h.state_bytes);
    let state = if a.state_bytes > 0 {
        a.state_bytes
    } else {
        state
    };
    println!(
        "trace {}: {} requests, {} sessions ({} agents), {} ranks ({}), device {} tokens/rank, host {}x device, block {} tokens, state {} B",
        a.trace.display(),
        trace.requests().len(),
        trace.sessions().len(),
        trace.agents().len(),
        a.ranks,
        profile.name,
        a.device_tokens,
        a.host_factor,
        a.block_size,
        state
    );
    let oracle = oracle_hits(&trace, a.block_size);
    if a.prefetch {
        return prefetch_side_by_side(&trace, &profile, &base, &oracle);
    }
    let names = [
        "(a) LRU prefix cache",
        "(b) retention, device",
        "(c) retention + host",
    ];
    let mut reports: Vec<RunReport> = Vec::new();
    for cache in CacheMode::ALL {
        let cfg = SimConfig {
            cache,
            ..base.clone()
        };
        reports.push(simulate(&trace, &profile, &cfg, &oracle, false, None)?.report);
    }
    let avoidable = |r: &RunReport| r.sim.avoidable_tokens.unwrap_or(0);
    let lru = avoidable(&reports[0]);
    // LRU's avoidable re-prefill ÷ this mode's (inf when this mode has none).
    let ratio = |r: &RunReport| match (lru, avoidable(r)) {
        (0, 0) => 1.0,
        (_, 0) => f64::INFINITY,
        (l, a) => l as f64 / a as f64,
    };
    println!(
        "{:<24} {:>12} {:>12} {:>12} {:>14} {:>9} {:>10} {:>9} {:>9} {:>8} {:>7}",
        "mode",
        "prompt tok",
        "reused tok",
        "reusable",
        "avoidable tok",
        "LRU/this",
        "restored",
        "offload",
        "dropped",
        "expired",
        "secs"
    );
    for (name, r) in names.iter().zip(&reports) {
        println!(
            "{:<24} {:>12} {:>12} {:>12} {:>14} {:>9.1} {:>10} {:>9} {:>9} {:>8} {:>7.2}",
            name,
            r.prompt_tokens,
            r.hit_tokens,
            r.sim.reusable_tokens.unwrap_or(0),
            avoidable(r),
            ratio(r),
            r.sim.retention.restored_tokens,
            r.sim.retention.offloaded,
            r.sim.retention.dropped,
            r.sim.retention.expired,
            r.wall_s
        );
    }
    for (name, r) in names.iter().zip(&reports) {
        println!(
            "{name}: avoidable on returning turns {} tokens; host peak {:.1} GiB; refused {} ({} over max_model_len); TTFT p50 {:.1} ms p99 {:.1} ms",
            r.sim.avoidable_returning_tokens.unwrap_or(0),
            r.sim.retention.host_peak_bytes as f64 / (1u64 << 30) as f64,
            r.sim.refused + r.sim.failed,
            r.sim.too_long,
            r.ttft_ms.p50,
            r.ttft_ms.p99
        );
    }
    print_host_usage(&reports[2].sim.retention);
    let shown = |x: f64| {
        if x.is_finite() {
            format!("{x:.1}x")
        } else {
            "inf (it leaves none)".to_owned()
        }
    };
    let host_ratio = ratio(&reports[2]);
    let dev_ratio = ratio(&reports[1]);
    if reports.iter().any(|r| r.sim.refused > r.sim.too_long) {
        println!(
            "warning: requests were refused (a prompt larger than the device capacity): raise --device-tokens above the longest prompt"
        );
    }
    if let Some(r) = reports.iter().find(|r| r.sim.too_long > 0) {
        println!(
            "note: {} requests are longer than the profile's max_model_len (prompt + output) and were refused, as tether-rank refuses them",
            r.sim.too_long
        );
    }
    println!(
        "verdict: avoidable re-prefill, LRU / (retention + host) = {} (target >= {TARGET_RATIO}x): {}",
        shown(host_ratio),
        if host_ratio >= TARGET_RATIO {
            "MET"
        } else {
            "MISSED"
        }
    );
    println!(
        "verdict: avoidable re-prefill, LRU / (device-only retention) = {dev_ratio:.3}x (must not be worse than LRU, >= 1.0x): {}",
        if dev_ratio >= 1.0 { "MET" } else { "MISSED" }
    );
    Ok(())
}

/// Where retention + host's host tiers spent their bytes: every offloaded record's
/// written bytes by how it ended and whether any request restored from it.
fn print_host_usage(r: &RetentionSummary) {
    let u = &r.host_usage;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let w = u.written;
    let share = |b: u64| {
        if w.bytes > 0 {
            100.0 * b as f64 / w.bytes as f64
        } else {
            0.0
        }
    };
    println!(
        "(c) host tier: {} records offloaded ({} snapshots), {:.1} GiB written; restored from: {} records ({:.1} % of the bytes)",
        w.records,
        u.states_written,
        gib(w.bytes),
        u.used().records,
        share(u.used().bytes)
    );
    for (name, t) in u.rows().iter().filter(|(_, t)| t.records > 0) {
        println!(
            "    {name:<24} {:>7} records {:>9.1} GiB {:>5.1} %",
            t.records,
            gib(t.bytes),
            share(t.bytes)
        );
    }
}

/// Retention + host tier without and with prefetch, on the same trace; figures on
/// the turns the run without prefetch served by a restore from the host tier — all
/// of them, and those returning to a `tool` or `handoff` prompt end (the turns
/// prefetch is for; a `user` or `first` prompt end waits on a human and is not
/// prefetched).
fn prefetch_side_by_side(
    trace: &tether_fleet::trace::Trace,
    profile: &Profile,
    base: &SimConfig,
    oracle: &[u32],
) -> Result<()> {
    let mut runs = Vec::new();
    for prefetch in [false, true] {
        let mut cfg = SimConfig {
            cache: CacheMode::RetentionHost,
            ..base.clone()
        };
        cfg.engine.prefetch = prefetch;
        runs.push(simulate(trace, profile, &cfg, oracle, true, None)?);
    }
    let on_host: HashSet<u32> = runs[0]
        .records
        .iter()
        .filter_map(served)
        .filter(|(_, s)| s.restored_tokens.unwrap_or(0) > 0)
        .map(|(r, _)| r)
        .collect();
    // Requests whose agent's previous prompt end was a tool result or a handoff.
    let mut after_tool = HashSet::new();
    for a in trace.agents() {
        for w in a.requests.windows(2) {
            let prev = &trace.requests()[w[0].0 as usize];
            if matches!(prev.opened_by, TurnKind::Tool | TurnKind::Handoff) {
                after_tool.insert(w[1].0);
            }
        }
    }
    let tool_set: HashSet<u32> = on_host.intersection(&after_tool).copied().collect();
    println!(
        "returning turns whose state was on the host tier (restored in the run without prefetch): {}, of which {} after a tool/handoff prompt end",
        on_host.len(),
        tool_set.len()
    );
    println!(
        "{:<38} {:>11} {:>11} {:>13} {:>12} {:>14}",
        "retention + host", "TTFT p50", "TTFT p90", "restored tok", "recomputed", "recomputed all"
    );
    let mut verdicts = Vec::new();
    for (label, set) in [("all", &on_host), ("after tool/handoff", &tool_set)] {
        let rows: Vec<Turns> = runs.iter().map(|o| Turns::of(o, set)).collect();
        for (name, t) in ["without prefetch", "with prefetch"].iter().zip(&rows) {
            println!(
                "{:<38} {:>8.1} ms {:>8.1} ms {:>13} {:>12} {:>14}",
                format!("{name}, {label}"),
                t.p50,
                t.p90,
                t.restored,
                t.recomputed,
                t.recomputed_all
            );
        }
        verdicts.push((label, rows));
    }
    for (name, out) in ["without prefetch", "with prefetch"].iter().zip(&runs) {
        let r = &out.report.sim.retention;
        println!(
            "{name}: prefetched {} (used {}, wasted {}), offloaded {}, dropped {}; {:.2} s",
            r.prefetched,
            r.prefetch_used,
            r.prefetch_wasted,
            r.offloaded,
            r.dropped,
            out.report.wall_s
        );
    }
    for (label, rows) in &verdicts {
        let ratio = if rows[0].p50 > 0.0 {
            rows[1].p50 / rows[0].p50
        } else {
            1.0
        };
        println!(
            "verdict ({label}): TTFT p50 with / without prefetch = {ratio:.3} ({:.1} % lower; target >= 30 % lower): {}",
            (1.0 - ratio) * 100.0,
            if ratio <= PREFETCH_TARGET {
                "MET"
            } else {
                "MISSED"
            }
        );
        let no_extra = rows[1].recomputed <= rows[0].recomputed;
        println!(
            "verdict ({label}): recomputed tokens on those turns with prefetch {} vs without {} (no extra allowed): {}",
            rows[1].recomputed,
            rows[0].recomputed,
            if no_extra { "MET" } else { "MISSED" }
        );
    }
    let all = |i: usize| runs[i].report.computed_tokens;
    println!(
        "verdict (every request): recomputed tokens with prefetch {} vs without {} (no extra allowed): {}",
        all(1),
        all(0),
        if all(1) <= all(0) { "MET" } else { "MISSED" }
    );
    Ok(())
}

/// A served observation with its trace request index.
fn served(o: &Observation) -> Option<(u32, Served)> {
    o.served().map(|s| (o.request, s.clone()))
}

/// TTFT and tokens of one run on a set of requests.
struct Turns {
    p50: f64,
    p90: f64,
    restored: u64,
    recomputed: u64,
    recomputed_all: u64,
}

impl Turns {
    fn of(out: &RunOutput, set: &HashSet<u32>) -> Self {
        let mut ttft = Vec::new();
        let (mut restored, mut recomputed) = (0, 0);
        for (_, s) in out
            .records
            .iter()
            .filter_map(served)
            .filter(|(r, _)| set.contains(r))
        {
            ttft.push(s.timing.ttft_ms);
            restored += s.restored_tokens.unwrap_or(0);
            recomputed += s.prompt_tokens - s.cached_tokens;
        }
        let t = quantile::sorted(ttft);
        let q = |x| quantile::nearest_rank(&t, x).unwrap_or(0.0);
        Self {
            p50: q(0.5),
            p90: q(0.9),
            restored,
            recomputed,
            recomputed_all: out.report.computed_tokens,
        }
    }
}
