//! What a run measured: cache hits (overall, on returning turns, against the
//! oracle), load balance, latency quantiles, throughput per GPU, interactivity
//! and cost — as a serializable report, a text table and per-request records.

use super::config::{CacheMode, Policy};
use serde::Serialize;
use std::fmt::Write;

/// Quantiles of a latency, ms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Quantiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

impl Quantiles {
    /// From a histogram of µs.
    pub fn of_us(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |v: u64| v as f64 / 1000.0;
        Self {
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            mean: h.mean() / 1000.0,
        }
    }
}

/// A new histogram of µs at 2 significant digits (1 % resolution).
pub fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new(2).unwrap_or_else(|_| unreachable!("2 digits is valid"))
}

/// Records `ms` into a µs histogram (negative or non-finite values as 0).
pub fn record_ms(h: &mut hdrhistogram::Histogram<u64>, ms: f64) {
    let us = if ms.is_finite() && ms > 0.0 {
        (ms * 1000.0).round() as u64
    } else {
        0
    };
    let _ = h.record(us);
}

/// Hits on requests that are not their session's first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Returning {
    /// Returning requests finished.
    pub requests: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Of those, served from cache.
    pub hit_tokens: u64,
    /// `hit_tokens / prompt_tokens`.
    pub hit_ratio: f64,
}

/// How evenly the work spread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Balance {
    /// Busiest rank's GPU-busy time over the mean (the pool that routing places:
    /// decode or aggregated ranks).
    pub busy_max_over_mean: f64,
    /// Most requests on one rank over the mean.
    pub requests_max_over_mean: f64,
    /// Mean busy share of the ranks (busy time over the run's span).
    pub utilization: f64,
}

/// Disaggregated serving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PdSummary {
    /// Requests prefilled on the prefill pool.
    pub remote_prefills: u64,
    /// Requests prefilled on their decode rank (uncached part under the threshold).
    pub local_prefills: u64,
    /// Prompt tokens whose KV crossed to a decode rank.
    pub transferred_tokens: u64,
    /// Mean KV-transfer time of a remote prefill, ms.
    pub transfer_ms_mean: f64,
    /// Prefill ranks' busiest over mean busy time.
    pub prefill_busy_max_over_mean: f64,
}

