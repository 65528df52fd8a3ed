//! The no-reuse baseline, sized as Dynamo's SLA planner sizes a P/D fleet
//! (it profiles with no KV reuse) and simulated as such — never corrected
//! against a simulation that has cache hits (`docs/planning.md`, "Baselines").
//!
//! Per interval of length `T` with `n` requests of mean input `ISL` and mean
//! output `OSL` (Dynamo `planner_core.py`, correction factors 1):
//! - prefill engines `= ⌈n · ISL / T ÷ thpt_p(ISL)⌉`, `thpt_p(ISL) = ISL ÷ ttft(ISL)`
//!   per engine (the profile's prefill throughput at that length);
//! - decode engines `= ⌈n · OSL / T ÷ thpt_d⌉`, `thpt_d = b ÷ itl(b, ISL + OSL/2)`
//!   at the largest batch `b` whose ITL meets the objective (and whose KV fits
//!   and `--max-num-seqs` allows);
//! - at least one engine each.

use super::demand::{Work, intervals};
use super::fit::Planner;
use super::size::{Binding, Size};
use super::{PlanError, Settings, Variant};
use crate::sim::{CacheMode, Policy, SimConfig, Step};

/// Replicas per interval by Dynamo's SLA-planner formulas on `work` as given.
pub(super) fn dynamo_steps(p: &Planner, work: &[Work], sim: &SimConfig) -> Vec<Step> {
    let limits = super::size::EngineLimits {
        kv_tokens: sim
            .engine
            .device_kv_tokens
            .unwrap_or(p.profile.max_kv_tokens),
        max_num_seqs: sim.engine.max_num_seqs,
    };
    let itl = p.cfg.slo.itl_p99_ms;
    intervals(work, p.start_ms, p.cfg.interval_ms)
        .iter()
        .map(|i| {
            let n = i.requests.max(1) as f64;
            let isl = i.prompt_tokens as f64 / n;
            let osl = i.output_tokens as f64 / n;
            let ttft = p.model.prefill_ms(isl.round() as usize).max(1e-6);
            let prefill_rate = i.prompt_tokens as f64 / i.len_ms;
            let prefill = (prefill_rate / (isl.max(1.0) / ttft)).ceil().max(1.0) as usize;
            let ctx = (isl + osl / 2.0).max(1.0);
            let b = super::size::max_batch(
                &p.model,
                ctx,
                itl.map(|t| t * super::size::ITL_HEADROOM),
                limits,
            )
            .map_or(1, |(b, _)| b);
            let thpt = b as f64 / p.model.decode_ms(b, ctx).max(1e-6);
            let decode = (i.output_tokens as f64 / i.len_ms / thpt).ceil().max(1.0) as usize;
            Step {
                start_ms: i.start_ms,
                prefill: if i.requests == 0 { 1 } else { prefill },
                decode,
            }
        })
        .collect()
}

/// The no-reuse fleet: Dynamo-sized on every prompt token, every prefill
/// remote, round-robin + `lru`, simulated once.
pub(super) fn no_reuse(p: &Planner, base: &Settings) -> Result<Variant, PlanError> {
    let s = Settings {
        disaggregated: true,
        policy: Policy::RoundRobin,
        cache: CacheMode::Lru,
        pd_threshold_tokens: 0,
        ..*base
    };
    let cold = p.cold_work();
    let steps = dynamo_steps(p, &cold, &p.cfg.sim);
    let sizes = vec![
        (
            Size::of(0, Binding::Throughput),
            Size::of(0, Binding::Throughput)
        );
        steps.len()
    ];
    let (report, _) = p.run(&s, &steps, false)?;
    let met = p.misses(&report).is_empty();
    Ok(p.finish(
        "no-reuse",
        "P/D sized by Dynamo's SLA-planner formulas with every prompt token computed, round-robin + lru, every prefill remote; simulated, not corrected".into(),
        &s,
        &cold,
        steps,
        &sizes,
        report,
        met,
        1,
    ))
}
