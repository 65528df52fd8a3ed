//! The simulated engine of one (DP) rank: continuous batching over one
//! [`RetentionCache`], timed by a [`LatencyModel`], stepped by the caller's
//! clock. No tokio, no wall clock: the HTTP server and the fleet simulator run
//! this same code, one instance per simulated rank.
//!
//! The step loop follows vLLM's V1 scheduler:
//! - requests wait in arrival order (FCFS); at each step start the engine admits
//!   waiting requests while fewer than `max_num_seqs` run and the cache can give
//!   the prompt its blocks (`RetentionCache::admit`: device prefix hit, host-tier
//!   restore, fresh slots). A request the cache cannot place blocks the queue
//!   behind it until a running request finishes (no preemption);
//! - a request whose prefix comes partly from the host tier first waits for its
//!   restore on the engine's host link (one transfer at a time, in admission
//!   order, `bytes / host_restore_gbps`); it does not stall the batch;
//! - one step = every decoding request advances one token, plus prefill chunks of
//!   admitted requests in admission order up to `max_num_batched_tokens` (chunked
//!   prefill). Its duration comes from the latency model. The step that computes a
//!   prompt's last chunk also yields its first token (as vLLM does) and retains the
//!   prompt end when the request carries a prompt-end marker;
//! - the simulated model answers exactly `max_tokens` tokens, then stops.
//!
//! Cached tokens follow vLLM: full blocks only, and when the whole prompt is
//! cached the last token is recomputed (a block-aligned prompt then gets its last
//! block recomputed), so at least one token is always prefilled.
//!
//! **P/D roles.** A prefill-only engine is this engine given requests of one
//! output token: the step that computes the prompt yields that token and the
//! request finishes. A decode-only engine gets requests whose prompt KV comes
//! from another engine ([`SimRequest::kv_in_tokens`]): after its own device hit
//! and host restore, the rest of that KV arrives over the engine's KV-transfer
//! link (`bytes / kv_link_gbps`, one transfer at a time, like the host link) and
//! only the last token is computed, as a vLLM decode instance behind a
//! NIXL-style connector does.
//!
//! **Decode runs.** A step that only decodes, with nothing due to join before
//! the next step (no admissible arrival, no restore or transfer completing, no
//! sequence finishing, no streaming client), is followed by another of the same
//! batch; such runs are formed in one go, each step's time computed exactly as
//! a lone step's would be, so the result is the same to the bit and a rank
//! that decodes for seconds costs a few operations instead of one per token.
//!
//! Driving it: [`Engine::submit`] a request at its arrival time, then call
//! [`Engine::advance`] with the current time whenever time passes;
//! [`Engine::next_wakeup`] says when something will happen next. A step begun at
//! `t` sees only the requests that arrived by `t`, and its events carry the step's
//! end time, so results do not depend on how late or often `advance` is called.

use crate::latency::{LatencyModel, StepShape};
use crate::metrics::{EngineGauges, EngineMetrics};
use prefetch::{Moment, Prefetcher};
use std::collections::{HashSet, VecDeque};
use tether_engine::{
    BlockHash, CacheError, MetadataOnly, PolicyConfig, RequestId, RetentionCache, RetentionKey,
    TurnMarker,
};
use thiserror::Error;

/// Simulated time in milliseconds since the engine's epoch.
pub type SimMs = f64;

/// How the engine batches (vLLM's scheduler limits).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The retention policy and cache geometry.
    pub policy: PolicyConfig,
    /// Most requests running at once (vLLM `--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Most tokens one step computes, decodes included (vLLM `--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Bandwidth of the link over which prompt KV computed elsewhere arrives
    /// (P/D decode role), GB/s (10⁹ B/s); `f64::INFINITY` = free transfers.
    pub kv_link_gbps: f64,
    /// Prefetch in tool gaps ([`EngineSettings::prefetch`]).
    pub prefetch: bool,
}

impl EngineConfig {
    /// The engine of one rank serving `profile`: `device_kv_tokens` of device KV
    /// (the profile's `max_kv_tokens` unless shrunk), blocks of `block_size`
    /// tokens sized from the profile's `kv_bytes_per_token`, a host tier of
    /// `host_bytes` (0 = none), retention on or off (plain LRU), and for a hybrid
    /// profile its state snapshots (`Profile::hybrid`). The server and
    /// the fleet simulator both build their engines here.
    pub fn for_profile(profile: &crate::profile::Profile, s: &EngineSettings) -> Self {
        let device_kv_tokens = s.device_kv_tokens.unwrap_or(profile.max_kv_tokens);
        let mut e = Self {
            policy: PolicyConfig {
                block_size: s.block_size,
                device_blocks: usize::try_from(device_kv_tokens / s.block_size.max(1) as u64)
                    .unwrap_or(usize::MAX),
                block_bytes: profile.kv_bytes_per_token * s.block_size as u64,
                host_bytes: s.host_bytes,
                retention: s.retention,
                ..PolicyConfig::default()
            },
            max_num_seqs: s.max_num_seqs,
            max_num_batched_tokens: s.max_num_batched_tokens,
            kv_link_gbps: s.kv_link_gbps,
            prefetch: s.prefetch,
        };
        // A hybrid model: snapshots of its linear state, paid from the same device
        // budget, at its resumable boundaries rounded up to whole blocks.
        if let Some(h) = profile.hybrid {
            e.policy.state_bytes = h.state_bytes;
            e.policy.state_align_tokens = usize::try_from(h.align_tokens)
                .unwrap_or(usize::MAX)
                .next_multiple_of(s.block_size.max(1));
        }
        e
    }
}

