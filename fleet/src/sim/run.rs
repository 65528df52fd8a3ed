//! The discrete-event loop: arrivals in trace order, each routed by the
//! policy and submitted to a simulated engine (`tether_rank_engine::engine`, one per
//! rank, on `tether-engine`'s real retention policy); engines advance lazily —
//! only when a request reaches them, when a load view needs them current, or
//! when a prefill they run hands its KV to a decode rank.
//!
//! Time is the trace's (ms from its first session start). A load view of
//! requests in flight is kept exact at every arrival: each engine is woken at
//! [`Engine::next_finish_hint`], a time before which none of its requests
//! finishes, so only engines with something finishing are advanced.

use super::config::{CacheMode, FleetShape, Migrate, Policy, SimConfig};
use super::identity::{Identities, request_key};
use super::prompt::{BlockSizeError, PromptBlocks};
use super::report::{
    Balance, PdSummary, ResidentSummary, RetentionSummary, Returning, RunReport, Simulation,
};
use super::route::{RouteInput, Router};
use crate::quantile::{Dist, histogram, record_ms};
use crate::report::observe::{Clock, Observation, Outcome as Observed, Served, Timing};
use crate::trace::{BlockRef, RequestId, Trace};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use tether_engine::cache::snapshot_boundaries;
use tether_engine::{BlockHash, TurnMarker};
use tether_placement::{Held, How, Knows, MoveCost, Rule, disaggregate, resident_load};
use tether_rank_engine::engine::{
    ContextLimit, Engine, EngineConfig, Event, Outcome, SimMs, SimRequest,
};
use tether_rank_engine::latency::LatencyModel;
use tether_rank_engine::profile::Profile;
use thiserror::Error;

mod rebalance;

