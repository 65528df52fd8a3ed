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
    /// The rank's own prefill rate, prompt tokens per second of a full step
    /// (`tether-rank`: its profile at its step budget; `TetherConnector`:
    /// measured on its steps), which turns `queued_prefill_tokens` into a
    /// wait. Absent from older reports, and 0 while unknown: the reader's
    /// configured rate applies.
    #[serde(default)]
    pub prefill_tokens_per_s: f64,
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

    /// The process's prefill rate, tokens/s: the sum over its DP ranks (each
    /// prefills its own queue, and [`Self::queued_prefill_tokens`] sums the
    /// queues); `None` unless every DP rank reports a positive, finite rate.
    pub fn prefill_tokens_per_s(&self) -> Option<f64> {
        let known =
            |r: &RankLoad| r.prefill_tokens_per_s.is_finite() && r.prefill_tokens_per_s > 0.0;
        (!self.ranks.is_empty() && self.ranks.iter().all(known))
            .then(|| self.ranks.iter().map(|r| r.prefill_tokens_per_s).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rates: &[f64]) -> LoadReport {
        let ranks = rates
            .iter()
            .enumerate()
            .map(|(i, &r)| RankLoad {
                dp_rank: i,
                running: 0,
                waiting: 0,
                restoring: 0,
                queued_prefill_tokens: 1000,
                kv_usage: 0.0,
                kv_blocks: 16,
                retentions: 0,
                busy: 0.0,
                prefill_tokens_per_s: r,
            })
            .collect();
        LoadReport {
            server_load: 0,
            sim_ms: 0.0,
            speedup: 1.0,
            ranks,
            residency: None,
        }
    }

    #[test]
    fn the_prefill_rate_sums_the_dp_ranks_and_is_unknown_if_any_rank_is() {
        assert_eq!(
            report(&[40_000.0, 60_000.0]).prefill_tokens_per_s(),
            Some(100_000.0)
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(
                report(&[40_000.0, bad]).prefill_tokens_per_s(),
                None,
                "{bad}"
            );
        }
        assert_eq!(report(&[]).prefill_tokens_per_s(), None);
    }

    #[test]
    fn a_report_without_the_rate_parses_as_unknown() {
        let old = r#"{"server_load":1,"sim_ms":0,"speedup":1,"ranks":[{"dp_rank":0,"running":1,
            "waiting":0,"restoring":0,"queued_prefill_tokens":5,"kv_usage":0.1,"kv_blocks":8,
            "retentions":0}]}"#;
        let r: LoadReport = serde_json::from_str(old).expect("an older report parses");
        assert_eq!(r.ranks[0].prefill_tokens_per_s, 0.0);
        assert_eq!(r.prefill_tokens_per_s(), None);
    }
}
