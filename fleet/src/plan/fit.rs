//! One configuration, fitted: replicas per interval from the profile, then
//! simulated on the trace and corrected — the pool that binds grows until the
//! simulation meets every objective, then each pool is trimmed while it still
//! does (`docs/planning.md`, steps 2–3).

use super::demand::{Interval, Work, intervals};
use super::progress::Observer;
use super::size::{self, Binding, DecodeLoad, EngineLimits, Infeasible, PrefillLoad, Size, Slo};
use super::{BindingShare, PlanConfig, PlanError, Settings, Variant};
use crate::report::Observation;
use crate::sim::{CacheMode, FleetShape, Policy, RunReport, SimConfig, Step, simulate};
use crate::trace::Trace;
use std::rc::Rc;
use tether_placement::disaggregate;
use tether_rank_engine::latency::LatencyModel;
use tether_rank_engine::profile::Profile;

/// Replicas per interval and, per interval, the (prefill, decode) sizes that set them.
pub(super) type Sized = (Vec<Step>, Vec<(Size, Size)>);

/// What a simulated fleet misses: (objective, simulated ÷ objective), > 1 each.
type Misses = Vec<(String, f64)>;

/// A fleet and its latest simulation.
pub(super) struct Fit {
    /// Replicas per interval.
    pub steps: Vec<Step>,
    /// What set them.
    pub sizes: Vec<(Size, Size)>,
    /// The simulation.
    pub report: RunReport,
    /// Its per-request records.
    pub records: Vec<Observation>,
}

/// Sizes, simulates and corrects configurations of one trace.
pub(super) struct Planner<'a> {
    pub trace: &'a Trace,
    pub profile: &'a Profile,
    pub cfg: &'a PlanConfig,
    pub model: LatencyModel,
    pub oracle: Rc<Vec<u32>>,
    pub start_ms: f64,
    /// Reference fleet for the hit simulations: the no-reuse plan's peak.
    pub reference: (usize, usize),
    /// Where progress goes.
    pub obs: &'a dyn Observer,
    /// Report each simulation's requests as they are placed (the whole-trace
    /// runs of a sampled plan, minutes each).
    pub by_request: bool,
    /// A correction round grows every pool that may bind in one simulation
    /// instead of one simulation per pool (the whole-trace runs of a sampled
    /// plan: a few replicas more cost less than minutes more).
    pub grow_together: bool,
    /// Every token the simulated fleet serves: prompt + output of each request
    /// within the context window (those over it are refused, not served).
    pub tokens: f64,
}

impl<'a> Planner<'a> {
    pub fn new(
        trace: &'a Trace,
        profile: &'a Profile,
        cfg: &'a PlanConfig,
        oracle: Vec<u32>,
        obs: &'a dyn Observer,
    ) -> Result<Self, PlanError> {
        let mut p = Self {
            trace,
            profile,
            cfg,
            model: LatencyModel::new(profile.clone()),
            oracle: Rc::new(oracle),
            start_ms: 0.0,
            reference: (1, 1),
            tokens: 0.0,
            obs,
            by_request: false,
            grow_together: false,
        };
        let window = tether_rank_engine::engine::ContextLimit(profile.max_model_len);
        p.tokens = trace
            .requests()
            .iter()
            .map(crate::trace::Request::asked_tokens)
            .filter(|&(i, o)| window.check(i, o).is_ok())
            .map(|(i, o)| (i + o) as f64)
            .sum();
        let work = p.cold_work();
        p.start_ms = work
            .iter()
            .map(|w| w.arrival_ms)
            .fold(f64::INFINITY, f64::min);
        if !p.start_ms.is_finite() {
            return Err(PlanError::Empty);
        }
        let steps = super::baseline::dynamo_steps(&p, &work, &cfg.sim);
        let pk = steps.iter().map(|s| s.prefill).max().unwrap_or(1).max(1);
        let dk = steps.iter().map(|s| s.decode).max().unwrap_or(1).max(1);
        p.reference = (pk, dk);
        Ok(p)
    }

