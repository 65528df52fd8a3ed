//! The answer a finance and an SRE team read: the verdict (met, over the
//! target by what, or infeasible and why, in engineering terms), the
//! configuration changes ranked by simulated effect, the waterfall from the
//! no-reuse plan to the chosen one, and the trace priced by an API.

use super::demand::{Work, intervals};
use super::fit::Planner;
use super::{PlanConfig, PlanReport, Settings, Target, TokenCounts, Variant, followed};
use crate::trace::Trace;
use serde::Serialize;

/// A configuration the search tried, against the chosen one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    /// The variant.
    pub variant: String,
    /// What differs from the chosen configuration.
    pub change: String,
    /// Its simulated $/Mtok.
    pub usd_per_mtok: f64,
    /// Minus the chosen one's (negative = cheaper).
    pub delta_usd_per_mtok: f64,
    /// GPU-hours minus the chosen one's.
    pub delta_gpu_hours: f64,
    /// Whether it meets every objective; if not, the worst miss.
    pub meets: bool,
    /// The objective it misses most and by how much, when it misses.
    pub misses: Option<String>,
}

/// One step of the waterfall from no reuse to the chosen configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaterfallStep {
    /// The serving change.
    pub step: String,
    /// The variant it is measured on.
    pub variant: String,
    /// Simulated $/Mtok.
    pub usd_per_mtok: f64,
    /// Change from the previous step.
    pub delta_usd_per_mtok: f64,
    /// Peak GPUs.
    pub gpus: u64,
    /// Change from the previous step.
    pub delta_gpus: i64,
    /// Cache hit ratio (prompt tokens served from cache).
    pub hit_ratio: f64,
    /// Turns retained at prompt end.
    pub retained_turns: u64,
}

/// The trace as an API would bill it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ApiComparison {
    /// What the API charges for the trace, $.
    pub api_usd: f64,
    /// What the chosen fleet costs for it, $.
    pub fleet_usd: f64,
    /// `api_usd ÷ fleet_usd`.
    pub ratio: f64,
}

/// The target as one blended $/Mtok for this trace's mix.
pub fn blend(t: Target, trace: &Trace) -> f64 {
    match t {
        Target::Blended(x) => x,
        Target::Split { input, output } => {
            let (mut p, mut o) = (0.0, 0.0);
            for r in trace.requests() {
                p += f64::from(r.input_tokens);
                o += f64::from(r.output_tokens.max(1));
            }
            (input * p + output * o) / (p + o).max(1.0)
        }
    }
}

fn miss_text(v: &Variant) -> Option<String> {
    if let Some(inf) = &v.infeasible {
        return Some(inf.why.clone());
    }
    v.headroom
        .iter()
        .filter(|(_, r)| *r > 1.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, r)| {
            if k == "requests-served" {
                format!("{} requests not served", (r - 1.0).round())
            } else {
                format!("{k} {:.0} % over", (r - 1.0) * 100.0)
            }
        })
}

/// What differs between two configurations, in flags.
fn diff(a: &Settings, chosen: &Settings) -> String {
    let mut d = Vec::new();
    if a.disaggregated != chosen.disaggregated {
        d.push(
            if a.disaggregated {
                "P/D split"
            } else {
                "coupled engines"
            }
            .to_owned(),
        );
    }
    if a.policy != chosen.policy {
        d.push(format!("--policy {}", a.policy.name()));
    }
    if a.cache != chosen.cache {
        d.push(format!("--cache {}", a.cache.name()));
    }
    if a.max_num_batched_tokens != chosen.max_num_batched_tokens {
        d.push(format!(
            "--max-num-batched-tokens {}",
            a.max_num_batched_tokens
        ));
    }
    if a.disaggregated && a.pd_threshold_tokens != chosen.pd_threshold_tokens {
        d.push(format!("--pd-threshold {}", a.pd_threshold_tokens));
    }
    if a.max_num_seqs != chosen.max_num_seqs {
        d.push(format!("--max-num-seqs {}", a.max_num_seqs));
    }
    if d.is_empty() {
        "pool sizes only".into()
    } else {
        d.join(", ")
    }
}

