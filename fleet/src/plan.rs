//! The planner: from a trace (or a replay's observed hits), a GPU profile,
//! latency objectives and a cost target, *decide* the cheapest serving
//! configuration that meets every objective over the whole trace — coupled or
//! P/D, pool sizes per interval, routing, cache mode, chunk budget, P/D
//! threshold, `--max-num-seqs` — each candidate verified by simulating it on
//! the same trace; then compare it with baselines that stand on their own and
//! attribute the saving (`docs/planning.md`).
//!
//! - [`demand`]: the traffic mix per interval after the expected cache hits;
//! - [`size`]: replica counts from the profile (M/G/c prefill, decode batch at
//!   the ITL target, coupled engines);
//! - [`fit`]: one configuration sized, simulated and corrected;
//! - [`drain`]: the tail after the last interval the prediction pays for;
//! - [`baseline`]: the no-reuse fleet by Dynamo's SLA-planner formulas;
//! - [`search`]: the search over configurations, and spending headroom;
//! - [`sample`], [`whole`]: a large trace searched on a session sample, the
//!   choice scaled up and simulated on the whole trace;
//! - [`progress`]: what a long plan reports as it goes;
//! - [`answer`]: verdict, waterfall, ranked changes, API price;
//! - [`output`]: the report, replica counts and plot;
//! - [`deploy`]: Dynamo and llm-d manifests of the chosen configuration.

pub mod answer;
pub mod baseline;
pub mod demand;
pub mod deploy;
pub mod drain;
pub mod fit;
pub mod output;
pub mod progress;
pub mod sample;
pub mod search;
pub mod size;
pub mod whole;

use crate::sim::{CacheMode, Policy, RunReport, SimConfig, SimError, oracle_hits_within};
use crate::trace::{RequestId, Trace};
use answer::{ApiComparison, Change, WaterfallStep};
use demand::Interval;
use fit::Planner;
use search::{Search, SearchStep};
use serde::Serialize;
use size::{Binding, Infeasible, Slo};
use tether_rank_engine::engine::ContextLimit;
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
    /// Input written to the cache, when the API prices it apart (Anthropic's
    /// cache writes): the uncached input of every turn a later turn reuses.
    pub cache_write: Option<f64>,
    /// Output.
    pub output: f64,
}

/// Where headroom under the target is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spend {
    /// The best interactivity (output tokens/s per stream) within the target.
    Interactivity,
}

/// Everything a plan is made from.
#[derive(Clone, Debug)]
pub struct PlanConfig {
    /// Routing, cache, engine and P/D settings the search starts from.
    pub sim: SimConfig,
    /// Latency objectives.
    pub slo: Slo,
    /// Cost target, if any.
    pub target: Option<Target>,
    /// API prices to compare with, if any.
    pub api_price: Option<ApiPrice>,
    /// Planning interval, ms (simulated time).
    pub interval_ms: f64,
    /// Simulation rounds per configuration to correct the profile's guess.
    pub rounds: usize,
    /// Observed cache hits per trace request (from a replay), instead of simulated ones.
    pub observed_hits: Option<Vec<Option<u32>>>,
    /// Hold every interval to the objectives (default: the whole trace).
    pub per_interval: bool,
    /// Plan a trace with requests over the profile's `max_model_len`, those
    /// refused as the engine refuses them (default: refuse the trace).
    pub cap_context: bool,
    /// Spend headroom under the target on this.
    pub spend: Option<Spend>,
    /// Search the configuration space (false: size the starting configuration only).
    pub search: bool,
}

/// How a plan runs, apart from what it plans.
#[derive(Clone, Copy)]
pub struct RunOptions<'o> {
    /// A trace of more than twice this many requests is searched on a
    /// session sample of about this many, the choice verified on the whole
    /// trace (0: always search the whole trace).
    pub sample_requests: usize,
    /// Simulate a sampled plan's choice on the whole trace at the sample's
    /// coarser KV blocks (a quarter of the per-block work; each turn may
    /// cache up to one block less) instead of the trace's own.
    pub coarse_whole: bool,
    /// Where progress goes.
    pub observer: &'o dyn progress::Observer,
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
    /// Prompts longer than the profile's context window.
    #[error(
        "{count} of {requests} requests need more than the profile's max_model_len of {limit} tokens (the longest {longest}): the engine refuses them; pass --cap-context to plan the rest with those refused, or use a profile with a longer context"
    )]
    TooLong {
        /// Requests over the window.
        count: u64,
        /// Requests in the trace.
        requests: u64,
        /// The window.
        limit: u64,
        /// Longest prompt + output.
        longest: u64,
    },
}