    /// Every request with nothing cached.
    pub fn cold_work(&self) -> Vec<Work> {
        (0..self.trace.requests().len())
            .map(|i| {
                let id = crate::trace::RequestId(i as u32);
                let r = self.trace.request(id);
                Work {
                    request: i as u32,
                    arrival_ms: self.trace.arrival_ms(id).unwrap_or(0) as f64
                        / self.cfg.sim.speedup,
                    prompt: r.input_tokens,
                    uncached: r.input_tokens,
                    output: r.output_tokens.max(1),
                }
            })
            .collect()
    }

    /// The simulation settings of `s`.
    pub fn sim_cfg(&self, s: &Settings, fleet: FleetShape) -> SimConfig {
        let mut c = SimConfig {
            policy: s.policy,
            cache: s.cache,
            fleet,
            track_reusable: false,
            ..self.cfg.sim.clone()
        };
        c.engine.max_num_batched_tokens = s.max_num_batched_tokens;
        c.engine.max_num_seqs = s.max_num_seqs;
        c.pd.threshold_tokens = s.pd_threshold_tokens;
        c
    }

    /// Each request's expected hits under `s`'s routing and cache: observed in
    /// a replay when given (for the configured routing and cache), else
    /// simulated on the reference fleet.
    pub fn hits(&self, s: &Settings) -> Result<Vec<Work>, PlanError> {
        if let Some(obs) = &self.cfg.observed_hits
            && s.policy == self.cfg.sim.policy
            && s.cache == self.cfg.sim.cache
            && s.cache != CacheMode::Lru
        {
            return Ok(self.observed(obs));
        }
        let (pk, dk) = self.reference;
        let cfg = self.sim_cfg(s, FleetShape::disaggregated(pk, dk));
        let out = simulate(self.trace, self.profile, &cfg, &self.oracle, true, None)?;
        Ok(out
            .records
            .iter()
            .filter_map(Work::from_observation)
            .collect())
    }

    /// Work with the hits a replay observed (requests it did not serve keep
    /// no hits).
    fn observed(&self, obs: &[Option<u32>]) -> Vec<Work> {
        self.cold_work()
            .into_iter()
            .map(|w| {
                let hit = obs
                    .get(w.request as usize)
                    .copied()
                    .flatten()
                    .unwrap_or(0)
                    .min(w.prompt);
                Work {
                    uncached: w.prompt - hit,
                    ..w
                }
            })
            .collect()
    }

    /// The engine's batch limits under `s`.
    pub fn limits(&self, s: &Settings) -> EngineLimits {
        EngineLimits {
            kv_tokens: self
                .cfg
                .sim
                .engine
                .device_kv_tokens
                .unwrap_or(self.profile.max_kv_tokens),
            max_num_seqs: s.max_num_seqs,
        }
    }

    /// Lone prefill time of each request of an interval (attending over its
    /// cached context).
    fn service(&self, i: &Interval) -> Vec<f64> {
        i.uncached
            .iter()
            .zip(&i.cached)
            .map(|(&u, &c)| self.model.prefill_after_ms(u as usize, c as usize))
            .collect()
    }

    /// The objectives one interval is sized for: the user's, or — where even
    /// a lone request of the interval misses a TTFT objective and the
    /// objectives hold over the whole trace — the interval sized for its
    /// throughput (the whole-trace quantile is what must be met).
    fn interval_slo(&self, load: &PrefillLoad, slo: &Slo) -> Result<Slo, Infeasible> {
        match size::floor(load, slo) {
            Ok(()) => Ok(*slo),
            Err(e) if self.cfg.per_interval => Err(e),
            Err(_) => Ok(Slo {
                ttft_p90_ms: None,
                ttft_p99_ms: None,
                ..*slo
            }),
        }
    }

    /// Refuses TTFT objectives that a lone request misses over the whole trace.
    fn whole_floor(&self, work: &[Work], slo: &Slo) -> Result<(), Infeasible> {
        let all = intervals(work, self.start_ms, f64::MAX / 4.0);
        let Some(i) = all.first() else { return Ok(()) };
        size::floor(
            &PrefillLoad {
                split: false,
                service_ms: self.service(i),
                after_ms: self.model.decode_ms(1, i.decode_context.max(1.0)),
                len_ms: i.len_ms,
                ca2: i.arrival_cv2,
                busy_share: 0.0,
            },
            slo,
        )
    }

