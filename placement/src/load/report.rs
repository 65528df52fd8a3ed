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
}