/// One configuration the planner can choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Settings {
    /// Prefill and decode pools (else coupled engines).
    pub disaggregated: bool,
    /// Routing policy.
    pub policy: Policy,
    /// Cache mode.
    pub cache: CacheMode,
    /// vLLM `--max-num-batched-tokens` (the chunk budget).
    pub max_num_batched_tokens: usize,
    /// Prefill remotely above this many uncached tokens.
    pub pd_threshold_tokens: u64,
    /// vLLM `--max-num-seqs`.
    pub max_num_seqs: usize,
}

impl Settings {
    /// In a few words.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{}, {} + {}, --max-num-batched-tokens {}, --max-num-seqs {}",
            if self.disaggregated { "P/D" } else { "coupled" },
            self.policy.name(),
            self.cache.name(),
            self.max_num_batched_tokens,
            self.max_num_seqs
        );
        if self.disaggregated {
            s += &format!(", P/D threshold {}", self.pd_threshold_tokens);
        }
        s
    }
}

/// A pool's GPU-hours set by one constraint.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BindingShare {
    /// `prefill`, `decode` or `aggregated`.
    pub pool: String,
    /// The constraint.
    pub binding: Binding,
    /// In engineering terms (`decode ITL at batch 180 (…)`).
    pub term: String,
    /// Share of the variant's GPU-hours.
    pub share: f64,
}

/// One planned fleet.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    /// Short name.
    pub name: String,
    /// What it is.
    pub what: String,
    /// Its configuration.
    pub settings: Settings,
    /// Disaggregated (prefill and decode pools) or not.
    pub disaggregated: bool,
    /// Replicas per interval (start ms, prefill, decode; decode = aggregated when not disaggregated).
    pub steps: Vec<crate::sim::Step>,
    /// What set each pool's size, by GPU-hours share, largest first.
    pub bindings: Vec<BindingShare>,
    /// Prefill GPU-hours planned.
    pub prefill_gpu_hours: f64,
    /// Decode (or aggregated) GPU-hours planned.
    pub decode_gpu_hours: f64,
    /// Predicted drain after the last interval, s (its GPU-hours are in the
    /// two above): the fleet serves until the last request's last token.
    pub drain_s: f64,
    /// Most prefill GPUs at once.
    pub peak_prefill_gpus: u64,
    /// Most decode (or aggregated) GPUs at once.
    pub peak_decode_gpus: u64,
    /// Predicted $/Mtok: planned GPU-hours (drain included) × price ÷ the trace's tokens (none when no fleet was sized).
    pub predicted_usd_per_mtok: Option<f64>,
    /// The simulation of the final plan.
    pub simulated: Option<RunReport>,
    /// Simulated $/Mtok ÷ predicted (must be within 1 ± 0.1).
    pub agreement: Option<f64>,
    /// Whether the simulation met every objective.
    pub slo_met: bool,
    /// Simulated ÷ objective, per objective (< 1 = headroom).
    pub headroom: Vec<(String, f64)>,
    /// Why no fleet of this configuration meets the objectives, if none does.
    pub infeasible: Option<Infeasible>,
    /// Simulation runs it took.
    pub rounds: usize,
}

impl Variant {
    /// Simulated $/Mtok, else predicted; `None` when nothing was sized.
    pub fn usd_per_mtok(&self) -> Option<f64> {
        self.simulated
            .as_ref()
            .map(|s| s.sim.usd_per_mtok)
            .or(self.predicted_usd_per_mtok)
            .filter(|x| x.is_finite())
    }

    /// Meets every objective in simulation.
    pub fn meets(&self) -> bool {
        self.slo_met && self.infeasible.is_none() && self.simulated.is_some()
    }