/// The retention policy's counters, summed over ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RetentionSummary {
    /// Prompt ends retained.
    pub retained: u64,
    /// Retentions moved to the host tier.
    pub offloaded: u64,
    /// Retentions dropped (no room on the host, or no host tier).
    pub dropped: u64,
    /// Retentions that expired before use.
    pub expired: u64,
    /// Prompt tokens restored from host tiers.
    pub restored_tokens: u64,
    /// Largest host-tier use of any rank, bytes.
    pub host_peak_bytes: u64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Routing policy.
    pub policy: Policy,
    /// Cache mode.
    pub cache: CacheMode,
    /// Prefill ranks (0 = aggregated) and decode (or aggregated) ranks, at most.
    pub prefill_ranks: usize,
    /// Decode (or aggregated) ranks, at most.
    pub decode_ranks: usize,
    /// GPUs of the largest fleet (ranks × GPUs per engine).
    pub gpus: u64,
    /// Requests in the trace.
    pub requests: u64,
    /// Requests that finished.
    pub finished: u64,
    /// Requests refused at submission (a prompt longer than the model or the device).
    pub refused: u64,
    /// Requests the engine failed.
    pub failed: u64,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: u64,
    /// Output tokens of finished requests.
    pub output_tokens: u64,
    /// Prompt tokens served from cache (device hits and host restores; for the
    /// oracle, its infinite cache).
    pub hit_tokens: u64,
    /// Prompt tokens computed by prefill, on any pool.
    pub computed_tokens: u64,
    /// `hit_tokens / prompt_tokens`.
    pub hit_ratio: f64,
    /// Hits on returning requests.
    pub returning: Returning,
    /// Prompt tokens the oracle's infinite cache serves (same trace, same engine blocks).
    pub oracle_hit_tokens: u64,
    /// `hit_tokens / oracle_hit_tokens`: the share of the oracle's saved prefill.
    pub oracle_share: f64,
    /// What an unlimited cache per rank would have served, when tracked.
    pub reusable_tokens: Option<u64>,
    /// `reusable − hits` per request, summed, when tracked.
    pub avoidable_tokens: Option<u64>,
    /// The same on returning requests.
    pub avoidable_returning_tokens: Option<u64>,
    /// Load balance of the routed pool.
    pub balance: Balance,
    /// Time to first token.
    pub ttft_ms: Quantiles,
    /// Inter-token latency, per token.
    pub itl_ms: Quantiles,
    /// Mean inter-token latency per request (TPOT).
    pub tpot_ms: Quantiles,
    /// End to end.
    pub e2e_ms: Quantiles,
    /// Output tokens per second per stream at the median TPOT: `1000 / p50 TPOT ms`.
    pub interactivity_tok_s: f64,
    /// First arrival to last token, s.
    pub span_s: f64,
    /// GPU-seconds paid for (active ranks × time × GPUs per engine).
    pub gpu_seconds: f64,
    /// (prompt + output tokens) ÷ GPU-seconds.
    pub tokens_per_gpu_s: f64,
    /// `$/GPU-hour × 10⁶ / (3600 × tokens/s/GPU)`.
    pub usd_per_mtok: f64,
    /// Disaggregated serving, when the fleet is.
    pub pd: Option<PdSummary>,
    /// Retention counters.
    pub retention: RetentionSummary,
    /// Engine steps simulated.
    pub steps: u64,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
}

impl RunReport {
    /// The row label: policy and cache mode.
    pub fn label(&self) -> String {
        format!("{} / {}", self.policy.name(), self.cache.name())
    }
}

/// One finished request, for planners and plots.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Arrival on the trace's timeline, ms.
    pub arrival_ms: f64,
    /// First token, ms.
    pub first_token_ms: f64,
    /// Last token, ms.
    pub finished_ms: f64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Served from cache.
    pub hit_tokens: u32,
    /// Computed by prefill (here or on a prefill rank).
    pub computed_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// Prefilled on the prefill pool.
    pub remote_prefill: bool,
    /// Not its session's first request.
    pub returning: bool,
}

impl RequestRecord {
    /// Time to first token, ms.
    pub fn ttft_ms(&self) -> f64 {
        self.first_token_ms - self.arrival_ms
    }
    /// Mean inter-token latency, ms (0 for one token).
    pub fn tpot_ms(&self) -> f64 {
        if self.output_tokens > 1 {
            (self.finished_ms - self.first_token_ms) / f64::from(self.output_tokens - 1)
        } else {
            0.0
        }
    }
}

/// A text table of runs, one row each.
pub fn table(runs: &[RunReport]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<30} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>7} {:>7} {:>8} {:>9} {:>8}",
        "policy / cache",
        "ret.hit",
        "oracle",
        "max/mn",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "tok/s/u",
        "tok/GPU·s",
        "$/Mtok",
        "refused"
    );
    for r in runs {
        let _ = writeln!(
            s,
            "{:<30} {:>6.1}% {:>6.1}% {:>7.2} {:>8.1} {:>8.1} {:>8.2} {:>7.2} {:>7.1} {:>8.0} {:>9.4} {:>8}",
            r.label(),
            r.returning.hit_ratio * 100.0,
            r.oracle_share * 100.0,
            r.balance.busy_max_over_mean,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.itl_ms.p50,
            r.itl_ms.p99,
            r.interactivity_tok_s,
            r.tokens_per_gpu_s,
            r.usd_per_mtok,
            r.refused + r.failed
        );
    }
    s
}

/// Peak resident memory of this process (Linux `VmHWM`), bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
