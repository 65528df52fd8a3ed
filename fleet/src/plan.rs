//! The P/D planner: from a trace (or a replay's observed hits), a GPU profile,
//! latency objectives and a cost target, plan prefill and decode replica
//! counts per interval — and the same load under coupled scaling, with cache
//! reuse ignored, and with routing but no retention — then verify every plan
//! by simulating the planned fleet on the same trace (`docs/planning.md`).
//!
//! - [`demand`]: the traffic mix per interval after the expected cache hits;
//! - [`size`]: replica counts from the profile (M/G/c prefill, decode batch at
//!   the ITL target, coupled engines);
//! - [`output`]: the report, replica counts as JSON and a Kubernetes-style
//!   YAML snippet.

pub mod demand;
pub mod output;
pub mod size;

use crate::report::Observation;
use crate::sim::{
    CacheMode, FleetShape, Policy, RunReport, SimConfig, SimError, Step, oracle_hits, simulate,
};
use crate::trace::Trace;
use demand::{Interval, Work, intervals};
use serde::Serialize;
use size::{Binding, DecodeLoad, Infeasible, PrefillLoad, Size, Slo};
use tether_placement::disaggregate;
use tether_rank_engine::latency::LatencyModel;
use tether_rank_engine::profile::Profile;
use thiserror::Error;

/// A cost target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Target {
    /// $ per million tokens, every prompt and output token alike.
    Blended(f64),
    /// $ per million input tokens and per million output tokens.
    Split {
        /// Input.
        input: f64,
        /// Output.
        output: f64,
    },
}

/// An API's prices per million tokens, to compare with.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ApiPrice {
    /// Uncached input.
    pub input: f64,
    /// Cached input (cache reads).
    pub cached_input: f64,
    /// Output.
    pub output: f64,
}

/// Everything a plan is made from.
#[derive(Clone, Debug)]
pub struct PlanConfig {
    /// Routing, cache, engine and P/D settings of the planned fleet.
    pub sim: SimConfig,
    /// Latency objectives.
    pub slo: Slo,
    /// Cost target, if any.
    pub target: Option<Target>,
    /// API prices to compare with, if any.
    pub api_price: Option<ApiPrice>,
    /// Planning interval, ms (simulated time).
    pub interval_ms: f64,
    /// Simulation rounds per variant to correct the profile's guess.
    pub rounds: usize,
    /// Observed cache hits per trace request (from a replay), instead of simulated ones.
    pub observed_hits: Option<Vec<Option<u32>>>,
}

/// Why no plan could be made at all.
#[derive(Debug, Error)]
pub enum PlanError {
    /// The simulation refused the setup.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// The trace has no requests.
    #[error("the trace has no requests: nothing to plan for")]
    Empty,
    /// A setting is out of range.
    #[error("{0}")]
    Setting(String),
}

/// One planned fleet.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    /// Short name.
    pub name: &'static str,
    /// What it is.
    pub what: String,
    /// Disaggregated (prefill and decode pools) or not.
    pub disaggregated: bool,
    /// Replicas per interval (start ms, prefill, decode; decode = aggregated when not disaggregated).
    pub steps: Vec<Step>,
    /// What set each pool's size, by GPU-hours share: (pool, binding, share).
    pub bindings: Vec<(String, Binding, f64)>,
    /// Prefill GPU-hours planned.
    pub prefill_gpu_hours: f64,
    /// Decode (or aggregated) GPU-hours planned.
    pub decode_gpu_hours: f64,
    /// Most prefill GPUs at once.
    pub peak_prefill_gpus: u64,
    /// Most decode (or aggregated) GPUs at once.
    pub peak_decode_gpus: u64,
    /// Predicted $/Mtok: planned GPU-hours × price ÷ the trace's tokens.
    pub predicted_usd_per_mtok: f64,
    /// The simulation of the final plan.
    pub simulated: Option<RunReport>,
    /// Simulated $/Mtok ÷ predicted (must be within 1 ± 0.1).
    pub agreement: Option<f64>,
    /// Whether the simulation met every objective.
    pub slo_met: bool,
    /// Simulated ÷ objective, per objective (< 1 = headroom).
    pub headroom: Vec<(String, f64)>,
    /// Why no fleet meets the objectives, if none does.
    pub infeasible: Option<Infeasible>,
    /// Simulation rounds it took.
    pub rounds: usize,
}

