//! A session sample of a large trace to search on: every `k`-th session in
//! order of start (systematic sampling keeps the arrival curve's shape, each
//! session whole with its subagents, so its cache behaviour is the trace's),
//! at coarser engine blocks (KV is cached in whole blocks either way; a
//! 4× coarser block costs each turn at most the tokens of one block and the
//! simulator a quarter of its per-block work). The search runs on the sample;
//! only the chosen fleet, sized for the whole trace ([`super::whole`]), is
//! simulated on it
//! (`docs/planning.md`, "Large traces").

use crate::trace::{
    AgentSpec, Header, ModelError, RequestId, RequestSpec, SessionSpec, Trace, TraceBuilder,
};
use serde::Serialize;

/// Engine blocks of a sample are at least this many tokens.
pub const SAMPLE_BLOCK_TOKENS: u32 = 256;

/// How a trace was sampled.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SampleInfo {
    /// One session in this many.
    pub every: usize,
    /// Sessions in the sample.
    pub sessions: usize,
    /// Requests in the sample.
    pub requests: usize,
    /// Requests in the whole trace.
    pub trace_requests: usize,
    /// Tokens per block in the sample (the trace's, or a multiple of it).
    pub block_tokens: u32,
    /// Tokens per block the whole trace's simulation ran at (the trace's
    /// own unless `--coarse-whole`).
    pub whole_block_tokens: u32,
}

/// The sampling factor that leaves about `target` requests of `trace`
/// (1: plan the trace whole).
pub fn every(trace: &Trace, target: usize) -> usize {
    let n = trace.requests().len();
    if target == 0 || n <= 2 * target {
        1
    } else {
        n.div_ceil(target)
    }
}

/// Every `k`-th session of `trace` (the first included), block ids merged
/// `⌈SAMPLE_BLOCK_TOKENS / block size⌉` at a time into one id.
pub fn sessions(trace: &Trace, k: usize) -> Result<(Trace, SampleInfo), ModelError> {
    let bs = trace.block_size();
    let merge = SAMPLE_BLOCK_TOKENS.div_ceil(bs).max(1) as usize;
    let mut b = TraceBuilder::with_header(Header {
        block_size: bs * merge as u32,
        name: trace.header().name.clone(),
        source: None,
    })?;
    let (mut fine, mut coarse) = (Vec::new(), Vec::new());
    let mut count = 0;
    for s in trace.sessions().iter().step_by(k.max(1)) {
        count += 1;
        let sid = b.session(SessionSpec {
            id: s.id.clone(),
            start_ms: s.start_ms,
            tenant: s.tenant.clone(),
            user: s.user.clone(),
        })?;
        for &a in &s.agents {
            let agent = trace.agent(a);
            let parent = agent.parent.map(|p| trace.agent(p));
            let spawned_by_turn = match (parent, agent.spawned_by) {
                (Some(p), Some(r)) => p.requests.iter().position(|&q| q == r),
                _ => None,
            };
            let aid = b.agent(
                sid,
                AgentSpec {
                    id: agent.id.clone(),
                    agent_type: agent.agent_type.clone(),
                    parent: parent.map(|p| p.id.clone()),
                    spawned_by_turn,
                    system_tokens: agent.system_tokens,
                    tool_tokens: agent.tool_tokens,
                },
            )?;
            for &r in &agent.requests {
                trace.hash_ids_into(r, &mut fine);
                merged(&fine, merge, &mut coarse);
                b.request(aid, spec(trace, r), &coarse)?;
            }
        }
    }
    let t = b.build()?;
    let info = SampleInfo {
        every: k.max(1),
        sessions: count,
        requests: t.requests().len(),
        trace_requests: trace.requests().len(),
        block_tokens: t.block_size(),
        whole_block_tokens: trace.block_size(),
    };
    Ok((t, info))
}

/// A request's line, as the trace has it (its real messages left behind).
fn spec(trace: &Trace, r: RequestId) -> RequestSpec {
    let q = trace.request(r);
    RequestSpec {
        at_ms: q.at_ms,
        gap_ms: q.gap_ms,
        input_tokens: q.input_tokens,
        output_tokens: q.output_tokens,
        opened_by: q.opened_by,
        ended_by: q.ended_by,
        api: q.api,
        model: trace.model_of(r).map(str::to_owned),
        messages: None,
    }
}

/// `ids` in runs of `n`, each run one id: equal runs at equal places give
/// equal ids, so shared prefixes stay shared.
pub(super) fn merged(ids: &[u64], n: usize, out: &mut Vec<u64>) {
    out.clear();
    if n == 1 {
        out.extend_from_slice(ids);
        return;
    }
    // One buffer for every run (an allocation per merged block was most of
    // the time to merge a million-request trace); the same bytes, the same ids.
    let mut bytes = Vec::with_capacity(n * 8);
    out.extend(ids.chunks(n).map(|c| {
        bytes.clear();
        bytes.extend(c.iter().flat_map(|x| x.to_le_bytes()));
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }));
}