    /// Per-interval P/D replica counts from the profile; a prefill pool of
    /// zero when no request goes remote anywhere.
    pub fn size_pd(&self, work: &[Work], s: &Settings, slo: &Slo) -> Result<Sized, Infeasible> {
        self.whole_floor(work, slo)?;
        let link = self.cfg.sim.pd.kv_link_gbps;
        let bytes = self.profile.kv_bytes_per_token as f64;
        let mut steps = Vec::new();
        let mut sizes = Vec::new();
        for i in intervals(work, self.start_ms, self.cfg.interval_ms) {
            let service = self.service(&i);
            let mut remote = Vec::new();
            let mut local_ms = 0.0;
            let mut transfer = Vec::new();
            for ((&u, &c), &ms) in i.uncached.iter().zip(&i.cached).zip(&service) {
                if disaggregate(u64::from(u), 0, s.pd_threshold_tokens) {
                    remote.push(ms);
                    transfer.push(f64::from(u + c) * bytes / (link * 1e6));
                } else {
                    local_ms += ms;
                }
            }
            transfer.sort_by(f64::total_cmp);
            let first_step = self.model.decode_ms(1, i.decode_context.max(1.0));
            let after = transfer
                .get(transfer.len() * 99 / 100)
                .copied()
                .unwrap_or(0.0)
                + first_step;
            let all = PrefillLoad {
                split: false,
                service_ms: service.clone(),
                after_ms: first_step,
                len_ms: i.len_ms,
                ca2: i.arrival_cv2,
                busy_share: 0.0,
            };
            let slo_i = self.interval_slo(&all, slo)?;
            let p = size::prefill(
                &PrefillLoad {
                    split: s.policy == Policy::RoundRobin,
                    service_ms: remote,
                    after_ms: after,
                    len_ms: i.len_ms,
                    ca2: i.arrival_cv2,
                    busy_share: 0.0,
                },
                &slo_i,
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
                self.limits(s),
            )?;
            steps.push(Step {
                start_ms: i.start_ms,
                prefill: p.replicas,
                decode: d.replicas.max(1),
            });
            sizes.push((p, d));
        }
        // A pool that exists runs through the whole plan (a request the
        // simulation sends remote must find a rank); none when nothing is
        // prefilled remotely.
        if steps.iter().any(|s| s.prefill > 0) {
            steps.iter_mut().for_each(|s| s.prefill = s.prefill.max(1));
        }
        Ok((steps, sizes))
    }

    /// Per-interval aggregated replica counts from the profile.
    pub fn size_coupled(
        &self,
        work: &[Work],
        s: &Settings,
        slo: &Slo,
    ) -> Result<Sized, Infeasible> {
        self.whole_floor(work, slo)?;
        let mut steps = Vec::new();
        let mut sizes = Vec::new();
        for i in intervals(work, self.start_ms, self.cfg.interval_ms) {
            let service = self.service(&i);
            let slo_i = self.interval_slo(
                &PrefillLoad {
                    split: false,
                    service_ms: service.clone(),
                    after_ms: 0.0,
                    len_ms: i.len_ms,
                    ca2: i.arrival_cv2,
                    busy_share: 0.0,
                },
                slo,
            )?;
            let n = size::coupled(
                &self.model,
                &i,
                &service,
                &slo_i,
                self.limits(s),
                s.max_num_batched_tokens,
            )?;
            steps.push(Step {
                start_ms: i.start_ms,
                prefill: 0,
                decode: n.replicas.max(1),
            });
            sizes.push((Size::of(0, Binding::Minimum), n));
        }
        Ok((steps, sizes))
    }

