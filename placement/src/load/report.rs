//! The `/load` report a rank serves (`docs/rank.md` "Load endpoint") and a
//! load-aware router reads: serde types shared by the rank that writes them and
//! the gateway filter and fleet tools that parse them.

use serde::{Deserialize, Serialize};

/// The whole process: vLLM's `server_load` plus one entry per DP rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Requests in flight over all DP ranks (running + waiting), as vLLM's `/load`.
    pub server_load: usize,
    /// Simulated ms since the rank started.
    pub sim_ms: f64,
    /// Simulated time per wall time.
    pub speedup: f64,
    /// Per DP rank, by rank.
    pub ranks: Vec<RankLoad>,
    /// What the process holds, when it publishes it
    /// ([`crate::residency::Summary`]; absent: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residency: Option<crate::residency::Summary>,
}

/// One DP rank's load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankLoad {
    /// The DP rank (`x-data-parallel-rank`).
    pub dp_rank: usize,
    /// Requests admitted (holding KV): restoring, prefilling or decoding.
    pub running: usize,
    /// Requests queued for admission.
    pub waiting: usize,
    /// Of the running, those waiting for a host-tier restore.
    pub restoring: usize,
    /// Prompt tokens still to compute, waiting and running requests together.
    pub queued_prefill_tokens: u64,
    /// Fraction of device KV blocks in use by requests or retentions (0–1).
    pub kv_usage: f64,
    /// Device KV blocks.
    pub kv_blocks: usize,
    /// Retention records on the device.
    pub retentions: usize,
    /// Share of recent time the rank was busy (0–1; [`crate::busy`]: an
    /// average over about the last five minutes). Absent from older
    /// reports: 0.
    #[serde(default)]
    pub busy: f64,
}

impl LoadReport {
    /// Prompt tokens still to compute over all DP ranks (a prefill endpoint's
    /// backlog).
    pub fn queued_prefill_tokens(&self) -> u64 {
        self.ranks
            .iter()
            .map(|r| r.queued_prefill_tokens)
            .fold(0, u64::saturating_add)
    }

    /// The process's busy share: the mean over its DP ranks (0–1; a
    /// non-finite or out-of-range figure reads as 0 or 1).
    pub fn busy(&self) -> f64 {
        let n = self.ranks.len();
        if n == 0 {
            return 0.0;
        }
        let sum: f64 = self.ranks.iter().map(|r| crate::busy::share(r.busy)).sum();
        sum / n as f64
    }
}
