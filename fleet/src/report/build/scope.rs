//! The requests a run covers (its sessions') and what an infinite prefix cache
//! would have served them: the trace's ideal hit ratios.

use super::super::model::{HitRatio, TraceInfo};
use super::ratio;
use crate::trace::{RequestId, SessionId, Trace, content_hash};
use std::collections::{HashMap, HashSet};

/// The requests in scope.
pub(super) struct Scope {
    /// Every request of the sessions run, session by session.
    pub requests: Vec<RequestId>,
    /// Each session's first request.
    pub first: HashSet<RequestId>,
    /// The same requests in arrival order (session order when the sessions
    /// share no timeline).
    arrival_order: Vec<RequestId>,
}

/// Prompt tokens an infinite prefix cache would serve to each request of
/// `order` (in that order), where `cache_of` names the cache a request reads
/// and fills: one per session = perfect affinity, one per rank = the placement
/// seen, one for all = the global bound. Capped at `input − 1`: an engine
/// recomputes the last prompt token even when everything is cached.
pub fn infinite_cache_hits(
    trace: &Trace,
    order: &[RequestId],
    mut cache_of: impl FnMut(RequestId) -> u64,
) -> HashMap<RequestId, u64> {
    let store = trace.blocks();
    let bs = u64::from(trace.block_size());
    let mut seen: HashSet<(u64, usize)> = HashSet::new();
    let mut path = Vec::new();
    let mut out = HashMap::with_capacity(order.len());
    for &id in order {
        let c = cache_of(id);
        let req = trace.request(id);
        store.path_into(req.blocks, &mut path);
        let mut blocks = 0u64;
        for n in &path {
            if !seen.contains(&(c, n.node())) {
                break;
            }
            blocks += store.segment_len(*n) as u64;
        }
        for n in &path {
            seen.insert((c, n.node()));
        }
        let input = u64::from(req.input_tokens);
        out.insert(id, (blocks * bs).min(input.saturating_sub(1)));
    }
    out
}

/// Token sums of the trace's ideal over the scope.
pub(super) struct Ideal {
    /// Prompt tokens of every request in scope.
    pub input: u64,
    /// Of returning requests.
    input_returning: u64,
    /// Served by an infinite cache per session.
    session: u64,
    /// The same on returning requests.
    session_returning: u64,
    /// Served by one infinite cache for all.
    global: u64,
}

impl Scope {
    /// The requests of `sessions`.
    pub fn of(trace: &Trace, sessions: &[SessionId]) -> Self {
        let mut requests: Vec<RequestId> = Vec::new();
        let mut first: HashSet<RequestId> = HashSet::new();
        for &s in sessions {
            let reqs = trace.session_requests(s);
            if let Some(&f) = reqs.first() {
                first.insert(f);
            }
            requests.extend(reqs);
        }
        let scope: HashSet<RequestId> = requests.iter().copied().collect();
        let mut arrival_order: Vec<RequestId> = trace
            .by_arrival()
            .into_iter()
            .filter(|r| scope.contains(r))
            .collect();
        if arrival_order.len() != requests.len() {
            // Sessions without a shared timeline: session order is the only order.
            arrival_order = requests.clone();
        }
        Self {
            requests,
            first,
            arrival_order,
        }
    }

    /// The trace's ideal over these requests.
    pub fn ideal(&self, trace: &Trace) -> Ideal {
        let session = infinite_cache_hits(trace, &self.requests, |r| {
            u64::from(trace.request(r).session.0)
        });
        let global = infinite_cache_hits(trace, &self.arrival_order, |_| 0);
        let input_of = |r: &RequestId| u64::from(trace.request(*r).input_tokens);
        let returning = |r: &&RequestId| !self.first.contains(*r);
        Ideal {
            input: self.requests.iter().map(input_of).sum(),
            input_returning: self.requests.iter().filter(returning).map(input_of).sum(),
            session: session.values().sum(),
            session_returning: session
                .iter()
                .filter(|(r, _)| !self.first.contains(r))
                .map(|(_, v)| v)
                .sum(),
            global: global.values().sum(),
        }
    }

    /// The trace part of the report.
    pub fn trace_info(
        &self,
        trace: &Trace,
        path: String,
        format: String,
        sessions: usize,
    ) -> TraceInfo {
        let reqs = trace.requests();
        let agents: HashSet<u32> = self
            .requests
            .iter()
            .map(|&r| reqs[r.0 as usize].agent.0)
            .collect();
        TraceInfo {
            path,
            name: trace.header().name.clone(),
            format,
            content_hash: content_hash(trace),
            block_size: trace.block_size(),
            sessions: sessions as u64,
            agents: agents.len() as u64,
            requests: self.requests.len() as u64,
            input_tokens: self
                .requests
                .iter()
                .map(|&r| u64::from(reqs[r.0 as usize].input_tokens))
                .sum(),
            output_tokens: self
                .requests
                .iter()
                .map(|&r| u64::from(reqs[r.0 as usize].output_tokens))
                .sum(),
        }
    }
}

impl Ideal {
    /// Hit ratios `overall` and on `returning` turns beside this ideal.
    pub fn hit_ratio(&self, overall: f64, returning: f64) -> HitRatio {
        let ideal_session = ratio(self.session, self.input);
        let ideal_session_returning = ratio(self.session_returning, self.input_returning);
        let of = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        HitRatio {
            overall,
            returning,
            ideal_session,
            ideal_session_returning,
            ideal_global: ratio(self.global, self.input),
            of_shared_cache: of(overall, ratio(self.global, self.input)),
            of_ideal: of(overall, ideal_session),
            of_ideal_returning: of(returning, ideal_session_returning),
        }
    }
}
