//! The load endpoint's JSON (`GET /load`), for load-aware routing: what each DP
//! rank is doing now. Serde types so pollers (the gateway, replay, the fleet
//! tools) parse exactly what the rank writes.

use crate::metrics::EngineGauges;
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

impl RankLoad {
    /// From an engine's gauges.
    pub fn from_gauges(dp_rank: usize, g: &EngineGauges) -> Self {
        Self {
            dp_rank,
            running: g.running,
            waiting: g.waiting,
            restoring: g.restoring,
            queued_prefill_tokens: g.queued_prefill_tokens,
            kv_usage: (g.kv_usage * 1e4).round() / 1e4,
            kv_blocks: g.kv_blocks,
            retentions: g.device_retentions,
        }
    }
}