/// The planner's answer.
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    /// The objectives.
    pub slo: Slo,
    /// The target.
    pub target: Option<Target>,
    /// Planning interval, s.
    pub interval_s: f64,
    /// The demand the chosen plan is sized for, per interval.
    pub demand: Vec<Interval>,
    /// The plan (first) and what it is compared with.
    pub variants: Vec<Variant>,
    /// Target cost for this trace's tokens, $/Mtok blended, if a target was given.
    pub target_usd_per_mtok: Option<f64>,
    /// Whether the plan meets the target and the objectives.
    pub meets_target: Option<bool>,
    /// The answer in a sentence: met, or what binds.
    pub verdict: String,
    /// API cost of the trace ÷ the plan's cost, if API prices were given.
    pub api_ratio: Option<f64>,
    /// Prompt, cached prompt and output tokens of the trace under the plan.
    pub tokens: TokenCounts,
}

/// How the trace's tokens are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TokenCounts {
    /// Prompt tokens (cached included).
    pub prompt: u64,
    /// Of those, cache hits under the plan.
    pub cached: u64,
    /// Output tokens.
    pub output: u64,
}

/// Plans `trace` on `profile` (see the module docs).
pub fn plan(trace: &Trace, profile: &Profile, cfg: &PlanConfig) -> Result<PlanReport, PlanError> {
    if trace.requests().is_empty() {
        return Err(PlanError::Empty);
    }
    if cfg.interval_ms.is_nan() || cfg.interval_ms < 1000.0 {
        return Err(PlanError::Setting(
            "the planning interval must be at least 1 s".into(),
        ));
    }
    let p = Planner::new(trace, profile, cfg)?;
    // Hits of the chosen routing + retention, and of the routing alone.
    let chosen_hits = p.hits(cfg.sim.policy, cfg.sim.cache)?;
    let routed_hits = p.hits(cfg.sim.policy, CacheMode::Lru)?;
    let plan_v = p.variant(
        "plan",
        format!(
            "P/D, {} + {}: prefill and decode scaled separately on the expected cache hits",
            cfg.sim.policy.name(),
            cfg.sim.cache.name()
        ),
        true,
        &chosen_hits,
        cfg.sim.policy,
        cfg.sim.cache,
    )?;
    // Coupled engines at their best prefill chunk budget (a smaller
    // --max-num-batched-tokens shortens the decode steps a prefill stalls).
    let mut coupled: Option<Variant> = None;
    let budgets = [cfg.sim.engine.max_num_batched_tokens, 2048, 512];
    for (i, &budget) in budgets.iter().enumerate() {
        if budget < cfg.sim.engine.max_num_seqs || budgets[..i].contains(&budget) {
            continue;
        }
        let mut sub = cfg.clone();
        sub.sim.engine.max_num_batched_tokens = budget;
        let q = Planner {
            cfg: &sub,
            ..p.clone()
        };
        let v = q.variant("coupled", format!("aggregated, {} + {}, --max-num-batched-tokens {budget}: the same load with prefill and decode on the same engines, scaled together", cfg.sim.policy.name(), cfg.sim.cache.name()), false, &chosen_hits, cfg.sim.policy, cfg.sim.cache)?;
        let better = match &coupled {
            None => true,
            Some(c) => {
                (v.slo_met && !c.slo_met)
                    || (v.slo_met == c.slo_met
                        && v.predicted_usd_per_mtok < c.predicted_usd_per_mtok)
            }
        };
        if better {
            coupled = Some(v);
        }
    }
    let coupled = coupled
        .ok_or_else(|| PlanError::Setting("no coupled chunk budget fits --max-num-seqs".into()))?;
    let mut variants = vec![
        plan_v,
        coupled,
        p.variant("routing-only", format!("P/D, {} + lru: session routing without turn-boundary retention", cfg.sim.policy.name()), true, &routed_hits, cfg.sim.policy, CacheMode::Lru)?,
        p.variant("no-reuse", "P/D sized with every prompt token computed (Dynamo's planner profiles with no KV reuse), served by round-robin + lru".into(), true, &p.no_reuse(&chosen_hits), Policy::RoundRobin, CacheMode::Lru)?,
    ];
    let tokens = TokenCounts {
        prompt: chosen_hits.iter().map(|w| u64::from(w.prompt)).sum(),
        cached: chosen_hits
            .iter()
            .map(|w| u64::from(w.prompt - w.uncached))
            .sum(),
        output: chosen_hits.iter().map(|w| u64::from(w.output)).sum(),
    };
    let target_usd = cfg.target.map(|t| match t {
        Target::Blended(x) => x,
        Target::Split { input, output } => {
            let all = (tokens.prompt + tokens.output).max(1) as f64;
            (input * tokens.prompt as f64 + output * tokens.output as f64) / all
        }
    });
    let chosen = &variants[0];
    let cost = chosen
        .simulated
        .as_ref()
        .map_or(chosen.predicted_usd_per_mtok, |s| s.sim.usd_per_mtok);
    let verdict = verdict(chosen, cost, target_usd);
    let meets_target =
        target_usd.map(|t| chosen.slo_met && chosen.infeasible.is_none() && cost <= t);
    let api_ratio = cfg.api_price.map(|a| {
        let api = (a.input * (tokens.prompt - tokens.cached) as f64
            + a.cached_input * tokens.cached as f64
            + a.output * tokens.output as f64)
            / 1e6;
        let ours = cost * (tokens.prompt + tokens.output) as f64 / 1e6;
        if ours > 0.0 {
            api / ours
        } else {
            f64::INFINITY
        }
    });
    let demand = intervals(&chosen_hits, p.start_ms, cfg.interval_ms);
    variants
        .iter_mut()
        .for_each(|v| v.bindings.sort_by(|a, b| b.2.total_cmp(&a.2)));
    Ok(PlanReport {
        slo: cfg.slo,
        target: cfg.target,
        interval_s: cfg.interval_ms / 1000.0,
        demand,
        variants,
        target_usd_per_mtok: target_usd,
        meets_target,
        verdict,
        api_ratio,
        tokens,
    })
}

