//! Per-session and per-subagent figures: how the hit ratio spreads over
//! sessions, how long sessions took against the trace, first turns against
//! returning ones, and the returning turns that lost their cache, with why.

use super::super::model::{LostTurns, Sessions};
use super::super::observe::{Clock, Observation};
use super::ratio;
use super::scope::infinite_cache_hits;
use crate::quantile::{self, Dist};
use crate::trace::{AgentId, RequestId, SessionId, Trace};
use std::collections::{HashMap, HashSet};

/// One session's served requests, summed.
#[derive(Default)]
struct PerSession {
    prompt: u64,
    cached: u64,
    ceiling: u64,
    first_sent_ms: Option<f64>,
    last_end_ms: f64,
}

/// The per-session figures of the served `observations` (`first`: each
/// session's first request; `speedup`: trace ms per wall ms, for answers timed
/// by the client's clock), and each session's hit ratio, sorted.
pub(super) fn sessions(
    trace: &Trace,
    observations: &[Observation],
    first: &HashSet<RequestId>,
    speedup: f64,
) -> (Sessions, Vec<f64>) {
    let mut served: Vec<&Observation> = observations
        .iter()
        .filter(|o| o.served().is_some())
        .collect();
    served.sort_by(|a, b| {
        a.sent_ms
            .total_cmp(&b.sent_ms)
            .then(a.request.cmp(&b.request))
    });
    let order: Vec<RequestId> = served.iter().map(|o| RequestId(o.request)).collect();
    // The session-affinity ceiling of each request, in the order sent.
    let ceiling = infinite_cache_hits(trace, &order, |r| u64::from(trace.request(r).session.0));
    let bs = u64::from(trace.block_size());
    let mut per: HashMap<SessionId, PerSession> = HashMap::new();
    let mut last_engine: HashMap<AgentId, Option<String>> = HashMap::new();
    let mut lost = LostTurns::default();
    let (mut ttft_first, mut ttft_returning) = (Vec::new(), Vec::new());
    let (mut main, mut sub) = ((0u64, 0u64), (0u64, 0u64));
    for o in &served {
        let Some(s) = o.served() else { continue };
        let id = RequestId(o.request);
        let req = trace.request(id);
        let c = ceiling.get(&id).copied().unwrap_or(0);
        let p = per.entry(req.session).or_default();
        p.prompt += s.prompt_tokens;
        p.cached += s.cached_tokens;
        p.ceiling += c;
        p.first_sent_ms.get_or_insert(o.sent_ms);
        let e2e = match s.timing.clock {
            Clock::Simulated => s.timing.e2e_ms,
            Clock::Client => s.timing.e2e_ms * speedup,
        };
        p.last_end_ms = p.last_end_ms.max(o.sent_ms + e2e);
        let agent = &trace.agents()[req.agent.0 as usize];
        let tally = if agent.parent.is_none() {
            &mut main
        } else {
            &mut sub
        };
        tally.0 += s.cached_tokens;
        tally.1 += s.prompt_tokens;
        let engine = s.engine();
        let previous = last_engine.insert(req.agent, engine.clone());
        if first.contains(&id) {
            ttft_first.push(s.timing.ttft_ms);
            continue;
        }
        ttft_returning.push(s.timing.ttft_ms);
        lost.returning += 1;
        // Lost: more than a block short of what its session's own cache held
        // (a partial last block is recomputed anyway).
        if s.cached_tokens + bs >= c {
            continue;
        }
        lost.tokens += c - s.cached_tokens;
        match (engine, previous.flatten()) {
            (Some(now), Some(before)) if now != before => lost.moved += 1,
            (Some(_), Some(_)) => lost.evicted += 1,
            _ => lost.unknown += 1,
        }
    }
    let ratios: Vec<f64> = per.values().map(|p| ratio(p.cached, p.prompt)).collect();
    let of_ceiling: Vec<f64> = per
        .values()
        .filter(|p| p.ceiling > 0)
        .map(|p| p.cached as f64 / p.ceiling as f64)
        .collect();
    let completion: Vec<f64> = per
        .iter()
        .filter_map(|(sid, p)| {
            let span = trace_span_ms(trace, *sid)?;
            Some((p.last_end_ms - p.first_sent_ms?) / span)
        })
        .collect();
    let sorted = quantile::sorted(ratios);
    let x = Sessions {
        count: per.len() as u64,
        hit_ratio_p10: quantile::of(&sorted, 0.1).unwrap_or(0.0),
        hit_ratio: Dist::of(sorted.clone()),
        of_ceiling: Dist::of(of_ceiling),
        completion_vs_trace: Dist::of(completion),
        ttft_first_ms: Dist::of(ttft_first),
        ttft_returning_ms: Dist::of(ttft_returning),
        main_hit_ratio: ratio(main.0, main.1),
        subagent_hit_ratio: (sub.1 > 0).then(|| ratio(sub.0, sub.1)),
        lost,
    };
    (x, sorted)
}

/// The trace's own span of a session: its last request's arrival after its
/// first one's, in trace ms; `None` for a one-request session.
fn trace_span_ms(trace: &Trace, s: SessionId) -> Option<f64> {
    let at: Vec<u64> = trace
        .session_requests(s)
        .iter()
        .map(|&r| trace.request(r).at_ms)
        .collect();
    let span = at.iter().max()? - at.iter().min()?;
    (span > 0).then_some(span as f64)
}
