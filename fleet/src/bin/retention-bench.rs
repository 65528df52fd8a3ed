//! Policy benchmark: avoidable re-prefill on a multi-turn trace under (a) plain LRU prefix
//! caching, (b) interval retention on the device tier, (c) retention + host tier — one run,
//! the same policy code for all three.
//!
//! The trace is any format `tether trace import` reads (`--format`, default: a
//! tether trace, or a Mooncake file whose conversations are derived as
//! `docs/trace-format.md` says). It prints its own verdict against the target:
//! retention + host tier must leave at least 5× less avoidable re-prefill than LRU.
//!
//! Run: `cargo run --release -p tether-fleet --bin retention-bench -- --trace examples/traces/mooncake_synthetic_trace.jsonl --format mooncake`

use anyhow::Result;
use clap::Parser;
use std::time::Instant;
use tether_engine::PolicyConfig;
use tether_fleet::import::{Format, ImportOptions, import, mooncake};
use tether_fleet::sim::{SimReport, replay};

/// The benchmark's target: LRU's avoidable re-prefill ÷ retention + host's.
const TARGET_RATIO: f64 = 5.0;

#[derive(Parser, Debug)]
#[command(about = "Avoidable re-prefill: LRU vs retention vs retention + host tier")]
struct Args {
    /// The trace.
    #[arg(long)]
    trace: std::path::PathBuf,
    /// Its format: tether, mooncake, bailian or agentx.
    #[arg(long, default_value = "tether", value_parser = Format::parse)]
    format: Format,
    /// Ranks the sessions are spread over.
    #[arg(long, default_value_t = 8)]
    ranks: usize,
    /// Device KV capacity per rank, in tokens.
    #[arg(long, default_value_t = 512 * 1024)]
    device_tokens: usize,
    /// Host tier size as a multiple of the device capacity.
    #[arg(long, default_value_t = 4.0)]
    host_factor: f64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// KV bytes per token (Llama-3.1-8B bf16: 131072).
    #[arg(long, default_value_t = 131_072)]
    bytes_per_token: u64,
    /// Linear-state snapshot bytes (0 = attention-only model).
    #[arg(long, default_value_t = 0)]
    state_bytes: u64,
    /// Device slots for state snapshots when `--state-bytes` is set.
    #[arg(long, default_value_t = 4096)]
    state_slots: usize,
    /// Hybrid models: extra state checkpoints every this many tokens (0 = prompt end only).
    #[arg(long, default_value_t = 0)]
    checkpoint_tokens: usize,
    /// Import: a continuation within this many ms of its predecessor is a tool turn.
    #[arg(long, default_value_t = ImportOptions::default().tool_gap_ms)]
    tool_gap_ms: u64,
    /// Import (Mooncake): common-head fan-out of the conversation derivation.
    #[arg(long, default_value_t = ImportOptions::default().head_fanout)]
    head_fanout: u32,
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
    let device_blocks = a.device_tokens / a.block_size;
    let block_bytes = a.bytes_per_token * a.block_size as u64;
    let base = PolicyConfig {
        block_size: a.block_size,
        device_blocks,
        block_bytes,
        state_bytes: a.state_bytes,
        device_state_slots: if a.state_bytes > 0 { a.state_slots } else { 0 },
        checkpoint_every_tokens: a.checkpoint_tokens,
        ..PolicyConfig::default()
    };
    let host = (device_blocks as f64 * block_bytes as f64 * a.host_factor) as u64;
    let modes = [
        (
            "(a) LRU prefix cache",
            PolicyConfig {
                retention: false,
                host_bytes: 0,
                ..base.clone()
            },
        ),
        (
            "(b) retention, device",
            PolicyConfig {
                retention: true,
                host_bytes: 0,
                ..base.clone()
            },
        ),
        (
            "(c) retention + host",
            PolicyConfig {
                retention: true,
                host_bytes: host,
                ..base.clone()
            },
        ),
    ];
    println!(
        "trace {}: {} requests, {} sessions ({} agents), {} ranks, device {} tokens/rank, host {}x device, block {} tokens, state {} B",
        a.trace.display(),
        trace.requests().len(),
        trace.sessions().len(),
        trace.agents().len(),
        a.ranks,
        a.device_tokens,
        a.host_factor,
        a.block_size,
        a.state_bytes
    );
    let mut reports: Vec<(&str, SimReport, f64)> = Vec::new();
    for (name, cfg) in modes {
        let t0 = Instant::now();
        let r = replay(&trace, a.ranks, &cfg)?;
        reports.push((name, r, t0.elapsed().as_secs_f64()));
    }
    let lru = reports[0].1.avoidable_tokens;
    // LRU's avoidable re-prefill ÷ this mode's (inf when this mode has none).
    let ratio = |r: &SimReport| match (lru, r.avoidable_tokens) {
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
    for (name, r, secs) in &reports {
        println!(
            "{:<24} {:>12} {:>12} {:>12} {:>14} {:>9.1} {:>10} {:>9} {:>9} {:>8} {:>7.2}",
            name,
            r.prompt_tokens,
            r.reused_tokens,
            r.reusable_tokens,
            r.avoidable_tokens,
            ratio(r),
            r.restored_tokens,
            r.stats.offloaded,
            r.stats.dropped,
            r.stats.expired_dropped,
            secs
        );
    }
    for (name, r, _) in &reports {
        println!(
            "{name}: avoidable on returning turns {} tokens; host peak {:.1} GiB; rejected {}; restore misses {}",
            r.avoidable_returning_tokens,
            r.host_peak_bytes as f64 / (1u64 << 30) as f64,
            r.rejected,
            r.stats.restore_misses
        );
    }
    let shown = |x: f64| {
        if x.is_finite() {
            format!("{x:.1}x")
        } else {
            "inf (it leaves none)".to_owned()
        }
    };
    let host_ratio = ratio(&reports[2].1);
    let dev_ratio = ratio(&reports[1].1);
    if reports.iter().any(|(_, r, _)| r.rejected > 0) {
        println!(
            "warning: requests were rejected (a prompt larger than the device capacity): raise --device-tokens above the longest prompt"
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
        "verdict: avoidable re-prefill, LRU / (device-only retention) = {dev_ratio:.2}x (must not be worse than LRU, >= 1.0x): {}",
        if dev_ratio >= 1.0 { "MET" } else { "MISSED" }
    );
    Ok(())
}