    /// The profile's sizing of `s` on `work`.
    pub fn size(&self, work: &[Work], s: &Settings, slo: &Slo) -> Result<Sized, Infeasible> {
        // A prompt larger than an engine's KV is refused by the engine: no
        // pool size serves it (prompts over the context window are refused
        // apart, and only reach here with --cap-context).
        let kv = self.limits(s).kv_tokens;
        let window = tether_rank_engine::engine::ContextLimit(self.profile.max_model_len);
        let all = self.cold_work();
        if let Some(w) = all
            .iter()
            .filter(|w| {
                window
                    .check(u64::from(w.prompt), u64::from(w.output))
                    .is_ok()
            })
            .max_by_key(|w| w.prompt)
            && u64::from(w.prompt) > kv
        {
            return Err(Infeasible {
                binding: Binding::KvMemory,
                why: format!(
                    "KV memory: a {}-token prompt does not fit an engine's {kv} KV tokens (the engine refuses it)",
                    w.prompt
                ),
            });
        }
        if s.disaggregated {
            self.size_pd(work, s, slo)
        } else {
            self.size_coupled(work, s, slo)
        }
    }

    /// GPU-hours of `steps` as planned (each step until the next, the last
    /// for one interval).
    pub fn gpu_hours(&self, steps: &[Step]) -> (f64, f64) {
        let gpe = f64::from(self.profile.gpus_per_engine);
        let mut pre = 0.0;
        let mut dec = 0.0;
        for (k, s) in steps.iter().enumerate() {
            let h = self.step_len(steps, k) / 3_600_000.0 * gpe;
            pre += s.prefill as f64 * h;
            dec += s.decode as f64 * h;
        }
        (pre, dec)
    }

    fn step_len(&self, steps: &[Step], k: usize) -> f64 {
        match (steps.get(k), steps.get(k + 1)) {
            (Some(a), Some(b)) => b.start_ms - a.start_ms,
            _ => self.cfg.interval_ms,
        }
    }

    /// Predicted GPU-hours of `steps` serving `work` under `s`: the planned
    /// intervals plus the drain after the last one (the last step's fleet until
    /// the predicted last token, [`super::drain`]), and that drain in ms.
    pub fn predicted_hours(&self, steps: &[Step], work: &[Work], s: &Settings) -> (f64, f64, f64) {
        let (pre, dec) = self.gpu_hours(steps);
        let tail = super::drain::tail_ms(self, work, steps, s);
        let (lp, ld) = steps.last().map_or((0, 0), |x| (x.prefill, x.decode));
        let h = tail / 3_600_000.0 * f64::from(self.profile.gpus_per_engine);
        (pre + lp as f64 * h, dec + ld as f64 * h, tail)
    }

    /// Predicted $/Mtok of GPU-hours over every token the fleet serves.
    pub fn predicted_usd(&self, gpu_hours: f64) -> f64 {
        gpu_hours * self.profile.gpu_hour_usd * 1e6 / self.tokens.max(1.0)
    }

    /// Simulates `steps` under `s`.
    pub fn run(
        &self,
        s: &Settings,
        steps: &[Step],
        records: bool,
    ) -> Result<(RunReport, Vec<Observation>), PlanError> {
        let prefill = steps.iter().map(|x| x.prefill).max().unwrap_or(0);
        let fleet = FleetShape {
            prefill,
            decode: steps.iter().map(|x| x.decode).max().unwrap_or(1).max(1),
            steps: steps.to_vec(),
            until_ms: steps.last().map(|x| x.start_ms + self.cfg.interval_ms),
        };
        let cfg = self.sim_cfg(s, fleet);
        let obs = self.obs;
        let placed = move |n: u64| obs.at(n);
        let progress: Option<crate::sim::run::Progress> = self.by_request.then_some(&placed);
        let out = simulate(
            self.trace,
            self.profile,
            &cfg,
            &self.oracle,
            records,
            progress,
        )?;
        Ok((out.report, out.records))
    }

    /// Plans, simulates and corrects one configuration. A configuration no
    /// fleet can meet the objectives with is returned unsimulated with why.
    pub fn variant(
        &self,
        name: &str,
        what: String,
        s: &Settings,
        work: &[Work],
    ) -> Result<Variant, PlanError> {
        let (steps, sizes) = match self.size(work, s, &self.cfg.slo) {
            Ok(x) => x,
            Err(inf) => return Ok(self.infeasible(name, what, s, inf)),
        };
        let first = self.first(s, steps, sizes)?;
        self.correct(name, what, s, work, first, true)
    }