/// The serving settings of one engine, besides its profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSettings {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Device KV tokens; `None` = the profile's `max_kv_tokens`.
    pub device_kv_tokens: Option<u64>,
    /// Host-tier bytes (0 = no host tier).
    pub host_bytes: u64,
    /// Turn-boundary retention (false = plain LRU prefix caching).
    pub retention: bool,
    /// vLLM `--max-num-seqs`.
    pub max_num_seqs: usize,
    /// vLLM `--max-num-batched-tokens`.
    pub max_num_batched_tokens: usize,
    /// KV-transfer link of a decode-role engine, GB/s ([`EngineConfig::kv_link_gbps`]).
    pub kv_link_gbps: f64,
    /// Prefetch in tool gaps: bring a `tool`/`handoff` prompt end's retention back
    /// from the host tier before the session is expected back (`docs/engine.md`,
    /// "Prefetch"). Inert without retention and a host tier.
    pub prefetch: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            block_size: 16,
            device_kv_tokens: None,
            host_bytes: 0,
            retention: true,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            kv_link_gbps: 50.0,
            prefetch: false,
        }
    }
}

/// A configuration the engine cannot run with.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineConfigError {
    /// The cache policy is unusable.
    #[error("cache policy: {0}")]
    Policy(String),
    /// A limit is zero or inconsistent.
    #[error("{0}")]
    Limits(String),
}

/// One request as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Unique while the request lives.
    pub id: u64,
    /// Chained hashes of the prompt's full blocks.
    pub hashes: Vec<BlockHash>,
    /// Prompt length in tokens (≥ 1).
    pub prompt_tokens: usize,
    /// Output length in tokens (≥ 1).
    pub max_tokens: usize,
    /// The gateway's turn marker, if any.
    pub marker: Option<TurnMarker>,
    /// Emit an event per output token (streaming clients); otherwise only the outcome.
    pub stream: bool,
    /// Leading prompt tokens whose KV another engine computed and sends here
    /// (the prefill leg of a P/D pair); 0 = compute the prompt here. Tokens this
    /// engine finds in its own cache are not transferred.
    pub kv_in_tokens: usize,
}

/// Why a request was refused at submission.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// Empty prompt or zero output tokens.
    #[error("{0}")]
    Empty(&'static str),
    /// The prompt needs more KV blocks than the device has.
    #[error("prompt needs {need} KV blocks but the device holds {capacity}")]
    TooLarge {
        /// Blocks the prompt needs.
        need: usize,
        /// Device blocks.
        capacity: usize,
    },
    /// The id is already live.
    #[error("request id {0} is already live")]
    Duplicate(u64),
}

/// A model's context window (`max_model_len`): prompt plus requested output
/// must fit. One rule for the rank server (which answers 400 with vLLM's
/// message) and the fleet simulator (which counts the request refused), so a
/// simulation and a replay refuse the same requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContextLimit(pub Option<u64>);

/// A request longer than the model's context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error(
    "This model's maximum context length is {limit} tokens. However, you requested {} tokens ({prompt} in the messages, {max_tokens} in the completion).",
    prompt + max_tokens
)]
pub struct TooLong {
    /// The window.
    pub limit: u64,
    /// Prompt tokens.
    pub prompt: u64,
    /// Requested output tokens.
    pub max_tokens: u64,
}

impl ContextLimit {
    /// `Err` when `prompt + max_tokens` exceeds the window (no window: never).
    pub fn check(self, prompt: u64, max_tokens: u64) -> Result<(), TooLong> {
        match self.0 {
            Some(limit) if prompt.saturating_add(max_tokens) > limit => Err(TooLong {
                limit,
                prompt,
                max_tokens,
            }),
            _ => Ok(()),
        }
    }
}

/// How a request's prompt was served and how long each phase took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens not computed: device hits plus host restores.
    pub cached_tokens: usize,
    /// Of the cached tokens, those found on the device.
    pub device_cached_tokens: usize,
    /// Of the cached tokens, those restored from the host tier.
    pub restored_tokens: usize,
    /// Prompt tokens whose KV arrived from another engine (not cached, not computed here).
    pub transferred_tokens: usize,
    /// Output tokens generated.
    pub output_tokens: usize,
    /// When the request arrived.
    pub arrival: SimMs,
    /// When it was admitted (left the waiting queue).
    pub admitted: SimMs,
    /// When its first token was produced.
    pub first_token: SimMs,
    /// When its last token was produced.
    pub finished: SimMs,
    /// Host-link time of its restore (0 without one).
    pub restore_ms: f64,
    /// KV-link time of its transfer (0 without one).
    pub transfer_ms: f64,
    /// The host tier held data for it that could not be used.
    pub restore_miss: bool,
}

