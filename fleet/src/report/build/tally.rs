//! The observations counted: requests by outcome, token totals (overall and on
//! returning turns), latency samples, each engine's work, and the clock.

use super::super::model::{EngineLoad, Latency, Requests, Tokens};
use super::super::observe::{Clock, Observation, Outcome};
use crate::quantile::Dist;
use crate::trace::RequestId;
use std::collections::{BTreeMap, HashSet};

/// What the observations add up to.
#[derive(Default)]
pub(super) struct Tally {
    /// Counts.
    pub requests: Requests,
    /// Token totals.
    pub tokens: Tokens,
    /// Prompt tokens of returning requests served.
    pub returning_prompt: u64,
    /// Their cached tokens.
    pub returning_cached: u64,
    /// TTFT of each served request, ms.
    pub ttft: Vec<f64>,
    itl: Vec<f64>,
    e2e: Vec<f64>,
    queue: Vec<f64>,
    tps: Vec<f64>,
    clocks: HashSet<Clock>,
    /// Work per engine named in the answers.
    pub per_engine: BTreeMap<String, EngineLoad>,
    /// Served requests whose engine was not reported.
    pub unattributed: u64,
}

impl Tally {
    /// Counts `observations` of a run over `in_trace` requests; `first` are
    /// the sessions' first requests.
    pub fn of(observations: &[Observation], first: &HashSet<RequestId>, in_trace: u64) -> Self {
        let mut t = Tally {
            requests: Requests {
                in_trace,
                sent: observations.len() as u64,
                ..Default::default()
            },
            ..Default::default()
        };
        let (mut dev, mut restored, mut dev_known, mut res_known) = (0u64, 0u64, true, true);
        for o in observations {
            let s = match &o.outcome {
                Outcome::Failed { kind, .. } => {
                    t.requests.errors += 1;
                    *t.requests.errors_by_kind.entry(kind.name()).or_default() += 1;
                    continue;
                }
                Outcome::Served(s) => s,
            };
            t.requests.completed += 1;
            if s.attempts > 1 {
                t.requests.retried += 1;
            }
            let cached = s.cached_tokens.min(s.prompt_tokens);
            t.tokens.prompt += s.prompt_tokens;
            t.tokens.cached += cached;
            t.tokens.computed += s.prompt_tokens - cached;
            t.tokens.output += s.output_tokens;
            match s.device_cached_tokens {
                Some(d) => dev += d,
                None => dev_known = false,
            }
            match s.restored_tokens {
                Some(d) => restored += d,
                None => res_known = false,
            }
            if !first.contains(&RequestId(o.request)) {
                t.returning_prompt += s.prompt_tokens;
                t.returning_cached += cached;
            }
            let tm = &s.timing;
            t.clocks.insert(tm.clock);
            t.ttft.push(tm.ttft_ms);
            t.e2e.push(tm.e2e_ms);
            t.itl.extend(tm.itl_ms);
            t.queue.extend(tm.queue_ms);
            let decode_ms = tm.e2e_ms - tm.ttft_ms;
            if s.output_tokens > 1 && decode_ms > 0.0 {
                t.tps
                    .push((s.output_tokens - 1) as f64 / (decode_ms / 1000.0));
            }
            match s.engine() {
                Some(e) => {
                    let l = t.per_engine.entry(e.clone()).or_insert_with(|| EngineLoad {
                        engine: e,
                        ..Default::default()
                    });
                    l.requests += 1;
                    l.prompt_tokens += s.prompt_tokens;
                    l.computed_tokens += s.prompt_tokens - cached;
                }
                None => t.unattributed += 1,
            }
        }
        t.requests.not_sent = t.requests.in_trace.saturating_sub(t.requests.sent);
        if t.requests.completed > 0 {
            t.tokens.device_cached = dev_known.then_some(dev);
            t.tokens.restored = res_known.then_some(restored);
        }
        t
    }

    /// Where the latencies came from: `simulated`, `client`, `mixed`, or `none`.
    pub fn clock(&self) -> &'static str {
        match (
            self.clocks.contains(&Clock::Simulated),
            self.clocks.contains(&Clock::Client),
        ) {
            (true, false) => "simulated",
            (false, true) => "client",
            (true, true) => "mixed",
            (false, false) => "none",
        }
    }

    /// The latency distributions (the samples are moved out).
    pub fn latency(&mut self) -> Latency {
        let take = |v: &mut Vec<f64>| Dist::of(std::mem::take(v));
        Latency {
            ttft_ms: take(&mut self.ttft),
            itl_ms: take(&mut self.itl),
            e2e_ms: take(&mut self.e2e),
            queue_ms: take(&mut self.queue),
            output_tokens_per_s: take(&mut self.tps),
        }
    }
}