fn verdict(v: &Variant, cost: f64, target: Option<f64>) -> String {
    if let Some(inf) = &v.infeasible {
        return format!(
            "cannot meet the objectives: {} (binding: {})",
            inf.why,
            inf.binding.name()
        );
    }
    if !v.slo_met {
        let worst = v
            .headroom
            .iter()
            .filter(|(_, r)| *r > 1.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("an objective".to_owned(), |(k, r)| {
                format!("{k} ({:.0} % over)", (r - 1.0) * 100.0)
            });
        return format!(
            "cannot meet the objectives: the simulated fleet still misses {worst} after {} rounds of correction",
            v.rounds
        );
    }
    let binding = v
        .bindings
        .first()
        .map_or("none".to_owned(), |(pool, b, share)| {
            format!("{pool} {} ({:.0} % of GPU-hours)", b.name(), share * 100.0)
        });
    match target {
        None => format!(
            "objectives met at ${cost:.4}/Mtok (no cost target given); largest cost driver: {binding}"
        ),
        Some(t) if cost <= t => {
            format!("target met: ${cost:.4}/Mtok <= ${t:.4}/Mtok with every objective met")
        }
        Some(t) => format!(
            "cannot meet the target: the cheapest plan meeting the objectives costs ${cost:.4}/Mtok > ${t:.4}/Mtok; binding constraint: {binding}"
        ),
    }
}

/// Replicas per interval and, per interval, the (prefill, decode) sizes that set them.
type Sized = (Vec<Step>, Vec<(Size, Size)>);

#[derive(Clone)]
struct Planner<'a> {
    trace: &'a Trace,
    profile: &'a Profile,
    cfg: &'a PlanConfig,
    model: LatencyModel,
    oracle: Vec<u32>,
    start_ms: f64,
    /// Reference fleet for the hit simulations: sized for no reuse.
    reference: (usize, usize),
}