impl Outcome {
    /// Time to first token.
    pub fn ttft_ms(&self) -> f64 {
        self.first_token - self.arrival
    }
    /// End to end.
    pub fn e2e_ms(&self) -> f64 {
        self.finished - self.arrival
    }
    /// Time spent waiting for admission.
    pub fn queue_ms(&self) -> f64 {
        self.admitted - self.arrival
    }
    /// Mean inter-token latency (0 for a one-token answer).
    pub fn itl_ms(&self) -> f64 {
        if self.output_tokens > 1 {
            (self.finished - self.first_token) / (self.output_tokens - 1) as f64
        } else {
            0.0
        }
    }
    /// Prompt tokens computed by prefill on this engine.
    pub fn computed_tokens(&self) -> usize {
        self.prompt_tokens - self.cached_tokens - self.transferred_tokens
    }
}

/// How a request was admitted: known from its first token on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admitted {
    /// When it arrived.
    pub arrival: SimMs,
    /// When it left the waiting queue.
    pub admitted: SimMs,
    /// Prompt tokens served from cache (device + host).
    pub cached_tokens: usize,
}

/// What happened to a request, at simulated time `at`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// First output token (streaming requests only).
    First {
        /// Request.
        id: u64,
        /// When.
        at: SimMs,
        /// Its admission.
        admitted: Admitted,
    },
    /// A further output token (streaming requests only).
    Token {
        /// Request.
        id: u64,
        /// When.
        at: SimMs,
    },
    /// The request finished; for streaming requests this is also its last token
    /// when `output_tokens > 1`.
    Done {
        /// Request.
        id: u64,
        /// How it went.
        outcome: Outcome,
    },
    /// The engine could not serve it.
    Failed {
        /// Request.
        id: u64,
        /// Why.
        why: String,
    },
}

#[derive(Debug)]
struct Waiting {
    req: SimRequest,
    arrival: SimMs,
    /// Tokens expected to be computed (device prefix peeked at submission).
    est_uncached: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Restoring { ready_at: SimMs },
    Prefill,
    Decode,
}

#[derive(Debug)]
struct Live {
    req: SimRequest,
    arrival: SimMs,
    admitted: SimMs,
    phase: Phase,
    uncached: usize,
    prefilled: usize,
    generated: usize,
    first_token: SimMs,
    last_token: SimMs,
    device_cached: usize,
    restored: usize,
    transferred: usize,
    restore_ms: f64,
    transfer_ms: f64,
    restore_miss: bool,
    cancelled: bool,
    done: bool,
}

#[derive(Debug)]
struct Step {
    start: SimMs,
    end: SimMs,
    decodes: Vec<usize>,
    chunks: Vec<(usize, usize)>,
    /// Steps of a decode run after the first (0 for one step).
    more: usize,
    /// End of the run's first step.
    first_end: SimMs,
    /// The later steps' durations for the ITL metrics, grouped by equal
    /// µs-rounded values: (µs, steps, their exact sum in ms).
    itl_groups: Vec<(u64, u64, f64)>,
}

/// One simulated engine. See the module docs.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    model: LatencyModel,
    cache: RetentionCache,
    mover: MetadataOnly,
    waiting: VecDeque<Waiting>,
    running: Vec<Live>,
    /// Ids of waiting and running requests.
    live: HashSet<u64>,
    in_flight: Option<Step>,
    clock: SimMs,
    link_free_at: SimMs,
    kv_link_free_at: SimMs,
    blocked: bool,
    metrics: EngineMetrics,
    /// Share of recent time spent stepping (the `/load` report's `busy`).
    busy: tether_placement::BusyAverage,
    /// Ids of live requests submitted with [`Engine::submit_unmetered`].
    unmetered: HashSet<u64>,
    /// Where their per-request figures go (made on the first one; never read).
    quiet: Option<Box<EngineMetrics>>,
    /// Prefetch plans (`None` when prefetch is off or there is nothing to prefetch from).
    prefetch: Option<Prefetcher>,
}

/// The metrics a request's figures go to: the engine's, or for an unmetered
/// request the scratch copy (fields passed apart so callers keep borrowing the rest).
fn meter<'a>(
    metrics: &'a mut EngineMetrics,
    quiet: &'a mut Option<Box<EngineMetrics>>,
    unmetered: &HashSet<u64>,
    id: u64,
) -> &'a mut EngineMetrics {
    match quiet {
        Some(q) if !unmetered.is_empty() && unmetered.contains(&id) => q,
        _ => metrics,
    }
}