/// Fills the derived parts of `r` (demand, tokens, API, changes, waterfall, verdict).
/// `work` is the trace's requests with the chosen configuration's hits.
pub(super) fn complete(r: &mut PlanReport, p: &Planner, cfg: &PlanConfig, work: &[Work]) {
    let chosen = r.chosen().cloned();
    if let Some(c) = &chosen {
        r.demand = intervals(work, p.start_ms, cfg.interval_ms);
        if let Some(sim) = &c.simulated {
            r.tokens = TokenCounts {
                prompt: sim.prompt_tokens,
                cached: sim.hit_tokens,
                output: sim.output_tokens,
            };
        }
        r.api = cfg.api_price.and_then(|a| {
            let fleet_usd = c.usd_per_mtok()? * (r.tokens.prompt + r.tokens.output) as f64 / 1e6;
            // Of the uncached input, the share a later turn reads (billed as a cache write).
            let next = followed(p.trace);
            let (mut written, mut uncached) = (0.0, 0.0);
            for w in work {
                let u = f64::from(w.uncached);
                uncached += u;
                if next.get(w.request as usize).copied().unwrap_or(false) {
                    written += u;
                }
            }
            let share = if uncached > 0.0 {
                written / uncached
            } else {
                0.0
            };
            let fresh = r.tokens.prompt.saturating_sub(r.tokens.cached) as f64;
            let input = match a.cache_write {
                Some(cw) => fresh * (share * cw + (1.0 - share) * a.input),
                None => fresh * a.input,
            };
            let api_usd = (input
                + a.cached_input * r.tokens.cached as f64
                + a.output * r.tokens.output as f64)
                / 1e6;
            (fleet_usd > 0.0).then(|| ApiComparison {
                api_usd,
                fleet_usd,
                ratio: api_usd / fleet_usd,
            })
        });
        r.changes = changes(&r.variants, c);
    }
    r.waterfall = waterfall(&r.variants, chosen.as_ref());
    let cost = chosen.as_ref().and_then(Variant::usd_per_mtok);
    r.meets_target = r.target_usd_per_mtok.map(|t| cost.is_some_and(|c| c <= t));
    r.headroom_usd_per_mtok = match (r.target_usd_per_mtok, cost) {
        (Some(t), Some(c)) if c <= t => Some(t - c),
        _ => None,
    };
    r.verdict = verdict(r, chosen.as_ref());
}

fn changes(variants: &[Variant], chosen: &Variant) -> Vec<Change> {
    let Some(base) = chosen.usd_per_mtok() else {
        return Vec::new();
    };
    let mut out: Vec<Change> = variants
        .iter()
        .filter(|v| v.name != chosen.name)
        .filter_map(|v| {
            let usd = v.usd_per_mtok()?;
            Some(Change {
                variant: v.name.clone(),
                change: diff(&v.settings, &chosen.settings),
                usd_per_mtok: usd,
                delta_usd_per_mtok: usd - base,
                delta_gpu_hours: v.gpu_hours() - chosen.gpu_hours(),
                meets: v.meets(),
                misses: if v.meets() { None } else { miss_text(v) },
            })
        })
        .collect();
    out.sort_by(|a, b| a.usd_per_mtok.total_cmp(&b.usd_per_mtok));
    out
}

