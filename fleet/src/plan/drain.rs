//! The drain: a fleet serving a finite trace keeps running after the plan's
//! last interval until the last request's last token, and the simulation pays
//! for that tail (`gpu_seconds` runs to the last token). On a trace of a few
//! intervals the tail is a large share of the bill — a 30 s interval of 30 k
//! prompts drains for ~5 s, 15–19 % more than the intervals alone — so the
//! prediction pays for it too (`docs/planning.md`, "Cost").
//!
//! Each request is predicted to finish at its arrival + its lone prefill
//! (attending over its cached context) + the KV transfer when it is prefilled
//! remotely + its output tokens at the step time of half the decode engines'
//! operating batch in its interval: the last request's batch mates arrived
//! before it and finish before it, so over its decode the batch shrinks from
//! the operating one to itself, half of it on average. The operating batch
//! follows from Little's law: an engine emitting `x` tokens per ms runs the
//! smallest batch `b` with `b / itl(b) ≥ x` (capped by the batch the sizing
//! allows).

use super::Settings;
use super::demand::{Work, intervals};
use super::fit::Planner;
use super::size;
use crate::sim::Step;
use tether_placement::disaggregate;

/// Per interval: the decode step time, ms, at the batch its engines run.
fn step_times(p: &Planner, work: &[Work], steps: &[Step], s: &Settings) -> Vec<f64> {
    let limits = p.limits(s);
    intervals(work, p.start_ms, p.cfg.interval_ms)
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let ctx = i.decode_context.max(1.0);
            let engines = steps.get(k).map_or(1, |x| x.decode.max(1)) as f64;
            let per_engine = i.output_tokens as f64 / i.len_ms / engines;
            let cap =
                size::max_batch(&p.model, ctx, p.cfg.slo.itl_p99_ms, limits).map_or(1, |(b, _)| b);
            let b = operating_batch(p, ctx, per_engine, cap);
            p.model.decode_ms(b.div_ceil(2), ctx)
        })
        .collect()
}

/// The smallest batch (≤ `cap`) whose throughput reaches `tokens_per_ms`.
fn operating_batch(p: &Planner, ctx: f64, tokens_per_ms: f64, cap: usize) -> usize {
    let rate = |b: usize| b as f64 / p.model.decode_ms(b, ctx).max(1e-6);
    let (mut lo, mut hi) = (1usize, cap.max(1));
    if rate(lo) >= tokens_per_ms {
        return lo;
    }
    if rate(hi) < tokens_per_ms {
        return hi;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if rate(mid) >= tokens_per_ms {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Predicted time from the end of `steps` (the last step + one interval) to
/// the last token of `work` under `s`, ms; 0 when everything finishes by then.
pub(super) fn tail_ms(p: &Planner, work: &[Work], steps: &[Step], s: &Settings) -> f64 {
    if std::env::var_os("NO_DRAIN").is_some() {
        return 0.0;
    }
    let Some(last) = steps.last() else {
        return 0.0;
    };
    let end = last.start_ms + p.cfg.interval_ms;
    let step = step_times(p, work, steps, s);
    let remote = s.disaggregated && steps.iter().any(|x| x.prefill > 0);
    let bytes = p.profile.kv_bytes_per_token as f64;
    let link = p.cfg.sim.pd.kv_link_gbps;
    let n = step.len().max(1);
    let mut finish = f64::NEG_INFINITY;
    for w in work {
        let k = (((w.arrival_ms - p.start_ms) / p.cfg.interval_ms)
            .floor()
            .max(0.0) as usize)
            .min(n - 1);
        let cached = w.prompt - w.uncached.min(w.prompt);
        let mut ttft = p
            .model
            .prefill_after_ms(w.uncached as usize, cached as usize);
        if remote && disaggregate(u64::from(w.uncached), 0, s.pd_threshold_tokens) {
            ttft += f64::from(w.prompt) * bytes / (link * 1e6);
        }
        let decode = f64::from(w.output.max(1)) * step.get(k).copied().unwrap_or(0.0);
        finish = finish.max(w.arrival_ms + ttft + decode);
    }
    (finish - end).max(0.0)
}
