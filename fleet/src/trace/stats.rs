//! What a trace holds (sessions, agents, requests, tokens, turn kinds) and its
//! ideal prefix-cache hit ratio with an infinite cache.

use super::model::{Api, EndReason, RequestId, SessionId, Trace};
use crate::quantile::nearest_rank;
use serde::Serialize;
use std::collections::BTreeMap;
use tether_wire::TurnKind;

/// Quantiles of a sample (nearest rank, [`crate::quantile`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Quantiles {
    /// Smallest.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl Quantiles {
    /// Of a sample (empty → zeros).
    pub fn of(mut v: Vec<u64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_unstable();
        let at = |q: f64| nearest_rank(&v, q).unwrap_or(0);
        Self {
            min: at(0.0),
            p50: at(0.5),
            p90: at(0.9),
            max: at(1.0),
            mean: v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64,
        }
    }
}

/// The summary `tether trace stats` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceStats {
    /// Tokens per block.
    pub block_size: u32,
    /// Sessions.
    pub sessions: usize,
    /// Agents (main agents included).
    pub agents: usize,
    /// Subagents.
    pub subagents: usize,
    /// Share of sessions with at least one subagent.
    pub sessions_with_subagents: f64,
    /// Requests.
    pub requests: usize,
    /// Requests per session.
    pub requests_per_session: Quantiles,
    /// Prompt tokens per request.
    pub input_tokens: Quantiles,
    /// Generated tokens per request.
    pub output_tokens: Quantiles,
    /// Prompt tokens, total.
    pub input_tokens_total: u64,
    /// Generated tokens, total.
    pub output_tokens_total: u64,
    /// Requests by what opened them.
    pub opened_by: BTreeMap<&'static str, usize>,
    /// Requests by how they ended (`unknown` when not recorded).
    pub ended_by: BTreeMap<&'static str, usize>,
    /// Requests by API.
    pub api: BTreeMap<&'static str, usize>,
    /// Recorded think/tool gaps, ms.
    pub gap_ms: Quantiles,
    /// Time from the first to the last arrival, ms (sessions with a start only).
    pub span_ms: u64,
    /// Requests whose block ids cover fewer tokens than their prompt.
    pub short_hash_ids: usize,
    /// Ideal hit ratios.
    pub ideal: IdealHits,
    /// Distinct blocks in the trace.
    pub distinct_blocks: u64,
    /// Nodes of the block store (its memory is proportional to this).
    pub block_nodes: usize,
}

/// Prompt tokens an infinite prefix cache would serve, as a share of all prompt tokens.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct IdealHits {
    /// One cache shared by every request (every block seen before is a hit):
    /// the upper bound of any placement.
    pub global: f64,
    /// Perfect affinity: each session's own earlier blocks only (what
    /// session-sticky routing keeps even when sessions share nothing).
    pub session: f64,
    /// `session`, counting returning requests only (not a session's first).
    pub session_returning: f64,
}

/// Hit tokens of a request whose first `blocks` blocks were cached.
fn hit_tokens(trace: &Trace, id: RequestId, blocks: usize) -> u64 {
    (blocks as u64 * u64::from(trace.block_size())).min(u64::from(trace.request(id).input_tokens))
}

/// The ideal hit ratios of a trace (arrival order; see [`IdealHits`]).
pub fn ideal_hits(trace: &Trace) -> IdealHits {
    let store = trace.blocks();
    let mut path = Vec::new();
    let total: u64 = trace
        .requests()
        .iter()
        .map(|r| u64::from(r.input_tokens))
        .sum();
    let ratio = |hit: u64, of: u64| if of == 0 { 0.0 } else { hit as f64 / of as f64 };

    let mut seen = vec![false; store.node_count()];
    let mut global = 0u64;
    for id in trace.by_arrival() {
        store.path_into(trace.request(id).blocks, &mut path);
        let mut blocks = 0;
        for n in &path {
            if !seen[n.node()] {
                break;
            }
            blocks += store.segment_len(*n);
        }
        for n in &path {
            seen[n.node()] = true;
        }
        global += hit_tokens(trace, id, blocks);
    }

    let mut stamp = vec![u32::MAX; store.node_count()];
    let (mut session, mut returning, mut returning_total) = (0u64, 0u64, 0u64);
    for si in 0..trace.sessions().len() {
        for (k, id) in trace
            .session_requests(SessionId(si as u32))
            .into_iter()
            .enumerate()
        {
            store.path_into(trace.request(id).blocks, &mut path);
            let mut blocks = 0;
            for n in &path {
                if stamp[n.node()] != si as u32 {
                    break;
                }
                blocks += store.segment_len(*n);
            }
            for n in &path {
                stamp[n.node()] = si as u32;
            }
            let hit = hit_tokens(trace, id, blocks);
            session += hit;
            if k > 0 {
                returning += hit;
                returning_total += u64::from(trace.request(id).input_tokens);
            }
        }
    }
    IdealHits {
        global: ratio(global, total),
        session: ratio(session, total),
        session_returning: ratio(returning, returning_total),
    }
}