impl Engine {
    /// An idle engine at time 0.
    pub fn try_new(cfg: EngineConfig, model: LatencyModel) -> Result<Self, EngineConfigError> {
        if cfg.max_num_seqs == 0 {
            return Err(EngineConfigError::Limits(
                "max_num_seqs must be at least 1".into(),
            ));
        }
        if cfg.kv_link_gbps.is_nan() || cfg.kv_link_gbps <= 0.0 {
            return Err(EngineConfigError::Limits(format!(
                "kv_link_gbps ({}) must be positive",
                cfg.kv_link_gbps
            )));
        }
        if cfg.max_num_batched_tokens < cfg.max_num_seqs {
            return Err(EngineConfigError::Limits(format!(
                "max_num_batched_tokens ({}) must be at least max_num_seqs ({})",
                cfg.max_num_batched_tokens, cfg.max_num_seqs
            )));
        }
        let cfg_prefetch = cfg.prefetch && cfg.policy.retention && cfg.policy.host_bytes > 0;
        let cache = RetentionCache::try_new(cfg.policy.clone())
            .map_err(|e| EngineConfigError::Policy(e.to_string()))?;
        let max_len = model
            .profile()
            .max_model_len
            .unwrap_or(cfg.policy.device_blocks as u64 * cfg.policy.block_size as u64);
        Ok(Self {
            cfg,
            model,
            cache,
            mover: MetadataOnly,
            waiting: VecDeque::new(),
            running: Vec::new(),
            live: HashSet::new(),
            in_flight: None,
            clock: 0.0,
            link_free_at: 0.0,
            kv_link_free_at: 0.0,
            blocked: false,
            metrics: EngineMetrics::new(max_len),
            busy: tether_placement::BusyAverage::default(),
            unmetered: HashSet::new(),
            quiet: None,
            prefetch: (cfg_prefetch).then(Prefetcher::default),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The latency model.
    pub fn model(&self) -> &LatencyModel {
        &self.model
    }

    /// The retention cache (read-only: stats, pool, host tier).
    pub fn cache(&self) -> &RetentionCache {
        &self.cache
    }

    /// Counters and histograms so far.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// The time the engine's timeline has reached.
    pub fn clock(&self) -> SimMs {
        self.clock
    }

    /// Queues a request that arrived at `arrival` (not before the last `advance`).
    pub fn submit(&mut self, req: SimRequest, arrival: SimMs) -> Result<(), SubmitError> {
        if req.prompt_tokens == 0 {
            return Err(SubmitError::Empty("the prompt is empty"));
        }
        if req.max_tokens == 0 {
            return Err(SubmitError::Empty("max_tokens must be at least 1"));
        }
        let capacity = self.cfg.policy.device_blocks;
        if req.hashes.len() > capacity {
            return Err(SubmitError::TooLarge {
                need: req.hashes.len(),
                capacity,
            });
        }
        if self.live.contains(&req.id) {
            return Err(SubmitError::Duplicate(req.id));
        }
        let bs = self.cfg.policy.block_size;
        let peek = (self.cache.peek_prefix(&req.hashes) * bs).max(req.kv_in_tokens);
        let est_uncached = req.prompt_tokens - peek.min(cached_cap(req.prompt_tokens, bs));
        let w = Waiting {
            req,
            arrival,
            est_uncached,
        };
        self.live.insert(w.req.id);
        if let (Some(p), Some(m)) = (self.prefetch.as_mut(), w.req.marker) {
            p.returned(&m.key, arrival);
        }
        // Keep arrival order (submissions normally come in order already).
        let pos = self
            .waiting
            .iter()
            .rposition(|x| x.arrival <= arrival)
            .map_or(0, |p| p + 1);
        self.waiting.insert(pos, w);
        Ok(())
    }

    /// Queues internal work as a request whose figures stay out of
    /// [`Engine::metrics`] (its tokens, hits, link time, latencies, finish):
    /// `tether-rank`'s rebalancing copy, a one-token request that puts a state
    /// pulled from another rank into this cache. It is scheduled, batched and
    /// retained exactly as [`Engine::submit`]'s; the steps it runs in still
    /// count in `steps` and `busy_ms`, its retention in `retained_blocks`.
    pub fn submit_unmetered(&mut self, req: SimRequest, arrival: SimMs) -> Result<(), SubmitError> {
        let id = req.id;
        self.submit(req, arrival)?;
        if self.quiet.is_none() {
            self.quiet = Some(Box::new(EngineMetrics::new(0)));
        }
        self.unmetered.insert(id);
        Ok(())
    }

    /// The retention keys of the requests waiting or running whose prompt
    /// end this engine will retain (a prompt-end marker, retention on), each
    /// with the tokens it will retain (its prompt's full blocks): what the
    /// engine is about to hold, listed before the retention record exists.
    pub fn in_flight_keys(&self) -> impl Iterator<Item = (RetentionKey, usize)> + '_ {
        let bs = self.cfg.policy.block_size;
        let on = self.cfg.policy.retention;
        let waiting = self.waiting.iter().map(|w| &w.req);
        let running = self
            .running
            .iter()
            .filter(|l| !l.cancelled && !l.done)
            .map(|l| &l.req);
        waiting
            .chain(running)
            .filter(move |_| on)
            .filter_map(move |r| {
                let m = r.marker.filter(|m| m.prompt_end)?;
                Some((m.key, r.prompt_tokens / bs.max(1) * bs))
            })
    }

    /// Requests waiting or running (what vLLM's `/load` calls server load).
    pub fn in_flight(&self) -> usize {
        self.live.len()
    }

    /// Lets `key`'s retention go on both tiers ([`RetentionCache::forget`]): a copy
    /// of the state on another engine took the key's next turn. True when one was held.
    pub fn forget(&mut self, key: &RetentionKey) -> bool {
        self.cache.forget(key)
    }

    /// Moves `key`'s device retention to the host tier at the engine's clock
    /// ([`RetentionCache::demote`]): a copy of the state on another engine is
    /// expected to take the key's next turn. True when it moved.
    pub fn demote(&mut self, key: &RetentionKey) -> bool {
        self.cache.demote(key, self.clock as u64, &mut self.mover)
    }

    /// Cancels a request (its client went away); its KV pins are dropped. Returns
    /// false if the id is not live.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(p) = self.waiting.iter().position(|w| w.req.id == id) {
            self.waiting.remove(p);
            self.live.remove(&id);
            self.unmetered.remove(&id);
            self.metrics.aborted += 1;
            return true;
        }
        let Some(l) = self
            .running
            .iter_mut()
            .find(|l| l.req.id == id && !l.done && !l.cancelled)
        else {
            return false;
        };
        l.cancelled = true;
        self.metrics.aborted += 1;
        if self.in_flight.is_none() {
            let _ = self.purge();
        }
        true
    }