impl<'a> Planner<'a> {
    fn new(trace: &'a Trace, profile: &'a Profile, cfg: &'a PlanConfig) -> Result<Self, PlanError> {
        let block = if cfg.sim.engine.block_size == 0 {
            trace.block_size() as usize
        } else {
            cfg.sim.engine.block_size
        };
        let mut p = Self {
            trace,
            profile,
            cfg,
            model: LatencyModel::new(profile.clone()),
            oracle: oracle_hits(trace, block),
            start_ms: 0.0,
            reference: (1, 1),
        };
        let work: Vec<Work> = (0..trace.requests().len())
            .map(|i| {
                let id = crate::trace::RequestId(i as u32);
                let r = trace.request(id);
                Work {
                    arrival_ms: trace.arrival_ms(id).unwrap_or(0) as f64 / cfg.sim.speedup,
                    prompt: r.input_tokens,
                    uncached: r.input_tokens,
                    output: r.output_tokens.max(1),
                }
            })
            .collect();
        p.start_ms = work
            .iter()
            .map(|w| w.arrival_ms)
            .fold(f64::INFINITY, f64::min);
        if !p.start_ms.is_finite() {
            return Err(PlanError::Empty);
        }
        // Reference fleet: the no-reuse plan's peak (it can only need less).
        let steps = p
            .size_pd(&work, &cfg.slo)
            .or_else(|_| p.size_pd(&work, &Slo::default()))
            .map(|(s, _)| s)
            .unwrap_or_default();
        let pk = steps.iter().map(|s| s.prefill).max().unwrap_or(1).max(1);
        let dk = steps.iter().map(|s| s.decode).max().unwrap_or(1).max(1);
        p.reference = (pk, dk);
        Ok(p)
    }

    fn base_cfg(&self, policy: Policy, cache: CacheMode, fleet: FleetShape) -> SimConfig {
        SimConfig {
            policy,
            cache,
            fleet,
            track_reusable: false,
            ..self.cfg.sim.clone()
        }
    }

    /// Each request's expected hits under `policy` + `cache`: observed in a
    /// replay when given, else simulated on the reference fleet.
    fn hits(&self, policy: Policy, cache: CacheMode) -> Result<Vec<Work>, PlanError> {
        let (pk, dk) = self.reference;
        let cfg = self.base_cfg(policy, cache, FleetShape::disaggregated(pk, dk));
        let out = simulate(self.trace, self.profile, &cfg, &self.oracle, true, None)?;
        let mut work: Vec<Work> = out
            .records
            .iter()
            .filter_map(Work::from_observation)
            .collect();
        if let (Some(obs), CacheMode::RetentionHost | CacheMode::Retention) =
            (&self.cfg.observed_hits, cache)
            && policy == self.cfg.sim.policy
            && cache == self.cfg.sim.cache
        {
            work = self.observed(obs);
        }
        Ok(work)
    }

    /// Work with the hits a replay observed (requests it did not serve keep
    /// no hits).
    fn observed(&self, obs: &[Option<u32>]) -> Vec<Work> {
        (0..self.trace.requests().len())
            .map(|i| {
                let id = crate::trace::RequestId(i as u32);
                let r = self.trace.request(id);
                let hit = obs
                    .get(i)
                    .copied()
                    .flatten()
                    .unwrap_or(0)
                    .min(r.input_tokens);
                Work {
                    arrival_ms: self.trace.arrival_ms(id).unwrap_or(0) as f64
                        / self.cfg.sim.speedup,
                    prompt: r.input_tokens,
                    uncached: r.input_tokens - hit,
                    output: r.output_tokens.max(1),
                }
            })
            .collect()
    }