    /// The largest miss (simulated ÷ objective), 0 when none.
    pub fn worst_miss(&self) -> f64 {
        self.headroom
            .iter()
            .map(|(_, x)| *x)
            .filter(|x| *x > 1.0)
            .fold(0.0, f64::max)
    }

    /// GPU-hours planned.
    pub fn gpu_hours(&self) -> f64 {
        self.prefill_gpu_hours + self.decode_gpu_hours
    }
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
    /// The demand the chosen configuration is sized for, per interval.
    pub demand: Vec<Interval>,
    /// Every configuration sized and simulated: the baselines first, then the search's.
    pub variants: Vec<Variant>,
    /// Index of the chosen configuration in `variants`, if any meets the objectives.
    pub chosen: Option<usize>,
    /// Index of the runner-up (the next cheapest meeting the objectives).
    pub runner_up: Option<usize>,
    /// What each step of the search chose and saved.
    pub search: Vec<SearchStep>,
    /// Candidates skipped because their profile-only cost was far above the best simulated one.
    pub pruned: usize,
    /// Every other configuration tried, by simulated $/Mtok: what it would change.
    pub changes: Vec<Change>,
    /// From the no-reuse plan to the chosen one, step by step.
    pub waterfall: Vec<WaterfallStep>,
    /// Target cost for this trace's tokens, $/Mtok blended, if a target was given.
    pub target_usd_per_mtok: Option<f64>,
    /// Whether the chosen configuration meets the target and the objectives.
    pub meets_target: Option<bool>,
    /// Target − the chosen configuration's cost, $/Mtok, when under the target.
    pub headroom_usd_per_mtok: Option<f64>,
    /// The answer in a sentence: met, or what binds.
    pub verdict: String,
    /// The trace priced by an API, if API prices were given.
    pub api: Option<ApiComparison>,
    /// Prompt, cached prompt and output tokens under the chosen configuration.
    pub tokens: TokenCounts,
    /// Requests over the profile's `max_model_len`, refused (with `--cap-context`).
    pub too_long: u64,
    /// The session sample the search ran on, for a large trace (its variants'
    /// figures are the sample's; the chosen one is simulated on the whole trace).
    pub sample: Option<sample::SampleInfo>,
}

impl PlanReport {
    /// The chosen variant.
    pub fn chosen(&self) -> Option<&Variant> {
        self.chosen.and_then(|i| self.variants.get(i))
    }
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

/// Requests whose prompt + output exceed the window, and the longest.
fn too_long(trace: &Trace, limit: ContextLimit) -> (u64, u64) {
    let mut count = 0;
    let mut longest = 0;
    for r in trace.requests() {
        let (p, o) = r.asked_tokens();
        if limit.check(p, o).is_err() {
            count += 1;
            longest = longest.max(p + o);
        }
    }
    (count, longest)
}

/// Plans `trace` on `profile` (see the module docs), searching the whole
/// trace and reporting no progress.
pub fn plan(trace: &Trace, profile: &Profile, cfg: &PlanConfig) -> Result<PlanReport, PlanError> {
    let run = RunOptions {
        sample_requests: 0,
        coarse_whole: false,
        observer: &progress::Quiet,
    };
    plan_with(trace, profile, cfg, &run)
}

/// [`plan`], a large trace searched on a sample as `run` says, progress to its observer.
pub fn plan_with(
    trace: &Trace,
    profile: &Profile,
    cfg: &PlanConfig,
    run: &RunOptions,
) -> Result<PlanReport, PlanError> {
    let obs = run.observer;
    if trace.requests().is_empty() {
        return Err(PlanError::Empty);
    }
    if cfg.interval_ms.is_nan() || cfg.interval_ms < 1000.0 {
        return Err(PlanError::Setting(
            "the planning interval must be at least 1 s".into(),
        ));
    }
    let (over, longest) = too_long(trace, ContextLimit(profile.max_model_len));
    if over > 0 && !cfg.cap_context {
        return Err(PlanError::TooLong {
            count: over,
            requests: trace.requests().len() as u64,
            limit: profile.max_model_len.unwrap_or(0),
            longest,
        });
    }
    let k = sample::every(trace, run.sample_requests);
    if k > 1 && cfg.observed_hits.is_none() {
        let mut r = whole::plan(trace, profile, cfg, run, k)?;
        r.too_long = over;
        return Ok(r);
    }
    let p = planner(trace, profile, cfg, obs)?;
    let (mut report, work) = exact(&p, obs)?;
    report.too_long = over;
    answer::complete(&mut report, &p, cfg, &work);
    Ok(report)
}

/// The engine block size of `cfg`'s simulations of `trace`.
fn engine_block(trace: &Trace, cfg: &PlanConfig) -> usize {
    if cfg.sim.engine.block_size == 0 {
        trace.block_size() as usize
    } else {
        cfg.sim.engine.block_size
    }
}

/// The planner of `trace`.
fn planner<'a>(
    trace: &'a Trace,
    profile: &'a Profile,
    cfg: &'a PlanConfig,
    obs: &'a dyn progress::Observer,
) -> Result<Planner<'a>, PlanError> {
    let window = ContextLimit(profile.max_model_len);
    let hits = oracle_hits_within(trace, engine_block(trace, cfg), window);
    Planner::new(trace, profile, cfg, hits, obs)
}