    /// `steps` simulated once, with per-request records.
    pub fn first(
        &self,
        s: &Settings,
        steps: Vec<Step>,
        sizes: Vec<(Size, Size)>,
    ) -> Result<Fit, PlanError> {
        let (report, records) = self.run(s, &steps, true)?;
        Ok(Fit {
            steps,
            sizes,
            report,
            records,
        })
    }

    /// From a first simulation: the pool that binds grows until the
    /// simulation meets every objective (up to `--rounds`), then, with
    /// `trim`, each pool is trimmed while it still meets.
    pub fn correct(
        &self,
        name: &str,
        what: String,
        s: &Settings,
        work: &[Work],
        mut fit: Fit,
        trim: bool,
    ) -> Result<Variant, PlanError> {
        let pools = if fit.steps.iter().any(|x| x.prefill > 0) {
            2
        } else {
            1
        };
        let mut rounds = 1;
        let mut corrections = 1;
        let mut miss = self.misses(&fit.report);
        while !miss.is_empty() && corrections < self.cfg.rounds.max(1) {
            corrections += 1;
            let mut best: Option<(Fit, f64)> = None;
            for option in self.grown(&fit, &miss, pools) {
                rounds += 1;
                if self.by_request {
                    self.obs.note(&format!(
                        "{name}: missed {}, grown (run {rounds})",
                        worst_of(&miss)
                    ));
                }
                let (report, records) = self.run(s, &option.steps, true)?;
                let f = Fit {
                    report,
                    records,
                    ..option
                };
                let worst = self
                    .misses(&f.report)
                    .iter()
                    .map(|m| m.1)
                    .fold(0.0, f64::max);
                let hours = |x: &Fit| {
                    let (a, b) = self.gpu_hours(&x.steps);
                    a + b
                };
                let better = best.as_ref().is_none_or(|(b, w)| {
                    worst < w - 1e-9 || ((worst - w).abs() <= 1e-9 && hours(&f) < hours(b))
                });
                if better {
                    best = Some((f, worst));
                }
            }
            let Some((f, _)) = best else { break };
            fit = f;
            miss = self.misses(&fit.report);
        }
        let met = miss.is_empty();
        let Fit {
            mut steps,
            sizes,
            mut report,
            ..
        } = fit;
        if met && trim {
            (steps, report, rounds) = self.trim(s, steps, report, rounds, pools)?;
        }
        Ok(self.finish(name, what, s, work, steps, &sizes, report, met, rounds))
    }

    /// The fleets one correction round tries: where the miss is TTFT in a P/D
    /// fleet, the prefill pool and the decode pool (whose admission or local
    /// prefills may be what queues) are each grown by a fifth in the intervals
    /// that miss; the caller keeps the one that cuts the miss more — the pool
    /// that binds.
    fn grown(&self, fit: &Fit, miss: &Misses, pools: usize) -> Vec<Fit> {
        let bad = self.bad_intervals(&fit.records, fit.steps.len(), miss);
        let ttft = bad.iter().any(|b| b.0);
        let mut out = Vec::new();
        for pool in 0..pools {
            let prefill_pool = pools == 2 && pool == 0;
            if prefill_pool && !ttft {
                continue;
            }
            let mut steps = fit.steps.clone();
            let mut sizes = fit.sizes.clone();
            for (k, &(t, i)) in bad.iter().enumerate() {
                let (Some(st), Some(sz)) = (steps.get_mut(k), sizes.get_mut(k)) else {
                    continue;
                };
                if prefill_pool && t {
                    st.prefill = grown_by_a_fifth(st.prefill);
                    sz.0.binding = Binding::Simulation;
                } else if !prefill_pool && (t || i) {
                    st.decode = grown_by_a_fifth(st.decode);
                    sz.1.binding = Binding::Simulation;
                }
            }
            out.push(Fit {
                steps,
                sizes,
                report: fit.report.clone(),
                records: Vec::new(),
            });
        }
        if self.grow_together {
            out = together(out).into_iter().collect();
        }
        out
    }