    /// When the engine next has something to do: the end of the step in flight,
    /// or the start of the next one; `None` when idle.
    pub fn next_wakeup(&self) -> Option<SimMs> {
        match &self.in_flight {
            Some(s) => Some(s.end),
            None => self.next_start(),
        }
    }

    /// A time before which no request finishes unless more are submitted, for
    /// a fleet that tracks requests in flight without advancing every engine at
    /// every arrival. `None` when nothing runs. A lower bound when step times do
    /// not fall as batch and context grow (true of measured profiles): the
    /// first sequence to finish needs its remaining tokens at no less than the
    /// current batch's decode step time each.
    pub fn next_finish_hint(&self) -> Option<SimMs> {
        let base = match &self.in_flight {
            Some(s) => s.end,
            None => self.next_start()?,
        };
        let in_step = |i: usize| match &self.in_flight {
            Some(s) if s.decodes.contains(&i) => 1 + s.more,
            _ => 0,
        };
        let mut decoding = 0usize;
        let mut context = 0usize;
        let mut fewest: Option<usize> = None;
        for (i, l) in self.running.iter().enumerate() {
            if l.cancelled || l.done {
                continue;
            }
            if l.phase != Phase::Decode {
                // Its first token (and, for one-token requests, its end) can come
                // with the next step.
                return Some(base);
            }
            let left =
                l.req.max_tokens - l.generated - in_step(i).min(l.req.max_tokens - l.generated);
            if left == 0 {
                return Some(base);
            }
            decoding += 1;
            context += l.req.prompt_tokens + l.generated;
            fewest = Some(fewest.map_or(left, |f| f.min(left)));
        }
        if !self.waiting.is_empty() && !self.blocked && self.running.len() < self.cfg.max_num_seqs {
            // A waiting request joins with the next step.
            return Some(base);
        }
        let fewest = fewest?;
        let step = self
            .model
            .decode_ms(decoding, context as f64 / decoding as f64)
            .max(crate::latency::MIN_STEP_MS);
        Some(base + fewest as f64 * step)
    }

    fn next_start(&self) -> Option<SimMs> {
        let mut t: Option<SimMs> = None;
        let mut consider = |x: SimMs| t = Some(t.map_or(x, |t| t.min(x)));
        for l in self.running.iter().filter(|l| !l.cancelled && !l.done) {
            match l.phase {
                Phase::Prefill | Phase::Decode => return Some(self.clock),
                Phase::Restoring { ready_at } => consider(ready_at.max(self.clock)),
            }
        }
        if !self.blocked
            && self.running.len() < self.cfg.max_num_seqs
            && let Some(w) = self.waiting.front()
        {
            consider(w.arrival.max(self.clock));
        }
        if let Some(d) = self.prefetch.as_ref().and_then(Prefetcher::next_timer) {
            consider(d.max(self.clock));
        }
        t
    }

    /// Runs the engine up to `now`: completes the steps that end by `now` and
    /// begins the steps that start by `now`, appending what happened to `out`.
    pub fn advance(&mut self, now: SimMs, out: &mut Vec<Event>) {
        loop {
            if let Some(step) = &self.in_flight {
                if step.end > now {
                    return;
                }
                let step = self.in_flight.take().unwrap_or_else(|| unreachable!());
                self.complete(step, out);
                continue;
            }
            let Some(start) = self.next_start() else {
                return;
            };
            if start > now {
                return;
            }
            if !self.begin(start, now, out) {
                // Nothing could run at `start` (e.g. every admission blocked):
                // the next start is later, or there is none.
                match self.next_start() {
                    Some(t) if t > start => continue,
                    _ => return,
                }
            }
        }
    }