/// The configuration the search starts from.
fn start(cfg: &PlanConfig) -> Settings {
    Settings {
        disaggregated: true,
        policy: cfg.sim.policy,
        cache: cfg.sim.cache,
        max_num_batched_tokens: cfg.sim.engine.max_num_batched_tokens,
        pd_threshold_tokens: cfg.sim.pd.threshold_tokens,
        max_num_seqs: cfg.sim.engine.max_num_seqs,
    }
}

/// Candidates the search is expected to evaluate (the progress bar's length).
const EXPECTED_CANDIDATES: u64 = 28;

/// Baselines, search and choice on `trace` itself; the report without its
/// derived parts, and the chosen configuration's work (its hits).
fn exact(
    p: &Planner,
    obs: &dyn progress::Observer,
) -> Result<(PlanReport, Vec<demand::Work>), PlanError> {
    let (trace, cfg) = (p.trace, p.cfg);
    let start = start(cfg);
    obs.phase(
        "search",
        if cfg.search { EXPECTED_CANDIDATES } else { 6 },
        "candidates",
    );
    let mut s = Search::new(p);
    s.baselines(&start)?;
    if cfg.search {
        s.run(&start)?;
    }
    let target_usd = cfg.target.map(|t| answer::blend(t, trace));
    if let (Some(Spend::Interactivity), Some(t)) = (cfg.spend, target_usd) {
        s.spend_on_interactivity(t)?;
    }
    let (chosen, runner_up) = s.choose(target_usd, cfg.spend);
    let work = match chosen.and_then(|c| s.evaluated.get(c)) {
        Some(c) => {
            let settings = c.settings;
            s.work(&settings)?
        }
        None => Vec::new(),
    };
    obs.at(s.evaluated.len() as u64);
    let Search {
        evaluated: variants,
        steps: search,
        pruned,
        ..
    } = s;
    let report = PlanReport {
        slo: cfg.slo,
        target: cfg.target,
        interval_s: cfg.interval_ms / 1000.0,
        demand: Vec::new(),
        variants,
        chosen,
        runner_up,
        search,
        pruned,
        changes: Vec::new(),
        waterfall: Vec::new(),
        target_usd_per_mtok: target_usd,
        meets_target: None,
        headroom_usd_per_mtok: None,
        verdict: String::new(),
        api: None,
        tokens: TokenCounts::default(),
        too_long: 0,
        sample: None,
    };
    Ok((report, work))
}

/// The request ids that are not their agent's last turn (a later turn reads
/// what they wrote to the cache).
pub(crate) fn followed(trace: &Trace) -> Vec<bool> {
    let mut out = vec![true; trace.requests().len()];
    for a in trace.agents() {
        if let Some(RequestId(last)) = a.requests.last()
            && let Some(x) = out.get_mut(*last as usize)
        {
            *x = false;
        }
    }
    out
}

#[cfg(test)]
mod tests;