/// Summarizes a trace.
pub fn stats(trace: &Trace) -> TraceStats {
    let reqs = trace.requests();
    let bs = u64::from(trace.block_size());
    let mut opened_by: BTreeMap<&'static str, usize> =
        TurnKind::ALL.iter().map(|k| (k.name(), 0)).collect();
    let mut ended_by: BTreeMap<&'static str, usize> =
        EndReason::ALL.iter().map(|k| (k.name(), 0)).collect();
    let mut api: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut short = 0;
    for (i, r) in reqs.iter().enumerate() {
        *opened_by.entry(r.opened_by.name()).or_default() += 1;
        *ended_by
            .entry(r.ended_by.map_or("unknown", EndReason::name))
            .or_default() += 1;
        *api.entry(r.api.name()).or_default() += 1;
        if (trace.block_count(RequestId(i as u32)) as u64) * bs < u64::from(r.input_tokens) {
            short += 1;
        }
    }
    api.retain(|k, v| *v > 0 || *k == Api::Chat.name());
    let subagents = trace.agents().iter().filter(|a| a.parent.is_some()).count();
    let with_sub = trace
        .sessions()
        .iter()
        .filter(|s| s.agents.len() > 1)
        .count();
    let arrivals: Vec<u64> = (0..reqs.len() as u32)
        .filter_map(|i| trace.arrival_ms(RequestId(i)))
        .collect();
    let span_ms = match (arrivals.iter().min(), arrivals.iter().max()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    TraceStats {
        block_size: trace.block_size(),
        sessions: trace.sessions().len(),
        agents: trace.agents().len(),
        subagents,
        sessions_with_subagents: with_sub as f64 / trace.sessions().len().max(1) as f64,
        requests: reqs.len(),
        requests_per_session: Quantiles::of(
            trace
                .sessions()
                .iter()
                .map(|s| {
                    s.agents
                        .iter()
                        .map(|a| trace.agent(*a).requests.len() as u64)
                        .sum()
                })
                .collect(),
        ),
        input_tokens: Quantiles::of(reqs.iter().map(|r| u64::from(r.input_tokens)).collect()),
        output_tokens: Quantiles::of(reqs.iter().map(|r| u64::from(r.output_tokens)).collect()),
        input_tokens_total: reqs.iter().map(|r| u64::from(r.input_tokens)).sum(),
        output_tokens_total: reqs.iter().map(|r| u64::from(r.output_tokens)).sum(),
        opened_by,
        ended_by,
        api,
        gap_ms: Quantiles::of(reqs.iter().filter_map(|r| r.gap_ms).collect()),
        span_ms,
        short_hash_ids: short,
        ideal: ideal_hits(trace),
        distinct_blocks: trace.blocks().distinct_blocks(),
        block_nodes: trace.blocks().node_count(),
    }
}

impl std::fmt::Display for TraceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = |q: &Quantiles| {
            format!(
                "median {} (p90 {}, min {}, max {}, mean {:.1})",
                q.p50, q.p90, q.min, q.max, q.mean
            )
        };
        let counts = |m: &BTreeMap<&'static str, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(
            f,
            "sessions     {} ({} with subagents, {:.0} %)",
            self.sessions,
            (self.sessions_with_subagents * self.sessions as f64).round(),
            self.sessions_with_subagents * 100.0
        )?;
        writeln!(
            f,
            "agents       {} ({} main, {} subagents)",
            self.agents,
            self.agents - self.subagents,
            self.subagents
        )?;
        writeln!(f, "requests     {}", self.requests)?;
        writeln!(f, "per session  {}", q(&self.requests_per_session))?;
        writeln!(
            f,
            "input tok    {} total; per request {}",
            self.input_tokens_total,
            q(&self.input_tokens)
        )?;
        writeln!(
            f,
            "output tok   {} total; per request {}",
            self.output_tokens_total,
            q(&self.output_tokens)
        )?;
        writeln!(f, "opened by    {}", counts(&self.opened_by))?;
        writeln!(f, "ended by     {}", counts(&self.ended_by))?;
        writeln!(f, "api          {}", counts(&self.api))?;
        if self.gap_ms.max > 0 {
            writeln!(f, "gap ms       {}", q(&self.gap_ms))?;
        }
        writeln!(f, "span         {:.1} s", self.span_ms as f64 / 1000.0)?;
        writeln!(
            f,
            "blocks       {} tokens each; {} distinct in {} store nodes; {} requests with ids covering less than their prompt",
            self.block_size, self.distinct_blocks, self.block_nodes, self.short_hash_ids
        )?;
        writeln!(
            f,
            "ideal hit    {:.1} % with one infinite cache shared by all; {:.1} % with perfect session affinity ({:.1} % on returning requests)",
            self.ideal.global * 100.0,
            self.ideal.session * 100.0,
            self.ideal.session_returning * 100.0
        )
    }
}

#[cfg(test)]
mod tests;