    fn no_reuse(&self, work: &[Work]) -> Vec<Work> {
        work.iter().map(|w| w.without_reuse()).collect()
    }

    /// Per-interval P/D replica counts from the profile.
    fn size_pd(&self, work: &[Work], slo: &Slo) -> Result<Sized, Infeasible> {
        let threshold = self.cfg.sim.pd.threshold_tokens;
        let link = self.cfg.sim.pd.kv_link_gbps;
        let bytes = self.profile.kv_bytes_per_token as f64;
        let mut steps = Vec::new();
        let mut sizes = Vec::new();
        for i in intervals(work, self.start_ms, self.cfg.interval_ms) {
            let mut remote = Vec::new();
            let mut local_ms = 0.0;
            let mut transfer = Vec::new();
            for &u in &i.uncached {
                let ms = self.model.prefill_ms(u as usize);
                if disaggregate(u64::from(u), 0, threshold) {
                    remote.push(ms);
                    transfer.push(f64::from(u) * bytes / (link * 1e6));
                } else {
                    local_ms += ms;
                }
            }
            transfer.sort_by(f64::total_cmp);
            let after = transfer
                .get(transfer.len() * 99 / 100)
                .copied()
                .unwrap_or(0.0)
                + self.model.decode_ms(1, i.decode_context.max(1.0));
            // Every request, prefilled here or there, must fit the objective alone.
            size::floor(
                &PrefillLoad {
                    service_ms: i
                        .uncached
                        .iter()
                        .map(|&u| self.model.prefill_ms(u as usize))
                        .collect(),
                    after_ms: self.model.decode_ms(1, i.decode_context.max(1.0)),
                    len_ms: i.len_ms,
                    ca2: i.arrival_cv2,
                    busy_share: 0.0,
                },
                slo,
            )?;
            let p = size::prefill(
                &PrefillLoad {
                    service_ms: remote,
                    after_ms: after,
                    len_ms: i.len_ms,
                    ca2: i.arrival_cv2,
                    busy_share: 0.0,
                },
                slo,
            )?;
            let d = size::decode(
                &self.model,
                &DecodeLoad {
                    output_tokens: i.output_tokens as f64,
                    context: i.decode_context.max(1.0),
                    len_ms: i.len_ms,
                    local_prefill_ms: local_ms,
                },
                slo,
                self.profile.max_kv_tokens,
            )?;
            steps.push(Step {
                start_ms: i.start_ms,
                prefill: p.replicas.max(1),
                decode: d.replicas.max(1),
            });
            sizes.push((p, d));
        }
        Ok((steps, sizes))
    }

    /// Per-interval aggregated replica counts from the profile.
    fn size_coupled(&self, work: &[Work], slo: &Slo) -> Result<Sized, Infeasible> {
        let mut steps = Vec::new();
        let mut sizes = Vec::new();
        for i in intervals(work, self.start_ms, self.cfg.interval_ms) {
            let service: Vec<f64> = i
                .uncached
                .iter()
                .map(|&u| self.model.prefill_ms(u as usize))
                .collect();
            let n = size::coupled(
                &self.model,
                &i,
                &service,
                slo,
                self.profile.max_kv_tokens,
                self.cfg.sim.engine.max_num_batched_tokens,
            )?;
            steps.push(Step {
                start_ms: i.start_ms,
                prefill: 0,
                decode: n.replicas.max(1),
            });
            sizes.push((
                Size {
                    replicas: 0,
                    binding: Binding::Minimum,
                },
                n,
            ));
        }
        Ok((steps, sizes))
    }

