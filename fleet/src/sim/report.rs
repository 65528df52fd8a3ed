//! What a run measured: cache hits (overall, on returning turns, against the
//! oracle), load balance, latency quantiles, throughput per GPU, interactivity
//! and cost — as a serializable row and a text table (per-request records are
//! the replay's [`Observation`](crate::report::Observation)s).

use super::config::{CacheMode, Policy};
use crate::quantile::Dist;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Hits on requests that are not their session's first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Balance {
    /// Busiest rank's GPU-busy time over the mean (the pool that routing places:
    /// decode or aggregated ranks).
    pub busy_max_over_mean: f64,
    /// Most requests on one rank over the mean.
    pub requests_max_over_mean: f64,
    /// Mean busy share of the ranks (busy time over the run's span).
    pub utilization: f64,
    /// KV memory imbalance (the "worker-HBM imbalance" of rebalancing designs):
    /// at every load poll, the busiest rank's device KV in use (requests and
    /// retentions, `kv_usage`) over the mean, minus 1; the 95th percentile over
    /// the polls where any rank held KV. 0 without polling policies.
    #[serde(default)]
    pub kv_imbalance_p95: f64,
    /// The same, averaged over those polls.
    #[serde(default)]
    pub kv_imbalance_mean: f64,
}

/// Disaggregated serving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PdSummary {
    /// Requests prefilled on the prefill pool.
    pub remote_prefills: u64,
    /// Requests prefilled on their decode rank (uncached part under the threshold,
    /// or kept there by cost).
    pub local_prefills: u64,
    /// Of those, over the threshold but kept on their decode holder because the
    /// prefill leg would have computed more (`tether-resident`, P/D by cost).
    #[serde(default)]
    pub kept_local_by_cost: u64,
    /// Prompt tokens whose KV crossed to a decode rank.
    pub transferred_tokens: u64,
    /// Mean KV-transfer time of a remote prefill, ms.
    pub transfer_ms_mean: f64,
    /// Prefill ranks' busiest over mean busy time.
    pub prefill_busy_max_over_mean: f64,
}

/// `tether-resident`'s placement decisions (`tether_placement::How`), over
/// the decode (or aggregated) pool and the prefill pool, and its migrations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResidentSummary {
    /// To the candidate holding the key's state.
    pub stay: u64,
    /// No candidate held it: the least loaded candidate.
    pub least: u64,
    /// Holder over the bound: moved with its state over the KV link.
    pub migrate: u64,
    /// Holder over the bound: moved, the state recomputed (transfer dearer).
    pub recompute: u64,
    /// Some candidate's residency unknown: bounded rendezvous pick.
    pub bounded: u64,
    /// Migrated requests served (their decode leg finished).
    pub migrated_served: u64,
    /// Tokens whose KV crossed the link in migrations.
    pub migrated_tokens: u64,
    /// Mean KV-transfer time of a migration, ms.
    pub migrate_transfer_ms_mean: f64,
    /// Rebalancing in tool gaps: states copied to a cooler candidate (landed).
    #[serde(default)]
    pub rebalanced: u64,
    /// Their tokens (crossed the KV link off the critical path).
    #[serde(default)]
    pub rebalanced_tokens: u64,
    /// Returning turns placed on the copy (the original released).
    #[serde(default)]
    pub rebalance_used: u64,
    /// Returning turns placed on the original (the copy released).
    #[serde(default)]
    pub rebalance_unused: u64,
    /// Copies still crossing when their turn returned (released on landing).
    #[serde(default)]
    pub rebalance_late: u64,
    /// Homes that moved their own copy to the host tier when a copy landed.
    #[serde(default)]
    pub rebalance_demoted: u64,
}

impl ResidentSummary {
    /// Counts one decision.
    pub fn count(&mut self, how: tether_placement::How) {
        use tether_placement::How;
        match how {
            How::Stay => self.stay += 1,
            How::Least => self.least += 1,
            How::Migrate { .. } => self.migrate += 1,
            How::Recompute { .. } => self.recompute += 1,
            How::Bounded => self.bounded += 1,
        }
    }
}

/// The retention policy's counters, summed over ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Host-tier retentions prefetched to the device before their return
    /// (`--prefetch`; docs/engine.md "Prefetch").
    #[serde(default)]
    pub prefetched: u64,
    /// Of those, hit by their session's next request.
    #[serde(default)]
    pub prefetch_used: u64,
    /// Of those, gone from the device unhit.
    #[serde(default)]
    pub prefetch_wasted: u64,
    /// Where the host tiers' written bytes went (`retention-bench`; not serialised).
    #[serde(skip)]
    pub host_usage: tether_engine::HostUsage,
}

/// What only a simulation measures: the one extension of a report
/// ([`Report::simulation`](crate::report::Report::simulation)) that `tether
/// simulate` fills and a replay leaves out, and the simulator-only columns of
/// a [`RunReport`]. Later simulator figures (per-session, P/D costs) go here.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Simulation {
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
    /// Requests refused at submission (a prompt longer than the model or the device).
    pub refused: u64,
    /// Of the refused, those whose prompt plus output exceed the profile's
    /// `max_model_len`: `tether-rank` answers exactly these with 400.
    #[serde(default)]
    pub too_long: u64,
    /// Requests the engine failed.
    pub failed: u64,
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
    /// Inter-token latency, per token (the engines' own histogram).
    pub itl_ms: Dist,
    /// Output tokens per second per stream at the median TPOT: `1000 / p50 TPOT ms`.
    pub interactivity_tok_s: f64,
    /// GPU-seconds paid for (active ranks × time × GPUs per engine).
    pub gpu_seconds: f64,
    /// (prompt + output tokens) ÷ GPU-seconds.
    pub tokens_per_gpu_s: f64,
    /// `$/GPU-hour × 10⁶ / (3600 × tokens/s/GPU)`.
    pub usd_per_mtok: f64,
    /// Disaggregated serving, when the fleet is.
    pub pd: Option<PdSummary>,
    /// `tether-resident`'s decisions, when the run used it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident: Option<ResidentSummary>,
    /// Retention counters.
    pub retention: RetentionSummary,
    /// Engine steps simulated.
    pub steps: u64,
}

/// Everything one run measured: one row of `tether simulate`'s table (its
/// `--json`), the simulator-only part flattened in.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// What only the simulation measures.
    #[serde(flatten)]
    pub sim: Simulation,
    /// Requests in the trace.
    pub requests: u64,
    /// Requests that finished.
    pub finished: u64,
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
    /// Time to first token.
    pub ttft_ms: Dist,
    /// Mean inter-token latency per request (TPOT).
    pub tpot_ms: Dist,
    /// End to end.
    pub e2e_ms: Dist,
    /// First arrival to last token, s.
    pub span_s: f64,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
}

impl RunReport {
    /// The row label: policy and cache mode.
    pub fn label(&self) -> String {
        format!("{} / {}", self.sim.policy.name(), self.sim.cache.name())
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
            r.sim.oracle_share * 100.0,
            r.sim.balance.busy_max_over_mean,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            r.sim.itl_ms.p50,
            r.sim.itl_ms.p99,
            r.sim.interactivity_tok_s,
            r.sim.tokens_per_gpu_s,
            r.sim.usd_per_mtok,
            r.sim.refused + r.sim.failed
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
