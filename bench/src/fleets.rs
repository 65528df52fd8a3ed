//! `resident-bench`'s seeded fleets: many small coding-agent fleets of the
//! shape real agent traces come in (59 sessions on 8 ranks over an hour, at
//! 1× and 2× their arrival rate), so a placement rule is judged on how often
//! it meets the targets across draws rather than on one trace's luck, and each
//! part of the rule is taken out in turn (BENCHMARKS.md, "Busy share and four
//! candidates").
//!
//! What the generated fleets assume: the `coding-agent` preset's published
//! statistics (docs/traces.md), one hour of session starts, seeds 1 to
//! `--fleet-seeds`. The oracle runs once per fleet; every setting is judged
//! against it.

use anyhow::Result;
use tether_fleet::generate::{GenerateOptions, Preset, generate};
use tether_fleet::sim::{Policy, RunReport, SimConfig, oracle_hits_within, simulate};
use tether_fleet::trace::Trace;
use tether_rank_engine::engine::ContextLimit;
use tether_rank_engine::profile::Profile;

/// One placement setting of the comparison.
pub struct Setting {
    pub name: &'static str,
    /// *d*.
    pub candidates: usize,
    /// The busy share's weight (0: ties by rendezvous order).
    pub busy_weight: f64,
}

/// The settings compared: the rule before (d = 3, ties by rendezvous order),
/// each part alone, and the default.
pub fn settings() -> [Setting; 4] {
    let w = tether_placement::BUSY_WEIGHT;
    let d = tether_placement::DEFAULT_CANDIDATES;
    [
        Setting {
            name: "d = 3, ties by rendezvous (before)",
            candidates: 3,
            busy_weight: 0.0,
        },
        Setting {
            name: "d = 4 alone",
            candidates: d,
            busy_weight: 0.0,
        },
        Setting {
            name: "busy share alone (d = 3)",
            candidates: 3,
            busy_weight: w,
        },
        Setting {
            name: "d = 4 + busy share (default)",
            candidates: d,
            busy_weight: w,
        },
    ]
}

/// One setting's run on one fleet, against that fleet's oracle.
#[derive(Clone, Copy, Debug)]
pub struct Judged {
    pub share: f64,
    pub balance: f64,
    pub p90_ratio: f64,
}

impl Judged {
    fn of(r: &RunReport, oracle: &RunReport) -> Self {
        Self {
            share: r.sim.oracle_share,
            balance: r.sim.balance.busy_max_over_mean,
            p90_ratio: r.ttft_ms.p90 / oracle.ttft_ms.p90.max(f64::MIN_POSITIVE),
        }
    }

    /// The residency targets: ≥ 95 % of the oracle's saved prefill,
    /// busiest/mean ≤ 1.25, TTFT p90 ≤ 2× the oracle's.
    pub fn met(&self) -> bool {
        self.share >= 0.95 && self.balance <= 1.25 && self.p90_ratio <= 2.0
    }
}

/// The fleet of `seed`: 59 sessions starting over one hour.
pub fn fleet(seed: u64) -> Result<Trace> {
    let o = GenerateOptions {
        seed,
        sessions: 59,
        session_span_ms: Some(3_600_000.0),
        ..Preset::CodingAgent.options()
    };
    Ok(generate(&o)?)
}

/// Every setting on fleet `trace` at `speedup`: per setting, its judgement.
pub fn judge(
    trace: &Trace,
    profile: &Profile,
    base: &SimConfig,
    settings: &[Setting],
) -> Result<Vec<Judged>> {
    let window = ContextLimit(profile.max_model_len);
    let hits = oracle_hits_within(trace, trace.block_size() as usize, window);
    let run = |cfg: &SimConfig| -> Result<RunReport> {
        Ok(simulate(trace, profile, cfg, &hits, false, None)?.report)
    };
    let oracle = run(&SimConfig {
        policy: Policy::Oracle,
        ..base.clone()
    })?;
    settings
        .iter()
        .map(|s| {
            let r = run(&SimConfig {
                policy: Policy::TetherResident,
                candidates: s.candidates,
                resident_busy_weight: s.busy_weight,
                ..base.clone()
            })?;
            Ok(Judged::of(&r, &oracle))
        })
        .collect()
}

/// One line per setting over its fleets: how many met every target, the
/// median and worst of each figure.
pub fn summary(name: &str, runs: &[Judged]) -> String {
    let pick = |f: fn(&Judged) -> f64| -> Vec<f64> { runs.iter().map(f).collect() };
    let (share, bal, p90) = (
        pick(|j| j.share),
        pick(|j| j.balance),
        pick(|j| j.p90_ratio),
    );
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let min = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::min);
    format!(
        "  {name:<36} met {:>2} of {}; busiest/mean median {:.2}, worst {:.2} ({} over 1.25); TTFT p90 vs oracle median {:.2}x, worst {:.2}x; saved prefill worst {:.1} %",
        runs.iter().filter(|j| j.met()).count(),
        runs.len(),
        crate::median(bal.clone()),
        max(&bal),
        bal.iter().filter(|&&b| b > 1.25).count(),
        crate::median(p90.clone()),
        max(&p90),
        min(&share) * 100.0,
    )
}