    /// Plans, simulates and corrects one variant.
    fn variant(
        &self,
        name: &'static str,
        what: String,
        disagg: bool,
        work: &[Work],
        policy: Policy,
        cache: CacheMode,
    ) -> Result<Variant, PlanError> {
        let size = |slo: &Slo| {
            if disagg {
                self.size_pd(work, slo)
            } else {
                self.size_coupled(work, slo)
            }
        };
        // The plan must meet the objectives; a fleet it is compared with that
        // cannot is still sized for its throughput and simulated, so its cost
        // and its misses show.
        let mut note = None;
        let (mut steps, sizes) = match size(&self.cfg.slo) {
            Ok(s) => s,
            Err(inf) if name == "plan" => return Ok(self.infeasible(name, what, disagg, inf)),
            Err(inf) => {
                note = Some(inf);
                match size(&Slo::default()) {
                    Ok(s) => s,
                    Err(inf) => return Ok(self.infeasible(name, what, disagg, inf)),
                }
            }
        };
        let mut bindings: Vec<Vec<(Binding, Binding)>> =
            vec![sizes.iter().map(|(p, d)| (p.binding, d.binding)).collect()];
        let mut rounds = 0;
        let mut last: Option<(RunReport, Vec<Observation>)> = None;
        let mut met = false;
        while rounds < self.cfg.rounds.max(1) {
            rounds += 1;
            let fleet = FleetShape {
                prefill: if disagg {
                    steps.iter().map(|s| s.prefill).max().unwrap_or(1)
                } else {
                    0
                },
                decode: steps.iter().map(|s| s.decode).max().unwrap_or(1),
                steps: steps.clone(),
                until_ms: self.planned_end(&steps),
            };
            let cfg = self.base_cfg(policy, cache, fleet);
            let out = simulate(self.trace, self.profile, &cfg, &self.oracle, true, None)?;
            let miss = self.misses(&out.report);
            last = Some((out.report, out.records));
            if miss.is_empty() {
                met = true;
                break;
            }
            if rounds == self.cfg.rounds.max(1) {
                break;
            }
            // Grow the pool that misses, in the intervals whose requests miss it.
            let Some((_, records)) = &last else { break };
            let bad = self.bad_intervals(records, steps.len(), &miss);
            let mut grown = vec![(Binding::Simulation, Binding::Simulation); steps.len()];
            for (k, (ttft_bad, itl_bad)) in bad.iter().enumerate() {
                let s = &mut steps[k];
                if disagg {
                    if *ttft_bad {
                        s.prefill += (s.prefill / 5).max(1);
                    }
                    if *itl_bad {
                        s.decode += (s.decode / 5).max(1);
                    }
                } else if *ttft_bad || *itl_bad {
                    s.decode += (s.decode / 5).max(1);
                }
                if !*ttft_bad && !*itl_bad {
                    grown[k] = bindings[0][k];
                }
            }
            bindings.push(grown);
        }
        let (mut report, _) = last.ok_or(PlanError::Setting("no simulation ran".into()))?;
        let final_bindings = bindings.last().cloned().unwrap_or_default();
        if met {
            // The profile's guess may be generous: trim each pool by a tenth
            // (at least one replica, never below one) while the simulation
            // still meets the objectives.
            let pools: &[bool] = if disagg { &[true, false] } else { &[false] };
            let mut open: Vec<bool> = pools.to_vec().iter().map(|_| true).collect();
            let mut trims = 0;
            while open.iter().any(|o| *o) && trims < 2 * self.cfg.rounds.max(1) {
                for (j, &prefill) in pools.iter().enumerate() {
                    if !open[j] {
                        continue;
                    }
                    let cut = |n: usize| n - (n / 10).max(1).min(n.saturating_sub(1));
                    let smaller: Vec<Step> = steps
                        .iter()
                        .map(|s| Step {
                            start_ms: s.start_ms,
                            prefill: if prefill { cut(s.prefill) } else { s.prefill },
                            decode: if prefill { s.decode } else { cut(s.decode) },
                        })
                        .collect();
                    if smaller == steps {
                        open[j] = false;
                        continue;
                    }
                    trims += 1;
                    rounds += 1;
                    let fleet = FleetShape {
                        prefill: if disagg {
                            smaller.iter().map(|s| s.prefill).max().unwrap_or(1)
                        } else {
                            0
                        },
                        decode: smaller.iter().map(|s| s.decode).max().unwrap_or(1),
                        steps: smaller.clone(),
                        until_ms: self.planned_end(&smaller),
                    };
                    let out = simulate(
                        self.trace,
                        self.profile,
                        &self.base_cfg(policy, cache, fleet),
                        &self.oracle,
                        false,
                        None,
                    )?;
                    if self.misses(&out.report).is_empty() {
                        steps = smaller;
                        report = out.report;
                    } else {
                        open[j] = false;
                    }
                }
            }
        }
        let mut v = self.finish(
            name,
            what,
            disagg,
            steps,
            &final_bindings,
            report,
            met,
            rounds,
        );
        v.infeasible = note;
        Ok(v)
    }