    /// Admits, forms a batch at `start` and puts it in flight (a decode run of
    /// several steps when nothing can change it before `now`; see the module
    /// docs). False if no step formed.
    fn begin(&mut self, start: SimMs, now: SimMs, out: &mut Vec<Event>) -> bool {
        self.clock = self.clock.max(start);
        let bs = self.cfg.policy.block_size;
        for l in &mut self.running {
            if let Phase::Restoring { ready_at } = l.phase
                && ready_at <= start
            {
                l.phase = Phase::Prefill;
            }
        }
        let mut admitted = false;
        while !self.blocked && self.running.len() < self.cfg.max_num_seqs {
            match self.waiting.front() {
                Some(w) if w.arrival <= start => {}
                _ => break,
            }
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            let id = RequestId(w.req.id);
            let key = w.req.marker.map(|m| m.key);
            match self
                .cache
                .admit(id, &w.req.hashes, key, start as u64, &mut self.mover)
            {
                Ok(adm) => {
                    admitted = true;
                    let p = w.req.prompt_tokens;
                    // The prompt's partial block (`hold_tail_blocks`); a pool with no room
                    // for it serves the request without, where vLLM would wait.
                    let _ = self.cache.grow(id, p, start as u64, &mut self.mover);
                    let cap = cached_cap(p, bs);
                    let raw = adm.cached_blocks * bs;
                    let cached = raw.min(cap);
                    let restored_raw = adm.restored_blocks * bs;
                    let restored = restored_raw - (raw - cached).min(restored_raw);
                    let device_cached = cached - restored;
                    let transferred = w.req.kv_in_tokens.min(cap).saturating_sub(cached);
                    let m = meter(
                        &mut self.metrics,
                        &mut self.quiet,
                        &self.unmetered,
                        w.req.id,
                    );
                    m.prompt_tokens += p as u64;
                    m.prefix_queries += p as u64;
                    m.prefix_hits += device_cached as u64;
                    if self.cache.host().capacity() > 0 {
                        m.external_queries += (p - device_cached) as u64;
                        m.external_hits += restored as u64;
                    }
                    m.computed_tokens += (p - cached - transferred) as u64;
                    m.transferred_tokens += transferred as u64;
                    m.queue.observe((start - w.arrival) / 1000.0);
                    let mut ready_at = start;
                    let mut restore_ms = 0.0;
                    if adm.restored_blocks > 0 || adm.state_restored {
                        // A hybrid model's snapshot crosses the host link with its blocks.
                        let state = if adm.state_restored {
                            self.cfg.policy.state_bytes
                        } else {
                            0
                        };
                        restore_ms = self.model.restore_ms(
                            adm.restored_blocks as u64 * self.cfg.policy.block_bytes + state,
                        );
                        let from = self.link_free_at.max(start);
                        self.link_free_at = from + restore_ms;
                        m.restore_ms += restore_ms;
                        ready_at = self.link_free_at;
                        if let Some(p) = self.prefetch.as_mut() {
                            p.yield_to(from, restore_ms);
                        }
                    }
                    if let (true, Some(p), Some(k)) =
                        (adm.prefetch_hit, self.prefetch.as_mut(), key)
                        && let Some(landed) = p.take_inflight(&k, start)
                    {
                        // Its prefetch copy is still on the host link.
                        ready_at = ready_at.max(landed);
                    }
                    let mut transfer_ms = 0.0;
                    if transferred > 0 {
                        let bytes =
                            transferred as f64 * self.model.profile().kv_bytes_per_token as f64;
                        transfer_ms = bytes / (self.cfg.kv_link_gbps * 1e6);
                        self.kv_link_free_at = self.kv_link_free_at.max(start) + transfer_ms;
                        m.transfer_ms += transfer_ms;
                        ready_at = ready_at.max(self.kv_link_free_at);
                    }
                    let phase = if ready_at > start {
                        Phase::Restoring { ready_at }
                    } else {
                        Phase::Prefill
                    };
                    self.running.push(Live {
                        arrival: w.arrival,
                        admitted: start,
                        phase,
                        uncached: p - cached - transferred,
                        prefilled: 0,
                        generated: 0,
                        first_token: 0.0,
                        last_token: 0.0,
                        device_cached,
                        restored,
                        transferred,
                        restore_ms,
                        transfer_ms,
                        restore_miss: adm.miss.is_some(),
                        cancelled: false,
                        done: false,
                        req: w.req,
                    });
                }
                Err(CacheError::OutOfBlocks { .. }) => {
                    self.waiting.push_front(w);
                    self.blocked = true;
                }
                Err(e) => {
                    self.live.remove(&w.req.id);
                    self.unmetered.remove(&w.req.id);
                    out.push(Event::Failed {
                        id: w.req.id,
                        why: e.to_string(),
                    });
                }
            }
        }
        self.run_prefetch(start, admitted);
        let decodes: Vec<usize> = (0..self.running.len())
            .filter(|&i| {
                let l = &self.running[i];
                l.phase == Phase::Decode && !l.cancelled && !l.done
            })
            .collect();
        let mut budget = self
            .cfg
            .max_num_batched_tokens
            .saturating_sub(decodes.len());
        let mut chunks = Vec::new();
        let mut prefill_ms = 0.0;
        for (i, l) in self.running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if l.phase != Phase::Prefill || l.cancelled || l.done {
                continue;
            }
            let c = (l.uncached - l.prefilled).min(budget);
            budget -= c;
            let cached = l.req.prompt_tokens.saturating_sub(l.uncached);
            prefill_ms += self.model.chunk_ms(c, l.uncached, cached);
            chunks.push((i, c));
        }
        if decodes.is_empty() && chunks.is_empty() {
            return false;
        }
        // Context summed as an integer, so a decode run's later steps (the same
        // sum plus one token per sequence and step) time exactly as lone steps.
        let context_sum: usize = decodes
            .iter()
            .map(|&i| self.running[i].req.prompt_tokens + self.running[i].generated)
            .sum();
        let step_ms = |sum: usize, prefill_ms: f64| {
            self.model.step_ms(&StepShape {
                decodes: decodes.len(),
                mean_context: if decodes.is_empty() {
                    0.0
                } else {
                    sum as f64 / decodes.len() as f64
                },
                prefill_ms,
            })
        };
        let mut end = start + step_ms(context_sum, prefill_ms);
        let first_end = end;
        let mut more = 0;
        let mut itl_groups: Vec<(u64, u64, f64)> = Vec::new();
        if chunks.is_empty() && decodes.iter().all(|&i| !self.running[i].req.stream) {
            // A decode run: further steps of the same batch while nothing can join
            // or leave it before they start (each sequence gains one token a step).
            let steps_left = decodes
                .iter()
                .map(|&i| self.running[i].req.max_tokens - self.running[i].generated)
                .min()
                .unwrap_or(1);
            let join_at = self.next_join();
            let mut sum = context_sum;
            let steps = self.model.decode_steps(decodes.len());
            while more + 1 < steps_left && end <= now && join_at.is_none_or(|j| j > end) {
                sum += decodes.len();
                let d = steps.step_ms(sum as f64 / decodes.len() as f64);
                more += 1;
                end += d;
                let us = (d * 1000.0 + 0.5) as u64;
                match itl_groups.last_mut() {
                    Some(g) if g.0 == us => {
                        g.1 += 1;
                        g.2 += d;
                    }
                    _ => itl_groups.push((us, 1, d)),
                }
            }
        }
        self.in_flight = Some(Step {
            start,
            end,
            decodes,
            chunks,
            more,
            first_end,
            itl_groups,
        });
        true
    }

    /// The earliest time something would join the running batch: a waiting
    /// request that could be admitted, or a restore or transfer completing.
    fn next_join(&self) -> Option<SimMs> {
        let mut t: Option<SimMs> = None;
        for l in &self.running {
            if let Phase::Restoring { ready_at } = l.phase
                && !l.cancelled
            {
                t = Some(t.map_or(ready_at, |t| t.min(ready_at)));
            }
        }
        if !self.blocked
            && self.running.len() < self.cfg.max_num_seqs
            && let Some(w) = self.waiting.front()
        {
            t = Some(t.map_or(w.arrival, |t| t.min(w.arrival)));
        }
        if let Some(d) = self.prefetch.as_ref().and_then(Prefetcher::next_timer) {
            t = Some(t.map_or(d, |t| t.min(d)));
        }
        t
    }

    /// Applies a finished step (or decode run) at its end time.
    fn complete(&mut self, step: Step, out: &mut Vec<Event>) {
        let at = step.end;
        self.clock = self.clock.max(at);
        self.metrics.steps += 1 + step.more as u64;
        self.metrics.busy_ms += step.end - step.start;
        self.busy.add(step.end, step.end - step.start);
        debug_assert!(step.start <= step.end);
        let first_end = step.first_end;
        for &(i, c) in &step.chunks {
            let l = &mut self.running[i];
            if l.cancelled {
                continue;
            }
            l.prefilled += c;
            if l.prefilled < l.uncached {
                continue;
            }
            // Prompt computed: publish (and retain) its blocks; the step yields token 1.
            let marker = l.req.marker;
            let id = RequestId(l.req.id);
            let n_blocks = l.req.hashes.len();
            match self
                .cache
                .finish_prefill(id, marker.as_ref(), at as u64, &mut self.mover)
            {
                Ok(_) => {
                    if marker.is_some_and(|m| m.prompt_end) && self.cfg.policy.retention {
                        self.metrics.retained_blocks += n_blocks as u64;
                    }
                }
                Err(e) => {
                    out.push(Event::Failed {
                        id: id.0,
                        why: e.to_string(),
                    });
                    l.cancelled = true;
                    continue;
                }
            }
            l.phase = Phase::Decode;
            l.generated = 1;
            l.first_token = at;
            l.last_token = at;
            let m = meter(
                &mut self.metrics,
                &mut self.quiet,
                &self.unmetered,
                l.req.id,
            );
            m.generation_tokens += 1;
            m.ttft.observe((at - l.arrival) / 1000.0);
            if l.req.stream {
                out.push(Event::First {
                    id: l.req.id,
                    at,
                    admitted: Admitted {
                        arrival: l.arrival,
                        admitted: l.admitted,
                        cached_tokens: l.device_cached + l.restored,
                    },
                });
            }
            if l.generated >= l.req.max_tokens {
                l.done = true;
            }
        }
        let mut decoded = 0u64;
        for &i in &step.decodes {
            let l = &mut self.running[i];
            if l.cancelled || l.done {
                continue;
            }
            let steps = 1 + step.more;
            l.generated += steps;
            decoded += 1;
            // The output's blocks (`hold_tail_blocks`): where none gives way vLLM would
            // preempt; this engine does not model preemption and decodes on.
            let tokens = l.req.prompt_tokens + l.generated;
            let _ = self
                .cache
                .grow(RequestId(l.req.id), tokens, at as u64, &mut self.mover);
            let m = &mut self.metrics;
            m.generation_tokens += steps as u64;
            let gap = first_end - l.last_token;
            m.itl.observe(gap / 1000.0);
            let _ = m.itl_us.record((gap * 1000.0).round() as u64);
            l.last_token = at;
            if l.generated >= l.req.max_tokens {
                l.done = true;
            } else if l.req.stream {
                out.push(Event::Token { id: l.req.id, at });
            }
        }
        for &(us, n, total) in &step.itl_groups {
            let m = &mut self.metrics;
            m.itl.observe_n(total / n as f64 / 1000.0, n * decoded);
            let _ = m.itl_us.record_n(us, n * decoded);
        }
        let mut ended = Vec::new();
        for l in self.running.iter().filter(|l| l.done && !l.cancelled) {
            if let Some(mk) = l.req.marker.filter(|m| m.prompt_end) {
                ended.push((mk.key, mk.kind));
            }
            let o = Outcome {
                prompt_tokens: l.req.prompt_tokens,
                cached_tokens: l.device_cached + l.restored,
                device_cached_tokens: l.device_cached,
                restored_tokens: l.restored,
                transferred_tokens: l.transferred,
                output_tokens: l.generated,
                arrival: l.arrival,
                admitted: l.admitted,
                first_token: l.first_token,
                finished: l.last_token,
                restore_ms: l.restore_ms,
                transfer_ms: l.transfer_ms,
                restore_miss: l.restore_miss,
            };
            let m = meter(
                &mut self.metrics,
                &mut self.quiet,
                &self.unmetered,
                l.req.id,
            );
            m.finished += 1;
            m.e2e.observe(o.e2e_ms() / 1000.0);
            m.prefill.observe((o.first_token - o.admitted) / 1000.0);
            m.decode.observe((o.finished - o.first_token) / 1000.0);
            m.inference.observe((o.finished - o.admitted) / 1000.0);
            m.prompt_len.observe(o.prompt_tokens as f64);
            m.output_len.observe(o.output_tokens as f64);
            m.computed_len.observe(o.computed_tokens() as f64);
            if o.output_tokens > 1 {
                m.tpot.observe(o.itl_ms() / 1000.0);
            }
            out.push(Event::Done {
                id: l.req.id,
                outcome: o,
            });
        }
        let released = self.purge();
        if let Some(p) = self.prefetch.as_mut() {
            for (key, kind) in ended {
                p.turn_ended(key, kind, at, &self.cache, &self.model);
            }
        }
        // A prompt computed (retained, maybe evicting) or a request gone: room changed.
        self.run_prefetch(at, released || !step.chunks.is_empty());
    }

    /// Fires due prefetch plans and, when a plan fired or `changed` says the
    /// device's contents did, tries the armed ones at `now` (prefetch on only).
    /// Only then: a decode run's inner steps change nothing, so results do not
    /// depend on how a run is split (how often the engine is advanced).
    fn run_prefetch(&mut self, now: SimMs, changed: bool) {
        let demand_waits = self.waiting.front().is_some_and(|w| w.arrival <= now);
        if let Some(p) = self.prefetch.as_mut() {
            let at = Moment {
                now,
                changed,
                demand_waits,
                demand_free_at: self.link_free_at,
            };
            p.run(at, &mut self.cache, &mut self.mover, &self.model);
        }
    }

    /// Releases finished and cancelled requests; true if any was released.
    fn purge(&mut self) -> bool {
        let mut released = false;
        let cache = &mut self.cache;
        let live = &mut self.live;
        let unmetered = &mut self.unmetered;
        self.running.retain(|l| {
            if l.done || l.cancelled {
                live.remove(&l.req.id);
                unmetered.remove(&l.req.id);
                // Unknown = already released (a failed finish_prefill); nothing to undo.
                let _ = cache.release(RequestId(l.req.id));
                released = true;
                false
            } else {
                true
            }
        });
        if released {
            self.blocked = false;
        }
        released
    }

    /// Share of recent time spent stepping at `now` (0–1,
    /// [`tether_placement::busy`]): finished steps, and the part of a step in
    /// flight before `now`; an engine idle since its last step decays.
    pub fn busy_share(&self, now: SimMs) -> f64 {
        let since = self.busy.at_ms();
        let running = self
            .in_flight
            .as_ref()
            .map_or(0.0, |s| (now.min(s.end) - s.start.max(since)).max(0.0));
        self.busy.peek(now, running)
    }

    /// [`Self::gauges`] read at `now` (an idle engine's clock stays at its
    /// last event: the busy share decays to `now`).
    pub fn gauges_at(&self, now: SimMs) -> EngineGauges {
        EngineGauges {
            busy: self.busy_share(now.max(self.clock)),
            ..self.gauges()
        }
    }

    /// Point-in-time gauges (running, waiting, queued prefill, KV usage), at
    /// the engine's clock.
    pub fn gauges(&self) -> EngineGauges {
        let pool = self.cache.pool();
        let cap = pool.capacity().max(1);
        let used = cap.saturating_sub(pool.empty_slots() + pool.evictable());
        let live = self.running.iter().filter(|l| !l.cancelled && !l.done);
        let mut running = 0;
        let mut restoring = 0;
        let mut queued = 0u64;
        for l in live {
            running += 1;
            if matches!(l.phase, Phase::Restoring { .. }) {
                restoring += 1;
            }
            queued += (l.uncached - l.prefilled) as u64;
        }
        queued += self
            .waiting
            .iter()
            .map(|w| w.est_uncached as u64)
            .sum::<u64>();
        EngineGauges {
            running,
            waiting: self.waiting.len(),
            restoring,
            queued_prefill_tokens: queued,
            kv_usage: used as f64 / cap as f64,
            kv_cached_blocks: pool.cached(),
            kv_blocks: pool.capacity(),
            device_retentions: self.cache.device_records(),
            host_bytes_used: self.cache.host().used(),
            host_bytes: self.cache.host().capacity(),
            sim_ms: self.clock,
            busy: self.busy_share(self.clock),
            prefill_tokens_per_s: self
                .model
                .prefill_tokens_per_s(self.cfg.max_num_batched_tokens),
        }
    }
}

/// Most prompt tokens a cache hit may cover: full blocks within `prompt - 1`
/// tokens (vLLM recomputes the last token of a fully cached prompt).
pub fn cached_cap(prompt_tokens: usize, block_size: usize) -> usize {
    prompt_tokens.saturating_sub(1) / block_size * block_size
}

mod prefetch;
#[cfg(test)]
mod tests;