    /// The profile's guess may be generous: each pool is cut by a tenth (at
    /// least one replica, never below one) while the simulation still meets
    /// the objectives.
    fn trim(
        &self,
        s: &Settings,
        mut steps: Vec<Step>,
        mut report: RunReport,
        mut rounds: usize,
        pools: usize,
    ) -> Result<(Vec<Step>, RunReport, usize), PlanError> {
        let mut open = vec![true; pools];
        let mut trims = 0;
        let cut = |n: usize| n - (n / 10).max(1).min(n.saturating_sub(1));
        while open.iter().any(|o| *o) && trims < 2 * self.cfg.rounds.max(1) {
            for (j, o) in open.iter_mut().enumerate() {
                if !*o {
                    continue;
                }
                let prefill = pools == 2 && j == 0;
                let smaller: Vec<Step> = steps
                    .iter()
                    .map(|x| Step {
                        start_ms: x.start_ms,
                        prefill: if prefill { cut(x.prefill) } else { x.prefill },
                        decode: if prefill { x.decode } else { cut(x.decode) },
                    })
                    .collect();
                if smaller == steps {
                    *o = false;
                    continue;
                }
                trims += 1;
                rounds += 1;
                let (r, _) = self.run(s, &smaller, false)?;
                if self.misses(&r).is_empty() {
                    steps = smaller;
                    report = r;
                } else {
                    *o = false;
                }
            }
        }
        Ok((steps, report, rounds))
    }

    /// Which objectives a simulated run misses.
    pub fn misses(&self, r: &RunReport) -> Misses {
        self.headroom(r)
            .into_iter()
            .filter(|(_, x)| *x > 1.0)
            .collect()
    }

    /// Simulated ÷ objective per objective (< 1 = headroom), over the whole
    /// trace; requests the fleet failed to serve count as a miss (those over
    /// `max_model_len`, refused as the engine refuses them, do not).
    pub fn headroom(&self, r: &RunReport) -> Vec<(String, f64)> {
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
        let unserved = (r.sim.refused + r.sim.failed).saturating_sub(r.sim.too_long);
        if unserved > 0 {
            v.push(("requests-served".to_owned(), 1.0 + unserved as f64));
        }
        v
    }