/// Why a run could not start.
#[derive(Debug, Error)]
pub enum SimError {
    /// The trace has no requests.
    #[error("the trace has no requests: nothing to simulate")]
    Empty,
    /// Some session has no start time, so arrivals are unknown.
    #[error(
        "session `{0}` has no start time: this trace has no shared timeline (import AgentX runs with --stagger-ms N)"
    )]
    NoTimeline(String),
    /// The engine block size does not fit the trace.
    #[error(transparent)]
    BlockSize(#[from] BlockSizeError),
    /// The fleet has no ranks.
    #[error("the fleet needs at least one {0} rank")]
    NoRanks(&'static str),
    /// The oracle is defined on an aggregated fleet only.
    #[error("the oracle runs on an aggregated fleet only")]
    OracleDisaggregated,
    /// A setting is out of range.
    #[error("{0}")]
    Setting(String),
    /// An engine refused its configuration.
    #[error("engine configuration: {0}")]
    Engine(String),
}

/// Total order on simulated times for the event heap.
#[derive(Clone, Copy, Debug, PartialEq)]
struct T(f64);
impl Eq for T {}
impl PartialOrd for T {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for T {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

const DECODE: usize = 0;
const PREFILL: usize = 1;

/// One pool of ranks (decode or aggregated; prefill).
struct Pool {
    name: &'static str,
    engines: Vec<Engine>,
    cfg: EngineConfig,
    advanced: Vec<SimMs>,
    wake: Vec<SimMs>,
    inflight: Vec<f64>,
    inflight_total: f64,
    polled: Vec<f64>,
    polled_prefill: Vec<f64>,
    /// Device KV in use per rank at the last poll (`kv_usage`, 0–1).
    polled_kv: Vec<f64>,
    /// Each rank's busy share at the last poll (`tether_placement::busy`).
    polled_busy: Vec<f64>,
    requests: Vec<u64>,
    router: Router,
    /// Keep a wake per engine (a load view needs in-flight counts exact, or
    /// finished prefills must hand over on time).
    wakes: bool,
    active: Vec<bool>,
    /// Per rank, the blocks an unlimited cache would hold (when tracked).
    seen: Vec<HashSet<BlockHash>>,
    snaps: Vec<HashSet<BlockHash>>,
}

/// Per trace request.
#[derive(Clone, Copy)]
struct Req {
    arrival: SimMs,
    decode: u32,
    prefill: u32,
    returning: bool,
    reusable: u32,
    /// Cache hits of its prefill on the prefill pool.
    prefill_hits: u32,
    /// The pool of its prefill leg (`PREFILL`, or `DECODE` for a migration
    /// whose leg runs on the state's old home); `NO_LEG` without one.
    leg_pool: u8,
    /// Its prefill leg has handed over.
    handed: bool,
    /// Migrated by a pull: its transferred tokens are saved prefill.
    pulled: bool,
}

const NO_LEG: u8 = u8::MAX;

/// A finished prefill whose KV goes to its decode rank.
struct Handoff {
    req: u32,
    at: SimMs,
    /// Prompt tokens the prefill rank found in its cache.
    hits: usize,
}

struct Totals {
    finished: u64,
    refused: u64,
    too_long: u64,
    failed: u64,
    prompt: u64,
    output: u64,
    hits: u64,
    computed: u64,
    returning: Returning,
    reusable: u64,
    avoidable: u64,
    avoidable_returning: u64,
    remote: u64,
    local: u64,
    /// P/D by cost: requests over the threshold prefilled on their decode holder.
    pd_kept_local: u64,
    transferred: u64,
    transfer_ms: f64,
    resident: ResidentSummary,
    migrate_ms: f64,
    ttft: hdrhistogram::Histogram<u64>,
    tpot: hdrhistogram::Histogram<u64>,
    e2e: hdrhistogram::Histogram<u64>,
    first_arrival: SimMs,
    last_token: SimMs,
}

/// Result of [`simulate`]: the report and, when asked, one observation per
/// finished request — the same record a replay keeps, on the simulated clock.
#[derive(Debug)]
pub struct RunOutput {
    /// The run's report.
    pub report: RunReport,
    /// Per finished request, in finishing order (empty unless asked for):
    /// sent at its arrival, served by its (decode) rank, timed by the simulation.
    pub records: Vec<Observation>,
    /// Simulated busy seconds per engine ([`engine_name`] `#0`), every pool.
    pub busy_s: std::collections::BTreeMap<String, f64>,
    /// The routed pool (decode or aggregated): its ranks' names and their
    /// engine configuration.
    pub routed: (Vec<String>, EngineConfig),
}

/// The name a simulated rank goes by in observations and reports: its pool
/// (`rank` in an aggregated fleet, `decode`, `prefill`) and index, e.g. `decode-3`.
pub fn engine_name(pool: &str, rank: usize) -> String {
    format!("{pool}-{rank}")
}

/// Progress callback: requests placed so far.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Runs `trace` through the fleet `cfg` describes, ranks timed by `profile`.
/// `oracle_hits` is what the oracle's infinite cache serves on this trace
/// ([`oracle_hits`]); `records` keeps per-request records.
pub fn simulate(
    trace: &Trace,
    profile: &Profile,
    cfg: &SimConfig,
    oracle_hits: &[u32],
    records: bool,
    progress: Option<Progress>,
) -> Result<RunOutput, SimError> {
    let started = std::time::Instant::now();
    let n = trace.requests().len();
    if n == 0 {
        return Err(SimError::Empty);
    }
    if let Some(s) = trace.sessions().iter().find(|s| s.start_ms.is_none()) {
        return Err(SimError::NoTimeline(s.id.clone()));
    }
    if cfg.policy == Policy::Oracle && cfg.fleet.is_disaggregated() {
        return Err(SimError::OracleDisaggregated);
    }
    if cfg.fleet.decode == 0 {
        return Err(SimError::NoRanks(if cfg.fleet.is_disaggregated() {
            "decode"
        } else {
            "aggregated"
        }));
    }
    if cfg.balance_factor.is_nan() || cfg.balance_factor <= 1.0 {
        return Err(SimError::Setting(format!(
            "balance factor {} must be greater than 1",
            cfg.balance_factor
        )));
    }
    let rb = cfg.resident_bound;
    if rb.factor.is_nan() || rb.factor <= 1.0 || rb.floor.is_nan() || rb.floor < 0.0 {
        return Err(SimError::Setting(format!(
            "tether-resident's bound: factor {} must be greater than 1 and floor {} non-negative",
            rb.factor, rb.floor
        )));
    }
    let w = cfg.resident_busy_weight;
    if !(0.0..=1.0).contains(&w) {
        return Err(SimError::Setting(format!(
            "tether-resident's busy weight {w} must be from 0 to 1"
        )));
    }
    if let Some(r) = cfg.rebalance
        && (r.kv_factor.is_nan() || r.kv_factor <= 1.0)
    {
        return Err(SimError::Setting(format!(
            "rebalancing's KV factor {} must be greater than 1",
            r.kv_factor
        )));
    }
    if cfg.candidates == 0 {
        return Err(SimError::Setting(
            "tether-resident needs at least 1 candidate".into(),
        ));
    }
    if cfg.load_poll_ms.is_nan() || cfg.load_poll_ms <= 0.0 {
        return Err(SimError::Setting(
            "load poll interval must be positive".into(),
        ));
    }
    let blocks = PromptBlocks::new(trace, engine_block(trace, cfg))?;
    let engine_cfg = engine_config(trace, profile, cfg)?;
    let model = LatencyModel::new(profile.clone());
    let store = trace.blocks();
    let ids = Identities::derive(trace, &cfg.identity);
    let order = trace.by_arrival();
    if cfg.speedup.is_nan() || cfg.speedup <= 0.0 || cfg.speedup.is_infinite() {
        return Err(SimError::Setting(format!(
            "speedup {} must be positive",
            cfg.speedup
        )));
    }
    let speedup = cfg.speedup;
    let arrival = |id: RequestId| trace.arrival_ms(id).unwrap_or(0) as f64 / speedup;

    let pd = cfg.fleet.is_disaggregated();
    let mut pools: Vec<Pool> = Vec::new();
    for (p, count) in [(DECODE, cfg.fleet.decode), (PREFILL, cfg.fleet.prefill)] {
        if p == PREFILL && !pd {
            break;
        }
        let mut pcfg = engine_cfg.clone();
        if p == PREFILL && cfg.policy != Policy::TetherResident {
            // A prefill rank keeps no retention pins (its prefixes are cached
            // LRU); its KV leaves with the request. Under `tether-resident` it
            // retains like a decode rank: session-affine prefill needs a
            // holder to return to.
            pcfg.policy.retention = false;
            pcfg.policy.host_bytes = 0;
        }
        let engines = (0..count)
            .map(|_| Engine::try_new(pcfg.clone(), model.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SimError::Engine(e.to_string()))?;
        let policy = if p == PREFILL && cfg.policy != Policy::TetherResident {
            Policy::LeastLoaded
        } else {
            cfg.policy
        };
        let name = if p == PREFILL {
            "prefill"
        } else if pd {
            "decode"
        } else {
            "rank"
        };
        let router = Router::new(
            policy,
            name,
            count,
            cfg.fallbacks,
            tether_placement::LoadBound {
                factor: cfg.balance_factor,
                floor: cfg.balance_floor,
            },
            cfg.prefix,
            (policy == Policy::Prefix).then_some((store, trace.block_size())),
        );
        let track = cfg.track_reusable && p == DECODE;
        pools.push(Pool {
            name,
            engines,
            cfg: pcfg,
            advanced: vec![0.0; count],
            wake: vec![f64::NAN; count],
            inflight: vec![0.0; count],
            inflight_total: 0.0,
            polled: vec![0.0; count],
            polled_prefill: vec![0.0; count],
            polled_kv: vec![0.0; count],
            polled_busy: vec![0.0; count],
            requests: vec![0; count],
            router,
            wakes: p == PREFILL || policy.reads_inflight() || policy == Policy::TetherResident,
            active: vec![true; count],
            seen: if track {
                vec![HashSet::new(); count]
            } else {
                Vec::new()
            },
            snaps: if track {
                vec![HashSet::new(); count]
            } else {
                Vec::new()
            },
        });
    }
    let mut sim = Sim {
        trace,
        cfg,
        pools,
        heap: BinaryHeap::new(),
        reqs: vec![
            Req {
                arrival: 0.0,
                decode: u32::MAX,
                prefill: u32::MAX,
                returning: false,
                reusable: 0,
                prefill_hits: 0,
                leg_pool: NO_LEG,
                handed: false,
                pulled: false,
            };
            n
        ],
        blocks,
        path: Vec::new(),
        blocks_buf: Vec::new(),
        events: Vec::new(),
        handoffs: Vec::new(),
        limit: ContextLimit(profile.max_model_len),
        tot: Totals {
            finished: 0,
            refused: 0,
            too_long: 0,
            failed: 0,
            prompt: 0,
            output: 0,
            hits: 0,
            computed: 0,
            returning: Returning::default(),
            reusable: 0,
            avoidable: 0,
            avoidable_returning: 0,
            remote: 0,
            local: 0,
            pd_kept_local: 0,
            transferred: 0,
            transfer_ms: 0.0,
            resident: ResidentSummary::default(),
            migrate_ms: 0.0,
            ttft: histogram(),
            tpot: histogram(),
            e2e: histogram(),
            first_arrival: arrival(order[0]),
            last_token: arrival(order[0]),
        },
        records: if records {
            Vec::with_capacity(n)
        } else {
            Vec::new()
        },
        oracle: cfg.policy == Policy::Oracle,
        oracle_hits,
        rebalance: rebalance::Rebalancer::new(n),
        kv_imbalance: Vec::new(),
    };
    // Which requests are a session's first.
    let mut first_of_session = vec![true; trace.sessions().len()];
    for (i, &id) in order.iter().enumerate() {
        let r = trace.request(id);
        let s = r.session.0 as usize;
        sim.reqs[id.0 as usize].returning = !first_of_session[s];
        first_of_session[s] = false;
        let _ = i;
    }
    let span_end = arrival(*order.last().unwrap_or(&order[0]));
    let steps = &cfg.fleet.steps;
    let mut next_step = 0usize;
    let mut gpu_ms = 0.0f64;
    let gpe = f64::from(profile.gpus_per_engine);
    let mut active_since = sim.tot.first_arrival;
    if let Some(s0) = steps.first() {
        sim.set_active(s0.decode, s0.prefill, active_since);
        next_step = 1;
    }
    let poll = matches!(cfg.policy, Policy::TetherLoad | Policy::TetherResident);
    let mut next_poll = sim.tot.first_arrival;
    let mut next = 0usize;
    loop {
        let ta = order.get(next).map_or(f64::INFINITY, |&id| arrival(id));
        let tw = sim.peek_wake();
        let ts = steps
            .get(next_step)
            .map_or(f64::INFINITY, |s| s.start_ms.max(sim.tot.first_arrival));
        let tp = if poll && next < n {
            next_poll
        } else {
            f64::INFINITY
        };
        let t = ta.min(tw).min(ts).min(tp);
        if t == f64::INFINITY {
            break;
        }
        if tw <= t {
            sim.wake_one();
            continue;
        }
        if ts <= t {
            gpu_ms += sim.active_ranks() as f64 * gpe * (t - active_since);
            active_since = t;
            let s = steps[next_step];
            sim.set_active(s.decode, s.prefill, t);
            next_step += 1;
            continue;
        }
        if tp <= t {
            sim.poll(t);
            next_poll = t + cfg.load_poll_ms;
            continue;
        }
        let id = order[next];
        next += 1;
        sim.arrive(id, t, &ids)?;
        if let Some(p) = progress
            && next.is_multiple_of(4096)
        {
            p(next as u64);
        }
    }
    sim.drain();
    if let Some(p) = progress {
        p(n as u64);
    }
    let end = sim
        .tot
        .last_token
        .max(span_end)
        .max(cfg.fleet.until_ms.unwrap_or(f64::NEG_INFINITY));
    gpu_ms += sim.active_ranks() as f64 * gpe * (end - active_since);
    Ok(sim.finish(profile, gpu_ms, end, started))
}

/// The engine block size of a run: the setting, or the trace's block size.
fn engine_block(trace: &Trace, cfg: &SimConfig) -> usize {
    if cfg.engine.block_size == 0 {
        trace.block_size() as usize
    } else {
        cfg.engine.block_size
    }
}

/// Every rank's engine configuration.
fn engine_config(
    trace: &Trace,
    profile: &Profile,
    cfg: &SimConfig,
) -> Result<EngineConfig, SimError> {
    let mut s = cfg.engine;
    s.block_size = engine_block(trace, cfg);
    s.retention = cfg.cache != CacheMode::Lru;
    s.host_bytes = if cfg.cache == CacheMode::RetentionHost {
        if cfg.host_bytes == 0 {
            return Err(SimError::Setting(
                "the retention-host cache needs a host tier (host bytes > 0)".into(),
            ));
        }
        cfg.host_bytes
    } else {
        0
    };
    s.kv_link_gbps = if cfg.policy == Policy::Oracle {
        f64::INFINITY
    } else {
        cfg.pd.kv_link_gbps
    };
    let mut e = EngineConfig::for_profile(profile, &s);
    if e.policy.device_blocks == 0 {
        return Err(SimError::Setting(format!(
            "device KV of {} tokens holds no block of {} tokens",
            s.device_kv_tokens.unwrap_or(profile.max_kv_tokens),
            s.block_size
        )));
    }
    let h = cfg.hybrid;
    if h.state_bytes > 0 {
        e.policy.state_bytes = h.state_bytes;
    }
    if h.align_tokens > 0 {
        e.policy.state_align_tokens = h.align_tokens;
    }
    e.policy.checkpoint_every_tokens = h.checkpoint_tokens;
    e.policy
        .validate()
        .map_err(|err| SimError::Setting(format!("hybrid state: {err}")))?;
    Ok(e)
}

/// What the oracle's infinite cache serves of each request (indexed by
/// request): every block any earlier request (in arrival order) carried, in
/// whole engine blocks of the run's size.
pub fn oracle_hits(trace: &Trace, engine_block: usize) -> Vec<u32> {
    oracle_hits_within(trace, engine_block, ContextLimit(None))
}

/// [`oracle_hits`] on a fleet whose context window is `limit`: a request the
/// window refuses (prompt plus its output over it, as [`Sim`] and
/// `tether-rank` refuse it) is served nothing and leaves nothing behind, so
/// the oracle saves only what a fleet of that model could.
pub fn oracle_hits_within(trace: &Trace, engine_block: usize, limit: ContextLimit) -> Vec<u32> {
    let store = trace.blocks();
    let bt = trace.block_size() as u64;
    let be = engine_block.max(1) as u64;
    let mut seen = vec![false; store.node_count()];
    let mut out = vec![0u32; trace.requests().len()];
    let mut path = Vec::new();
    for id in trace.by_arrival() {
        let r = trace.request(id);
        if !within(limit, r) {
            continue;
        }
        store.path_into(r.blocks, &mut path);
        let mut blocks = 0u64;
        for node in &path {
            if !seen[node.node()] {
                break;
            }
            blocks += store.segment_len(*node) as u64;
        }
        for node in &path {
            seen[node.node()] = true;
        }
        let full = u64::from(r.input_tokens) / be * be;
        out[id.0 as usize] = (blocks * bt).min(full) as u32;
    }
    out
}

/// Whether a fleet with context window `limit` serves `req` at all: the replay
/// asks for the trace's output tokens (at least 1), and a rank whose window
/// that prompt plus output passes answers 400.
fn within(limit: ContextLimit, req: &crate::trace::Request) -> bool {
    let (prompt, asked) = req.asked_tokens();
    limit.check(prompt, asked).is_ok()
}

struct Sim<'a> {
    trace: &'a Trace,
    cfg: &'a SimConfig,
    /// The profile's context window, refused as `tether-rank` refuses it.
    limit: ContextLimit,
    pools: Vec<Pool>,
    heap: BinaryHeap<Reverse<(T, usize, u32)>>,
    reqs: Vec<Req>,
    blocks: PromptBlocks,
    path: Vec<BlockRef>,
    blocks_buf: Vec<BlockHash>,
    events: Vec<Event>,
    handoffs: Vec<Handoff>,
    tot: Totals,
    records: Vec<Observation>,
    oracle: bool,
    oracle_hits: &'a [u32],
    rebalance: rebalance::Rebalancer,
    /// At every poll, the busiest decode rank's KV in use over the mean, minus 1.
    kv_imbalance: Vec<f64>,
}

impl Sim<'_> {
    fn peek_wake(&mut self) -> f64 {
        while let Some(Reverse((T(t), p, r))) = self.heap.peek().copied() {
            if self.pools[p].wake[r as usize] == t {
                return t;
            }
            self.heap.pop();
        }
        f64::INFINITY
    }

    fn wake_one(&mut self) {
        if let Some(Reverse((T(t), p, r))) = self.heap.pop() {
            self.pools[p].wake[r as usize] = f64::NAN;
            self.advance(p, r as usize, t);
        }
    }

    fn active_ranks(&self) -> usize {
        self.pools
            .iter()
            .map(|p| p.active.iter().filter(|a| **a).count())
            .sum()
    }

    /// Scaling step: the first `decode` / `prefill` ranks of each pool are active.
    fn set_active(&mut self, decode: usize, prefill: usize, t: SimMs) {
        for (pi, want) in [(DECODE, decode), (PREFILL, prefill)] {
            let Some(pool) = self.pools.get_mut(pi) else {
                continue;
            };
            let want = want.min(pool.engines.len());
            for r in 0..pool.engines.len() {
                let on = r < want;
                if on && !pool.active[r] && pool.engines[r].next_wakeup().is_none() {
                    // A rank started afresh: an empty cache.
                    if let Ok(e) =
                        Engine::try_new(pool.cfg.clone(), pool.engines[r].model().clone())
                    {
                        pool.engines[r] = e;
                        pool.advanced[r] = 0.0;
                    }
                }
                pool.active[r] = on;
            }
            let name = pool.name;
            pool.router.set_active(name, (0..want).collect());
            let _ = t;
        }
    }

    /// The load-aware pick's view: every rank's running + waiting at `t`.
    fn poll(&mut self, t: SimMs) {
        for r in 0..self.pools[DECODE].engines.len() {
            self.advance(DECODE, r, t);
            let g = self.pools[DECODE].engines[r].gauges();
            self.pools[DECODE].polled[r] = (g.running + g.waiting) as f64;
            self.pools[DECODE].polled_prefill[r] = g.queued_prefill_tokens as f64;
            self.pools[DECODE].polled_busy[r] = self.pools[DECODE].engines[r].busy_share(t);
        }
        self.sample_kv_imbalance();
    }

    /// One sample of the decode pool's KV imbalance (`Balance::kv_imbalance_p95`):
    /// the busiest active rank's device KV in use over the mean, minus 1.
    fn sample_kv_imbalance(&mut self) {
        let pool = &mut self.pools[DECODE];
        for r in 0..pool.engines.len() {
            pool.polled_kv[r] = pool.engines[r].gauges().kv_usage;
        }
        let usage: Vec<f64> = (0..pool.engines.len())
            .filter(|&r| pool.active[r])
            .map(|r| pool.polled_kv[r])
            .collect();
        let mean = usage.iter().sum::<f64>() / usage.len().max(1) as f64;
        if mean > 0.0 {
            let max = usage.iter().copied().fold(0.0, f64::max);
            self.kv_imbalance.push(max / mean - 1.0);
        }
    }

    /// Whether tool-gap rebalancing runs (`SimConfig::rebalance`, `tether-resident`).
    fn rebalancing(&self) -> bool {
        self.cfg.rebalance.is_some() && self.cfg.policy == Policy::TetherResident
    }

    /// Advances one engine to `t` and handles what finished.
    fn advance(&mut self, p: usize, r: usize, t: SimMs) {
        let pool = &mut self.pools[p];
        let t = t.max(pool.advanced[r]);
        self.events.clear();
        pool.engines[r].advance(t, &mut self.events);
        pool.advanced[r] = t;
        let events = std::mem::take(&mut self.events);
        for ev in &events {
            match ev {
                Event::Done { id, .. } | Event::Failed { id, .. }
                    if self.rebalance.is_copy(*id) =>
                {
                    self.copy_landed(*id, matches!(ev, Event::Done { .. }));
                }
                Event::Done { id, outcome } => {
                    let q = *id as u32;
                    let pool = &mut self.pools[p];
                    pool.inflight[r] -= 1.0;
                    pool.inflight_total -= 1.0;
                    if self.is_leg(q, p, r) {
                        self.handoffs.push(Handoff {
                            req: q,
                            at: outcome.first_token,
                            hits: outcome.cached_tokens,
                        });
                    } else {
                        self.done(q, r, outcome);
                        if p == DECODE && self.rebalancing() {
                            self.rebalance_after(q, r, outcome.finished);
                        }
                    }
                }
                Event::Failed { id, .. } => {
                    let leg = self.is_leg(*id as u32, p, r);
                    let pool = &mut self.pools[p];
                    pool.inflight[r] -= 1.0;
                    pool.inflight_total -= 1.0;
                    self.tot.failed += 1;
                    if leg {
                        // Its decode leg was counted in flight on the decode rank.
                        let d = self.reqs[*id as usize].decode as usize;
                        self.pools[DECODE].inflight[d] -= 1.0;
                        self.pools[DECODE].inflight_total -= 1.0;
                    }
                }
                Event::First { .. } | Event::Token { .. } => {}
            }
        }
        self.events = events;
        self.reschedule(p, r);
        while let Some(h) = self.handoffs.pop() {
            self.hand_over(h);
        }
    }

    fn reschedule(&mut self, p: usize, r: usize) {
        let pool = &mut self.pools[p];
        if !pool.wakes {
            return;
        }
        if let Some(h) = pool.engines[r].next_finish_hint() {
            let h = h.max(pool.advanced[r]);
            if pool.wake[r] != h {
                pool.wake[r] = h;
                self.heap.push(Reverse((T(h), p, r as u32)));
            }
        } else {
            pool.wake[r] = f64::NAN;
        }
    }

    fn sim_request(&mut self, id: RequestId, max_tokens: usize, kv_in: usize) -> SimRequest {
        let r = self.trace.request(id);
        let (_, key) = request_key(self.trace, id);
        SimRequest {
            id: u64::from(id.0),
            hashes: std::mem::take(&mut self.blocks_buf),
            prompt_tokens: r.input_tokens as usize,
            max_tokens,
            marker: Some(TurnMarker {
                key,
                prompt_end: true,
                kind: r.opened_by,
                turn: None,
                retention_ms: None,
            }),
            stream: false,
            kv_in_tokens: kv_in,
        }
    }

    fn submit(&mut self, p: usize, r: usize, req: SimRequest, at: SimMs) -> bool {
        self.submit_at(p, r, req, at, at)
    }

    /// Submits at `now` a request that reaches the engine at `arrival` (≥
    /// `now`): the engine is advanced to `now` only, so requests arriving in
    /// between still go first (it keeps arrival order).
    fn submit_at(
        &mut self,
        p: usize,
        r: usize,
        req: SimRequest,
        now: SimMs,
        arrival: SimMs,
    ) -> bool {
        self.advance(p, r, now);
        let pool = &mut self.pools[p];
        let at = arrival.max(pool.advanced[r]);
        match pool.engines[r].submit(req, at) {
            Ok(()) => {
                pool.inflight[r] += 1.0;
                pool.inflight_total += 1.0;
                pool.requests[r] += 1;
                self.reschedule(p, r);
                true
            }
            Err(_) => false,
        }
    }

    fn arrive(&mut self, id: RequestId, t: SimMs, ids: &Identities) -> Result<(), SimError> {
        let trace = self.trace;
        let q = id.0 as usize;
        let req = trace.request(id);
        self.reqs[q].arrival = t;
        if !within(self.limit, req) {
            self.tot.refused += 1;
            self.tot.too_long += 1;
            return Ok(());
        }
        self.blocks.blocks_into(trace, id, &mut self.blocks_buf);
        let (routing, _) = request_key(trace, id);
        let key = match self.cfg.policy {
            Policy::ClientHash => ids.address_key(req.session),
            Policy::UserHash => ids.user_key(req.session),
            Policy::Tether
            | Policy::TetherBounded
            | Policy::TetherLoad
            | Policy::TetherResident => routing,
            // Tie-breaks only: a per-request value, so no affinity sneaks in.
            _ => tether_placement::hash_parts(&[b"request", &id.0.to_le_bytes()]),
        };
        if self.cfg.policy == Policy::Prefix {
            trace.blocks().path_into(req.blocks, &mut self.path);
        }
        let resident = self.cfg.policy == Policy::TetherResident;
        let (d, how) = if resident {
            let (d, how) = self.place_resident(DECODE, id, key, t)?;
            if self.rebalancing() {
                self.settle_twins(&request_key(trace, id).1, d);
            }
            (d, Some(how))
        } else {
            let path = &self.path;
            // In-flight counts are exact at `t`: engines were woken at their hints.
            let pool = &mut self.pools[DECODE];
            let input = RouteInput {
                key,
                inflight: &pool.inflight,
                inflight_total: pool.inflight_total,
                polled: &pool.polled,
                path,
                store: trace.blocks(),
                prompt_tokens: u64::from(req.input_tokens),
            };
            let d = pool
                .router
                .route(&input)
                .ok_or(SimError::NoRanks("active"))?;
            (d, None)
        };
        self.reqs[q].decode = d as u32;
        self.track_reusable(d, q);
        let prompt = req.input_tokens as usize;
        let output = (req.output_tokens as usize).max(1);
        if let (Some(How::Migrate { from }), Migrate::Pull) = (how, self.cfg.migrate) {
            // What `tether-rank` does on `x-tether-pull-from` (docs/rank.md
            // "State pull"): the new rank leases the held blocks that match its
            // prompt from the old home — a round trip, `transfer_setup_ms`,
            // before the request reaches its engine — and reads them over its
            // link; nothing runs on the old home. TTFT counts from `t`.
            let held = self.leased(from, id).min(prompt);
            self.reqs[q].pulled = true;
            let sr = self.sim_request(id, output, held);
            let reach = t + self.cfg.transfer_setup_ms.max(0.0);
            if !self.submit_at(DECODE, d, sr, t, reach) {
                self.tot.refused += 1;
            }
            return Ok(());
        }
        if let Some(How::Migrate { from }) = how {
            // The state's old home runs the prefill leg (cached) and the KV
            // crosses the link to `d`: the P/D path with the old home as prefiller.
            self.remote_leg(id, DECODE, from, d, t, false);
            return Ok(());
        }
        let remote = self.pools.len() > PREFILL && {
            self.advance(DECODE, d, t);
            let peek = self.pools[DECODE].engines[d]
                .cache()
                .peek_prefix(&self.blocks_buf)
                * self.blocks.engine_block();
            disaggregate(prompt as u64, peek as u64, self.cfg.pd.threshold_tokens)
        };
        let mut remote_pr = None;
        if remote {
            let pr = if resident {
                let (pr, how) = self.place_resident_in(PREFILL, id, routing, t)?;
                if self.cfg.pd.by_cost && self.local_is_cheaper(pr, d, prompt) {
                    self.tot.pd_kept_local += 1;
                    None
                } else {
                    self.tot.resident.count(how);
                    Some(pr)
                }
            } else {
                let pool = &mut self.pools[PREFILL];
                let input = RouteInput {
                    key: routing,
                    inflight: &pool.inflight,
                    inflight_total: pool.inflight_total,
                    polled: &pool.polled,
                    path: &[],
                    store: trace.blocks(),
                    prompt_tokens: prompt as u64,
                };
                Some(
                    pool.router
                        .route(&input)
                        .ok_or(SimError::NoRanks("prefill"))?,
                )
            };
            remote_pr = pr;
        }
        if let Some(pr) = remote_pr {
            self.remote_leg(id, PREFILL, pr, d, t, true);
        } else {
            let kv_in = if self.oracle {
                self.oracle_hits[q] as usize
            } else {
                0
            };
            let sr = self.sim_request(id, output, kv_in);
            if !self.submit(DECODE, d, sr, t) {
                self.tot.refused += 1;
            } else if self.pools.len() > PREFILL {
                self.tot.local += 1;
            }
        }
        Ok(())
    }

    /// `tether-resident`: the rank of pool `p` for `key` by residency and
    /// load ([`super::route::Router::route_resident`]): loads are the polled
    /// running + waiting (decode) or the requests in flight (prefill pool),
    /// residency what each candidate's engine retains for the request's
    /// retention key now (device or host tier). Counts the decision.
    fn place_resident(
        &mut self,
        p: usize,
        id: RequestId,
        key: u64,
        t: SimMs,
    ) -> Result<(usize, How), SimError> {
        let (r, how) = self.place_resident_in(p, id, key, t)?;
        self.tot.resident.count(how);
        Ok((r, how))
    }

    /// P/D by cost (`PdOptions::by_cost`): a prefill leg on prefill rank `pr`
    /// recomputes what `pr` does not hold of the prompt; prefilling on decode
    /// rank `d` computes what `d` does not hold. Local when the leg would
    /// compute more than the decode holder (its state is on `d`: a returning
    /// turn's new tokens are prefilled there); a tie goes remote (a cold prompt
    /// is disaggregated as before). Both caches read as of now.
    fn local_is_cheaper(&self, pr: usize, d: usize, prompt: usize) -> bool {
        let bs = self.blocks.engine_block();
        let held = |p: usize, r: usize| {
            (self.pools[p].engines[r]
                .cache()
                .peek_prefix(&self.blocks_buf)
                * bs)
                .min(prompt)
        };
        prompt - held(PREFILL, pr) > prompt - held(DECODE, d)
    }

    /// [`Self::place_resident`] without counting the decision.
    fn place_resident_in(
        &mut self,
        p: usize,
        id: RequestId,
        key: u64,
        t: SimMs,
    ) -> Result<(usize, How), SimError> {
        let (_, rkey) = request_key(self.trace, id);
        let prompt = u64::from(self.trace.request(id).input_tokens);
        // Candidates are read as of `t`: bring every rank's cache up to now
        // (lazy engines hold their past until a request reaches them).
        for r in 0..self.pools[p].engines.len() {
            if self.pools[p].active[r] {
                self.advance(p, r, t);
            }
        }
        let rule = self.resident_rule(p, prompt);
        let pool = &mut self.pools[p];
        let engines = &pool.engines;
        let knows = |r: usize| {
            let c = engines[r].cache();
            let dev = c.device_record(&rkey).map(|x| x.meta.tokens);
            let host = c.host().record(&rkey).map(|x| x.meta.tokens);
            match (dev, host) {
                (None, None) => Knows::Nothing,
                (d, h) => Knows::Holds(Held {
                    tokens: u32::try_from(d.unwrap_or(0).max(h.unwrap_or(0))).unwrap_or(u32::MAX),
                    device: d.is_some(),
                }),
            }
        };
        let weight = self.cfg.resident_busy_weight;
        // Requests in flight and the busy share, as the filter weighs them
        // (`tether_placement::resident_load`): polled for the decode pool, exact
        // for the prefill pool (its engines were advanced to `t`).
        let loads: Vec<f64> = if p == DECODE {
            pool.polled
                .iter()
                .zip(&pool.polled_busy)
                .map(|(&n, &b)| resident_load(n, b, weight))
                .collect()
        } else {
            pool.inflight
                .iter()
                .zip(engines)
                .map(|(&n, e)| resident_load(n, e.busy_share(t), weight))
                .collect()
        };
        // The prefill pool's backlog is exact too.
        let exact: Vec<f64>;
        let backlog = if p == DECODE {
            &pool.polled_prefill
        } else {
            exact = engines
                .iter()
                .map(|e| e.gauges().queued_prefill_tokens as f64)
                .collect();
            &exact
        };
        let (r, how) = pool
            .router
            .route_resident(key, &loads, backlog, &rule, knows)
            .ok_or(SimError::NoRanks(if p == DECODE {
                "active"
            } else {
                "prefill"
            }))?;
        Ok((r, how))
    }

    /// The residency rule of pool `p` for a prompt of `prompt` tokens: the
    /// settings, and the migrate rule's recompute rate at this prompt's size.
    fn resident_rule(&self, p: usize, prompt: u64) -> Rule {
        let model = self.pools[p].engines[0].model();
        let link = self.cfg.pd.kv_link_gbps;
        let kv_bytes = model.profile().kv_bytes_per_token as f64;
        let tps = if prompt > 0 {
            prompt as f64 / model.prefill_ms(prompt as usize).max(f64::MIN_POSITIVE) * 1e3
        } else {
            f64::INFINITY
        };
        Rule {
            candidates: self.cfg.candidates.max(1),
            bound: self.cfg.resident_bound,
            cost: MoveCost::from_link(kv_bytes, link, self.cfg.transfer_setup_ms, tps),
            unseen: self.cfg.resident_unseen,
            over_bound: self.cfg.resident_over_bound,
        }
    }

    /// Prompt tokens decode rank `r` retains for request `id`'s retention key
    /// (device record, else host record; 0 for none).
    fn held(&self, r: usize, id: RequestId) -> usize {
        let (_, rk) = request_key(self.trace, id);
        let c = self.pools[DECODE].engines[r].cache();
        c.device_record(&rk)
            .map(|x| x.meta.tokens)
            .or_else(|| c.host().record(&rk).map(|x| x.meta.tokens))
            .map_or(0, |t| usize::try_from(t).unwrap_or(usize::MAX))
    }

    /// Tokens a pull of `id`'s state from rank `r` leases: the leading whole
    /// blocks of its retention (device first, else host tier) equal to the
    /// prompt's (`blocks_buf`) — `tether-rank`'s holder matches the same way,
    /// so a turn that rewrote its history pulls only the common prefix.
    fn leased(&self, r: usize, id: RequestId) -> usize {
        let (_, rk) = request_key(self.trace, id);
        let c = self.pools[DECODE].engines[r].cache();
        let chain = c
            .device_record(&rk)
            .map(|x| &x.hashes)
            .or_else(|| c.host().record(&rk).map(|x| &x.hashes));
        let same = chain.map_or(0, |h| {
            h.iter()
                .zip(&self.blocks_buf)
                .take_while(|(a, b)| a == b)
                .count()
        });
        same * self.blocks.engine_block()
    }

    /// Starts a request's prefill leg on rank `pr` of pool `lp` (the prefill
    /// pool, or the decode pool for a migration), its decode leg to follow on
    /// decode rank `d` when the leg hands over. `marker`: the leg retains its
    /// prompt end (a prefill rank's session-affine cache); a migration's leg
    /// does not, so the state's new home is its only holder of this turn.
    fn remote_leg(
        &mut self,
        id: RequestId,
        lp: usize,
        pr: usize,
        d: usize,
        t: SimMs,
        marker: bool,
    ) {
        let q = id.0 as usize;
        self.reqs[q].prefill = pr as u32;
        self.reqs[q].leg_pool = lp as u8;
        // The decode rank holds the request from arrival (llm-d: decode first).
        self.pools[DECODE].inflight[d] += 1.0;
        self.pools[DECODE].inflight_total += 1.0;
        let mut sr = self.sim_request(id, 1, 0);
        if !marker {
            sr.marker = None;
        }
        if self.submit(lp, pr, sr, t) {
            if lp == PREFILL {
                self.tot.remote += 1;
            }
        } else {
            self.pools[DECODE].inflight[d] -= 1.0;
            self.pools[DECODE].inflight_total -= 1.0;
            self.tot.refused += 1;
        }
    }

    /// Whether a finished request on rank `r` of pool `p` is a prefill leg
    /// still to hand over.
    fn is_leg(&self, q: u32, p: usize, r: usize) -> bool {
        let req = &self.reqs[q as usize];
        req.leg_pool == p as u8 && req.prefill == r as u32 && !req.handed
    }

    /// A prefill finished: its decode leg starts, the KV crossing the link.
    fn hand_over(&mut self, h: Handoff) {
        let id = RequestId(h.req);
        let q = h.req as usize;
        let d = self.reqs[q].decode as usize;
        let trace = self.trace;
        let r = trace.request(id);
        self.reqs[q].prefill_hits = h.hits as u32;
        self.reqs[q].handed = true;
        self.blocks.blocks_into(trace, id, &mut self.blocks_buf);
        let sr = self.sim_request(
            id,
            (r.output_tokens as usize).max(1),
            r.input_tokens as usize,
        );
        // Counted in flight since arrival: undo, submit re-counts.
        self.pools[DECODE].inflight[d] -= 1.0;
        self.pools[DECODE].inflight_total -= 1.0;
        if !self.submit(DECODE, d, sr, h.at) {
            self.tot.failed += 1;
        }
    }

    fn track_reusable(&mut self, d: usize, q: usize) {
        let pool = &mut self.pools[DECODE];
        if pool.seen.is_empty() {
            return;
        }
        let hashes = &self.blocks_buf;
        let seen = &mut pool.seen[d];
        let snaps = &mut pool.snaps[d];
        let matched = hashes.iter().take_while(|h| seen.contains(h)).count();
        let cfg = &pool.cfg.policy;
        let usable = if cfg.hybrid() {
            (1..=matched)
                .rev()
                .find(|&j| snaps.contains(&hashes[j - 1]))
                .unwrap_or(0)
        } else {
            matched
        };
        seen.extend(hashes.iter().copied());
        snaps.extend(
            snapshot_boundaries(cfg, hashes.len())
                .into_iter()
                .map(|b| hashes[b - 1]),
        );
        let prompt = self.trace.requests()[q].input_tokens as usize;
        let bs = cfg.block_size;
        let reusable = (usable * bs).min(tether_rank_engine::engine::cached_cap(prompt, bs));
        self.reqs[q].reusable = reusable as u32;
    }

    fn done(&mut self, q: u32, rank: usize, o: &Outcome) {
        let req = self.reqs[q as usize];
        let t = &mut self.tot;
        let hits = if req.prefill != u32::MAX {
            // Prefilled on the prefill pool: its hits there; the decode rank only
            // took the KV (and recomputed the last token, an artifact we drop).
            req.prefill_hits as usize
        } else if self.oracle || req.pulled {
            o.cached_tokens + o.transferred_tokens
        } else {
            o.cached_tokens
        };
        let computed = o.prompt_tokens - hits;
        t.finished += 1;
        t.prompt += o.prompt_tokens as u64;
        t.output += o.output_tokens as u64;
        t.hits += hits as u64;
        t.computed += computed as u64;
        if req.returning {
            t.returning.requests += 1;
            t.returning.prompt_tokens += o.prompt_tokens as u64;
            t.returning.hit_tokens += hits as u64;
        }
        if req.leg_pool == PREFILL as u8 {
            t.transferred += o.transferred_tokens as u64;
            t.transfer_ms += o.transfer_ms;
        } else if req.leg_pool == DECODE as u8 || req.pulled {
            t.resident.migrated_served += 1;
            t.resident.migrated_tokens += o.transferred_tokens as u64;
            t.migrate_ms += o.transfer_ms;
        }
        let reusable = u64::from(req.reusable);
        t.reusable += reusable;
        let avoidable = reusable.saturating_sub(hits as u64);
        t.avoidable += avoidable;
        if req.returning {
            t.avoidable_returning += avoidable;
        }
        let ttft = o.first_token - req.arrival;
        record_ms(&mut t.ttft, ttft);
        if o.output_tokens > 1 {
            record_ms(&mut t.tpot, o.itl_ms());
        }
        record_ms(&mut t.e2e, o.finished - req.arrival);
        t.last_token = t.last_token.max(o.finished);
        if self.records.capacity() > 0 {
            let local = req.prefill == u32::MAX && !self.oracle;
            self.records.push(Observation {
                request: q,
                sent_ms: req.arrival,
                lag_ms: 0.0,
                outcome: Observed::Served(Served {
                    prompt_tokens: o.prompt_tokens as u64,
                    cached_tokens: hits as u64,
                    output_tokens: o.output_tokens as u64,
                    device_cached_tokens: local.then_some(o.device_cached_tokens as u64),
                    restored_tokens: local.then_some(o.restored_tokens as u64),
                    rank: Some(engine_name(self.pools[DECODE].name, rank)),
                    dp_rank: Some(0),
                    attempts: 1,
                    timing: Timing {
                        clock: Clock::Simulated,
                        ttft_ms: ttft,
                        itl_ms: (o.output_tokens > 1).then(|| o.itl_ms()),
                        e2e_ms: o.finished - req.arrival,
                        queue_ms: Some(o.queue_ms()),
                    },
                }),
            });
        }
    }

    /// Runs every engine to idle (prefill pool first: its hand-overs feed decode).
    fn drain(&mut self) {
        loop {
            let t = self.peek_wake();
            if t == f64::INFINITY {
                break;
            }
            self.wake_one();
        }
        for p in (0..self.pools.len()).rev() {
            for r in 0..self.pools[p].engines.len() {
                self.advance(p, r, f64::INFINITY);
            }
        }
    }

    fn finish(
        self,
        profile: &Profile,
        gpu_ms: f64,
        end: SimMs,
        started: std::time::Instant,
    ) -> RunOutput {
        let t = &self.tot;
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let span_ms = (end - t.first_arrival).max(0.0);
        let max_over_mean = |v: &[f64]| {
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            let max = v.iter().copied().fold(0.0, f64::max);
            if mean > 0.0 { max / mean } else { 0.0 }
        };
        let busy =
            |p: &Pool| -> Vec<f64> { p.engines.iter().map(|e| e.metrics().busy_ms).collect() };
        let dec = &self.pools[DECODE];
        let dec_busy = busy(dec);
        let reqs: Vec<f64> = dec.requests.iter().map(|&c| c as f64).collect();
        let utilization = if span_ms > 0.0 {
            dec_busy.iter().sum::<f64>() / (dec_busy.len() as f64 * span_ms)
        } else {
            0.0
        };
        let mut itl = histogram();
        let mut ret = RetentionSummary::default();
        let mut steps = 0;
        for pool in &self.pools {
            for e in &pool.engines {
                let m = e.metrics();
                let _ = itl.add(&m.itl_us);
                steps += m.steps;
                let s = e.cache().stats();
                ret.retained += s.retained;
                ret.offloaded += s.offloaded;
                ret.dropped += s.dropped;
                ret.expired += s.expired_dropped;
                ret.restored_tokens += s.restored_blocks * pool.cfg.policy.block_size as u64;
                ret.host_peak_bytes = ret.host_peak_bytes.max(e.cache().host().used());
                ret.prefetched += s.prefetched;
                ret.prefetch_used += s.prefetch_used;
                ret.prefetch_wasted += s.prefetch_wasted;
                ret.host_usage.merge(&e.cache().host().usage());
            }
        }
        let tpot = Dist::of_us(&t.tpot);
        let tokens = (t.prompt + t.output) as f64;
        let gpu_s = gpu_ms / 1000.0;
        let tokens_per_gpu_s = if gpu_s > 0.0 { tokens / gpu_s } else { 0.0 };
        let usd_per_mtok = if tokens_per_gpu_s > 0.0 {
            profile.gpu_hour_usd * 1e6 / (3600.0 * tokens_per_gpu_s)
        } else {
            f64::INFINITY
        };
        // Over the requests the window admits: a refused one is refused by
        // every policy alike, the oracle's own run included.
        let oracle_hit_tokens: u64 = (self.trace.requests().iter())
            .zip(self.oracle_hits)
            .filter(|(r, _)| within(self.limit, r))
            .map(|(_, &h)| u64::from(h))
            .sum();
        let pd = (self.pools.len() > PREFILL).then(|| PdSummary {
            remote_prefills: t.remote,
            local_prefills: t.local,
            kept_local_by_cost: t.pd_kept_local,
            transferred_tokens: t.transferred,
            transfer_ms_mean: if t.remote > 0 {
                t.transfer_ms / t.remote as f64
            } else {
                0.0
            },
            prefill_busy_max_over_mean: max_over_mean(&busy(&self.pools[PREFILL])),
        });
        let mut returning = t.returning;
        returning.hit_ratio = ratio(returning.hit_tokens, returning.prompt_tokens);
        let tracked = self.cfg.track_reusable;
        let report = RunReport {
            sim: Simulation {
                policy: self.cfg.policy,
                cache: self.cfg.cache,
                prefill_ranks: self.cfg.fleet.prefill,
                decode_ranks: self.cfg.fleet.decode,
                gpus: ((self.cfg.fleet.prefill + self.cfg.fleet.decode) as u64)
                    * u64::from(profile.gpus_per_engine),
                refused: t.refused,
                too_long: t.too_long,
                failed: t.failed,
                oracle_hit_tokens,
                oracle_share: ratio(t.hits, oracle_hit_tokens),
                reusable_tokens: tracked.then_some(t.reusable),
                avoidable_tokens: tracked.then_some(t.avoidable),
                avoidable_returning_tokens: tracked.then_some(t.avoidable_returning),
                balance: Balance {
                    busy_max_over_mean: max_over_mean(&dec_busy),
                    requests_max_over_mean: max_over_mean(&reqs),
                    utilization,
                    kv_imbalance_p95: crate::quantile::of(&self.kv_imbalance, 0.95).unwrap_or(0.0),
                    kv_imbalance_mean: self.kv_imbalance.iter().sum::<f64>()
                        / self.kv_imbalance.len().max(1) as f64,
                },
                itl_ms: Dist::of_us(&itl),
                interactivity_tok_s: if tpot.p50 > 0.0 {
                    1000.0 / tpot.p50
                } else {
                    0.0
                },
                gpu_seconds: gpu_s,
                tokens_per_gpu_s,
                usd_per_mtok,
                pd,
                resident: (self.cfg.policy == Policy::TetherResident).then(|| {
                    let mut r = t.resident;
                    r.migrate_transfer_ms_mean = if r.migrated_served > 0 {
                        t.migrate_ms / r.migrated_served as f64
                    } else {
                        0.0
                    };
                    r
                }),
                retention: ret,
                steps,
            },
            requests: self.reqs.len() as u64,
            finished: t.finished,
            prompt_tokens: t.prompt,
            output_tokens: t.output,
            hit_tokens: t.hits,
            computed_tokens: t.computed,
            hit_ratio: ratio(t.hits, t.prompt),
            returning,
            ttft_ms: Dist::of_us(&t.ttft),
            tpot_ms: tpot,
            e2e_ms: Dist::of_us(&t.e2e),
            span_s: span_ms / 1000.0,
            wall_s: started.elapsed().as_secs_f64(),
        };
        let busy_s = self
            .pools
            .iter()
            .flat_map(|p| {
                p.engines.iter().enumerate().map(|(r, e)| {
                    (
                        format!("{}#0", engine_name(p.name, r)),
                        e.metrics().busy_ms / 1000.0,
                    )
                })
            })
            .collect();
        let dec = &self.pools[DECODE];
        let routed = (
            (0..dec.engines.len())
                .map(|r| engine_name(dec.name, r))
                .collect(),
            dec.cfg.clone(),
        );
        RunOutput {
            report,
            records: self.records,
            busy_s,
            routed,
        }
    }
}

/// The fleet a config describes, for messages.
pub fn describe(f: &FleetShape) -> String {
    if f.is_disaggregated() {
        format!("{} prefill + {} decode ranks", f.prefill, f.decode)
    } else {
        format!("{} ranks", f.decode)
    }
}

#[cfg(test)]
mod tests;
