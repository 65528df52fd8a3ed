//! The load endpoint's JSON (`GET /load`), for load-aware routing: what each DP
//! rank is doing now. The types live in `tether-placement` so pollers (the
//! gateway filter, replay, the fleet tools) parse exactly what the rank writes.

use crate::metrics::EngineGauges;
pub use tether_placement::load::report::{LoadReport, RankLoad};

/// One DP rank's load, from its engine's gauges.
pub fn rank_load(dp_rank: usize, g: &EngineGauges) -> RankLoad {
    RankLoad {
        dp_rank,
        running: g.running,
        waiting: g.waiting,
        restoring: g.restoring,
        queued_prefill_tokens: g.queued_prefill_tokens,
        kv_usage: (g.kv_usage * 1e4).round() / 1e4,
        kv_blocks: g.kv_blocks,
        retentions: g.device_retentions,
        busy: (g.busy * 1e4).round() / 1e4,
        prefill_tokens_per_s: g.prefill_tokens_per_s.round(),
    }
}