    /// The planned fleet runs through its last interval.
    fn planned_end(&self, steps: &[Step]) -> Option<f64> {
        steps.last().map(|s| s.start_ms + self.cfg.interval_ms)
    }

    /// Which objectives a simulated run misses: names with simulated ÷ objective.
    fn misses(&self, r: &RunReport) -> Vec<(String, f64)> {
        self.headroom(r)
            .into_iter()
            .filter(|(_, x)| *x > 1.0)
            .collect()
    }

    fn headroom(&self, r: &RunReport) -> Vec<(String, f64)> {
        let slo = &self.cfg.slo;
        let mut v = Vec::new();
        if let Some(t) = slo.ttft_p90_ms {
            v.push(("ttft-p90".to_owned(), r.ttft_ms.p90 / t));
        }
        if let Some(t) = slo.ttft_p99_ms {
            v.push(("ttft-p99".to_owned(), r.ttft_ms.p99 / t));
        }
        if let Some(t) = slo.itl_p99_ms {
            v.push(("itl-p99".to_owned(), r.sim.itl_ms.p99 / t));
        }
        if r.sim.refused + r.sim.failed > 0 {
            v.push((
                "requests-served".to_owned(),
                1.0 + (r.sim.refused + r.sim.failed) as f64,
            ));
        }
        v
    }

    /// Per interval: do its requests miss the TTFT objective (their own p99 /
    /// p90 over it) or the ITL objective (their TPOT p99 over it)?
    fn bad_intervals(
        &self,
        records: &[Observation],
        n: usize,
        miss: &[(String, f64)],
    ) -> Vec<(bool, bool)> {
        let mut ttft: Vec<Vec<f64>> = vec![Vec::new(); n];
        let mut tpot: Vec<Vec<f64>> = vec![Vec::new(); n];
        for r in records {
            let Some(s) = r.served() else { continue };
            let k = (((r.sent_ms - self.start_ms) / self.cfg.interval_ms)
                .floor()
                .max(0.0) as usize)
                .min(n - 1);
            ttft[k].push(s.timing.ttft_ms);
            if let Some(itl) = s.timing.itl_ms {
                tpot[k].push(itl);
            }
        }
        let q = |v: &mut Vec<f64>, q: f64| crate::quantile::of(v, q).unwrap_or(0.0);
        let slo = &self.cfg.slo;
        let ttft_missed = miss
            .iter()
            .any(|(k, _)| k.starts_with("ttft") || k == "requests-served");
        let itl_missed = miss.iter().any(|(k, _)| k.starts_with("itl"));
        let mut out: Vec<(bool, bool)> = (0..n)
            .map(|k| {
                let t = ttft_missed
                    && (slo.ttft_p99_ms.is_some_and(|s| q(&mut ttft[k], 0.99) > s)
                        || slo.ttft_p90_ms.is_some_and(|s| q(&mut ttft[k], 0.9) > s));
                let i = itl_missed
                    && slo
                        .itl_p99_ms
                        .is_some_and(|s| q(&mut tpot[k], 0.99) > s / size::ITL_HEADROOM);
                (t, i)
            })
            .collect();
        // A miss no single interval shows (per-token tails): grow everywhere.
        if ttft_missed && !out.iter().any(|x| x.0) {
            out.iter_mut().for_each(|x| x.0 = true);
        }
        if itl_missed && !out.iter().any(|x| x.1) {
            out.iter_mut().for_each(|x| x.1 = true);
        }
        out
    }