    /// Per interval: do its requests miss a TTFT objective (their own p99 /
    /// p90 over it), or the ITL objective (their TPOT p99 over it)? A miss no
    /// single interval shows (the whole-trace tail) marks every interval.
    fn bad_intervals(&self, records: &[Observation], n: usize, miss: &Misses) -> Vec<(bool, bool)> {
        let mut ttft: Vec<Vec<f64>> = vec![Vec::new(); n];
        let mut tpot: Vec<Vec<f64>> = vec![Vec::new(); n];
        for r in records {
            let Some(s) = r.served() else { continue };
            let k = (((r.sent_ms - self.start_ms) / self.cfg.interval_ms)
                .floor()
                .max(0.0) as usize)
                .min(n.saturating_sub(1));
            if let (Some(a), Some(b)) = (ttft.get_mut(k), tpot.get_mut(k)) {
                a.push(s.timing.ttft_ms);
                if let Some(itl) = s.timing.itl_ms {
                    b.push(itl);
                }
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
        if ttft_missed && !out.iter().any(|x| x.0) {
            out.iter_mut().for_each(|x| x.0 = true);
        }
        if itl_missed && !out.iter().any(|x| x.1) {
            out.iter_mut().for_each(|x| x.1 = true);
        }
        out
    }

    /// A configuration no fleet size makes meet the objectives.
    pub fn infeasible(&self, name: &str, what: String, s: &Settings, inf: Infeasible) -> Variant {
        Variant {
            name: name.to_owned(),
            what,
            settings: *s,
            disaggregated: s.disaggregated,
            steps: Vec::new(),
            bindings: Vec::new(),
            prefill_gpu_hours: 0.0,
            decode_gpu_hours: 0.0,
            drain_s: 0.0,
            peak_prefill_gpus: 0,
            peak_decode_gpus: 0,
            predicted_usd_per_mtok: None,
            simulated: None,
            agreement: None,
            slo_met: false,
            headroom: Vec::new(),
            infeasible: Some(inf),
            rounds: 0,
        }
    }

    /// A fitted (or fixed) fleet and its simulation as a [`Variant`].
    #[allow(
        clippy::too_many_arguments,
        reason = "assembles one result from the fit's parts"
    )]
    pub fn finish(
        &self,
        name: &str,
        what: String,
        s: &Settings,
        work: &[Work],
        steps: Vec<Step>,
        sizes: &[(Size, Size)],
        report: RunReport,
        met: bool,
        rounds: usize,
    ) -> Variant {
        let gpe = f64::from(self.profile.gpus_per_engine);
        let disagg = steps.iter().any(|x| x.prefill > 0);
        let mut by: std::collections::BTreeMap<(String, Binding, String), f64> = Default::default();
        for (k, st) in steps.iter().enumerate() {
            let h = self.step_len(&steps, k) / 3_600_000.0 * gpe;
            let (ps, ds) = sizes
                .get(k)
                .copied()
                .unwrap_or((Size::of(0, Binding::Minimum), Size::of(0, Binding::Minimum)));
            if disagg {
                *by.entry(("prefill".into(), ps.binding, ps.describe("prefill")))
                    .or_default() += st.prefill as f64 * h;
            }
            let pool = if disagg { "decode" } else { "aggregated" };
            *by.entry((pool.into(), ds.binding, ds.describe(pool)))
                .or_default() += st.decode as f64 * h;
        }
        let (planned_pre, planned_dec) = self.gpu_hours(&steps);
        let total_h = (planned_pre + planned_dec).max(1e-12);
        let (pre, dec, tail_ms) = self.predicted_hours(&steps, work, s);
        let predicted = self.predicted_usd(pre + dec);
        let agreement = (predicted > 0.0).then(|| report.sim.usd_per_mtok / predicted);
        let mut bindings: Vec<BindingShare> = by
            .into_iter()
            .map(|((pool, binding, term), h)| BindingShare {
                pool,
                binding,
                term: if binding == Binding::Simulation {
                    format!(
                        "{} grown after its simulation missed an objective",
                        term.split(' ').next().unwrap_or("pool")
                    )
                } else {
                    term
                },
                share: h / total_h,
            })
            .collect();
        bindings.sort_by(|a, b| b.share.total_cmp(&a.share));
        Variant {
            name: name.to_owned(),
            what,
            settings: Settings {
                disaggregated: disagg,
                ..*s
            },
            disaggregated: disagg,
            peak_prefill_gpus: steps.iter().map(|x| x.prefill as u64).max().unwrap_or(0)
                * gpe as u64,
            peak_decode_gpus: steps.iter().map(|x| x.decode as u64).max().unwrap_or(0) * gpe as u64,
            bindings,
            steps,
            prefill_gpu_hours: pre,
            decode_gpu_hours: dec,
            drain_s: tail_ms / 1000.0,
            predicted_usd_per_mtok: Some(predicted),
            headroom: self.headroom(&report),
            simulated: Some(report),
            agreement,
            slo_met: met,
            infeasible: None,
            rounds,
        }
    }
}

/// One fleet out of a round's options: each pool grown as the option that
/// grew it has it (every option starts from the same fleet).
fn together(options: Vec<Fit>) -> Option<Fit> {
    options.into_iter().reduce(|mut a, b| {
        take_larger(&mut a.steps, &mut a.sizes, &b.steps, &b.sizes);
        a
    })
}

/// Per interval and pool, the larger of `steps` and `other` (with what set it).
pub(super) fn take_larger(
    steps: &mut [Step],
    sizes: &mut [(Size, Size)],
    other: &[Step],
    other_sizes: &[(Size, Size)],
) {
    let mine = steps.iter_mut().zip(sizes.iter_mut());
    for ((s, z), (o, oz)) in mine.zip(other.iter().zip(other_sizes)) {
        if o.prefill > s.prefill {
            s.prefill = o.prefill;
            z.0 = oz.0;
        }
        if o.decode > s.decode {
            s.decode = o.decode;
            z.1 = oz.1;
        }
    }
}

/// The worst miss, as `ttft-p90 1.23x`.
fn worst_of(miss: &Misses) -> String {
    miss.iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or_else(String::new, |(k, x)| format!("{k} {x:.2}x"))
}

/// One correction's growth of a pool that missed: a fifth, at least one.
pub(super) fn grown_by_a_fifth(n: usize) -> usize {
    n + (n / 5).max(1)
}