fn waterfall(variants: &[Variant], chosen: Option<&Variant>) -> Vec<WaterfallStep> {
    let find = |n: &str| variants.iter().find(|v| v.name == n);
    let cheapest = variants
        .iter()
        .filter(|v| v.meets() && v.usd_per_mtok().is_some())
        .min_by(|a, b| {
            a.usd_per_mtok()
                .unwrap_or(f64::MAX)
                .total_cmp(&b.usd_per_mtok().unwrap_or(f64::MAX))
        });
    let spent = chosen.filter(|c| cheapest.is_some_and(|x| x.name != c.name));
    let stages = [
        (
            "no reuse (Dynamo SLA-planner sizing, round-robin + lru)",
            find("no-reuse"),
        ),
        (
            "+ routing (session affinity: the hit ratio)",
            find("routing-only"),
        ),
        ("+ retention (turns retained at prompt end)", find("plan")),
        (
            "+ P/D split or coupling, and tuning (the cheapest meeting every objective)",
            cheapest,
        ),
        ("+ headroom spent (the chosen configuration)", spent),
    ];
    let mut out: Vec<WaterfallStep> = Vec::new();
    for (step, v) in stages {
        let Some(v) = v else { continue };
        let (Some(usd), Some(sim)) = (v.usd_per_mtok(), v.simulated.as_ref()) else {
            continue;
        };
        let gpus = v.peak_prefill_gpus + v.peak_decode_gpus;
        let (pu, pg) = out
            .last()
            .map_or((usd, gpus as i64), |l| (l.usd_per_mtok, l.gpus as i64));
        out.push(WaterfallStep {
            step: step.to_owned(),
            variant: v.name.clone(),
            usd_per_mtok: usd,
            delta_usd_per_mtok: usd - pu,
            gpus,
            delta_gpus: gpus as i64 - pg,
            hit_ratio: sim.hit_ratio,
            retained_turns: sim.sim.retention.retained,
        });
    }
    out
}

fn verdict(r: &PlanReport, chosen: Option<&Variant>) -> String {
    let Some(c) = chosen else {
        // Nothing meets: what the profile rules out for the starting
        // configuration, else the closest simulated one and what it misses.
        if let Some(inf) = r
            .variants
            .iter()
            .find(|v| v.name == "plan")
            .and_then(|v| v.infeasible.as_ref())
        {
            return format!(
                "cannot meet the objectives: {} (binding: {})",
                inf.why,
                inf.binding.name()
            );
        }
        let best = r
            .variants
            .iter()
            .filter(|v| v.simulated.is_some())
            .min_by(|a, b| a.worst_miss().total_cmp(&b.worst_miss()));
        return match best {
            Some(v) => format!(
                "cannot meet the objectives: the closest configuration ({}) still misses {} after {} simulation runs; binding: {}",
                v.settings.describe(),
                miss_text(v).unwrap_or_else(|| "an objective".into()),
                v.rounds,
                v.bindings.first().map_or("-".into(), |b| b.term.clone())
            ),
            None => format!(
                "cannot meet the objectives: {}",
                r.variants
                    .iter()
                    .find_map(|v| v.infeasible.as_ref().map(|i| i.why.clone()))
                    .unwrap_or_else(|| "no configuration could be sized".into())
            ),
        };
    };
    let cost = c.usd_per_mtok().unwrap_or(0.0);
    let binding = c.bindings.first().map_or("none".to_owned(), |b| {
        format!("{} ({:.0} % of GPU-hours)", b.term, b.share * 100.0)
    });
    match r.target_usd_per_mtok {
        None => format!(
            "objectives met at ${cost:.4}/Mtok by {} ({}); largest cost driver: {binding}",
            c.name,
            c.settings.describe()
        ),
        Some(t) if cost <= t => format!(
            "target met: ${cost:.4}/Mtok <= ${t:.4}/Mtok with every objective met by {} ({}); headroom ${:.4}/Mtok ({:.0} %)",
            c.name,
            c.settings.describe(),
            t - cost,
            100.0 * (t - cost) / t.max(1e-12)
        ),
        Some(t) => format!(
            "cannot meet the target: the cheapest configuration meeting the objectives ({}) costs ${cost:.4}/Mtok > ${t:.4}/Mtok; binding constraint: {binding}; changes ranked by simulated effect are listed above, before a bigger GPU or a smaller model",
            c.settings.describe()
        ),
    }
}