    fn infeasible(
        &self,
        name: &'static str,
        what: String,
        disagg: bool,
        inf: Infeasible,
    ) -> Variant {
        Variant {
            name,
            what,
            disaggregated: disagg,
            steps: Vec::new(),
            bindings: Vec::new(),
            prefill_gpu_hours: 0.0,
            decode_gpu_hours: 0.0,
            peak_prefill_gpus: 0,
            peak_decode_gpus: 0,
            predicted_usd_per_mtok: f64::INFINITY,
            simulated: None,
            agreement: None,
            slo_met: false,
            headroom: Vec::new(),
            infeasible: Some(inf),
            rounds: 0,
        }
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one call site assembling a result"
    )]
    fn finish(
        &self,
        name: &'static str,
        what: String,
        disagg: bool,
        steps: Vec<Step>,
        bindings: &[(Binding, Binding)],
        report: RunReport,
        met: bool,
        rounds: usize,
    ) -> Variant {
        let gpe = f64::from(self.profile.gpus_per_engine);
        let len = |k: usize| {
            steps
                .get(k + 1)
                .map_or(self.cfg.interval_ms, |n| n.start_ms - steps[k].start_ms)
        };
        let mut pre = 0.0;
        let mut dec = 0.0;
        let mut by: std::collections::BTreeMap<(String, Binding), f64> = Default::default();
        for (k, s) in steps.iter().enumerate() {
            let h = len(k) / 3_600_000.0 * gpe;
            let (pb, db) = bindings
                .get(k)
                .copied()
                .unwrap_or((Binding::Minimum, Binding::Minimum));
            if disagg {
                pre += s.prefill as f64 * h;
                *by.entry(("prefill".into(), pb)).or_default() += s.prefill as f64 * h;
            }
            dec += s.decode as f64 * h;
            let pool = if disagg { "decode" } else { "aggregated" };
            *by.entry((pool.into(), db)).or_default() += s.decode as f64 * h;
        }
        let total_h = (pre + dec).max(1e-12);
        let tokens = (report.prompt_tokens + report.output_tokens).max(1) as f64;
        let all_tokens: f64 = self
            .trace
            .requests()
            .iter()
            .map(|r| f64::from(r.input_tokens) + f64::from(r.output_tokens.max(1)))
            .sum();
        let predicted = (pre + dec) * self.profile.gpu_hour_usd * 1e6 / all_tokens;
        let _ = tokens;
        let agreement = (predicted > 0.0).then(|| report.sim.usd_per_mtok / predicted);
        Variant {
            name,
            what,
            disaggregated: disagg,
            peak_prefill_gpus: steps.iter().map(|s| s.prefill as u64).max().unwrap_or(0)
                * gpe as u64,
            peak_decode_gpus: steps.iter().map(|s| s.decode as u64).max().unwrap_or(0) * gpe as u64,
            bindings: by
                .into_iter()
                .map(|((p, b), h)| (p, b, h / total_h))
                .collect(),
            steps,
            prefill_gpu_hours: pre,
            decode_gpu_hours: dec,
            predicted_usd_per_mtok: predicted,
            headroom: self.headroom(&report),
            simulated: Some(report),
            agreement,
            slo_met: met,
            infeasible: None,
            rounds,
        }
    }
}

#[cfg(test)]
mod tests;
