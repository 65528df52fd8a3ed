//! When each request of a session may be sent: its dependencies and its
//! release time. Pure and clock-free: the driver tells it what completed and
//! when (trace milliseconds since the replay started), it answers what is
//! ready and from when.
//!
//! Dependencies (both schedules):
//! - an agent's request waits for the agent's previous request (its answer is
//!   in the next prompt);
//! - a subagent's first request waits for the parent request that spawned it;
//! - a parent's next request waits for the subagents spawned by its previous
//!   request **when the trace shows it did** (the subagent's last request
//!   arrived before the parent's next one); a subagent still running in the
//!   trace when the parent went on (a background task) runs alongside.
//!
//! Release times:
//! - **fixed**: the trace's own arrival time (`start_ms + at_ms`, shifted so
//!   the first session starts at 0), or when the dependencies complete if
//!   that is later (the lag is recorded);
//! - **live** (AgentX-style): when the dependencies complete plus the think or
//!   tool gap — the recorded `gap_ms`, else the trace's gap between the two
//!   arrivals minus the predecessor's replayed latency — capped at `max_gap_ms`.
//!   A request whose only dependency is a subagent it waited for goes at once.

use crate::trace::{RequestId, SessionId, Trace};
use std::collections::HashMap;

/// How requests are released.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// At the trace's timestamps; `origin_ms` is subtracted from every arrival.
    Fixed {
        /// The trace time that maps to replay time 0.
        origin_ms: u64,
    },
    /// As soon as dependencies allow, plus gaps capped at `max_gap_ms`.
    Live {
        /// Cap on any idle gap.
        max_gap_ms: u64,
    },
}

#[derive(Clone, Debug)]
struct Node {
    id: RequestId,
    /// The request it follows (same agent, or the spawning parent request):
    /// the gap is measured from it.
    main_dep: Option<usize>,
    /// Subagents' last requests it waits for.
    sub_deps: Vec<usize>,
    /// Trace arrival, ms from the session start.
    at_ms: u64,
    gap_ms: Option<u64>,
    released: bool,
    /// (completed at, replayed latency), replay ms.
    done: Option<(f64, f64)>,
}

/// One session's requests and their dependencies.
#[derive(Clone, Debug)]
pub struct SessionPlan {
    nodes: Vec<Node>,
    index: HashMap<RequestId, usize>,
    start_ms: Option<u64>,
    mode: Mode,
    remaining: usize,
}

impl SessionPlan {
    /// The plan of `session`.
    pub fn new(trace: &Trace, session: SessionId, mode: Mode) -> Self {
        let order = trace.session_requests(session);
        let index: HashMap<RequestId, usize> =
            order.iter().enumerate().map(|(i, &r)| (r, i)).collect();
        let mut nodes: Vec<Node> = order
            .iter()
            .map(|&id| {
                let r = trace.request(id);
                Node {
                    id,
                    main_dep: None,
                    sub_deps: Vec::new(),
                    at_ms: r.at_ms,
                    gap_ms: r.gap_ms,
                    released: false,
                    done: None,
                }
            })
            .collect();
        let s = trace.session(session);
        for &a in &s.agents {
            let agent = trace.agent(a);
            for (k, &rid) in agent.requests.iter().enumerate() {
                let Some(&i) = index.get(&rid) else { continue };
                nodes[i].main_dep = if k > 0 {
                    index.get(&agent.requests[k - 1]).copied()
                } else {
                    agent.spawned_by.and_then(|p| index.get(&p).copied())
                };
            }
            // Subagents spawned by this agent's request k: does request k+1 wait?
            for &c in &s.agents {
                let child = trace.agent(c);
                if child.parent != Some(a) {
                    continue;
                }
                let (Some(spawn), Some(&last)) = (child.spawned_by, child.requests.last()) else {
                    continue;
                };
                let Some(k) = agent.requests.iter().position(|&r| r == spawn) else {
                    continue;
                };
                let Some(&next) = agent.requests.get(k + 1) else {
                    continue;
                };
                if trace.request(last).at_ms <= trace.request(next).at_ms
                    && let (Some(&ni), Some(&li)) = (index.get(&next), index.get(&last))
                {
                    nodes[ni].sub_deps.push(li);
                }
            }
        }
        Self {
            remaining: nodes.len(),
            nodes,
            index,
            start_ms: s.start_ms,
            mode,
        }
    }

    /// Requests of the session.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the session has no requests.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every request has completed.
    pub fn is_done(&self) -> bool {
        self.remaining == 0
    }

    /// The requests whose dependencies have all completed and that were not
    /// handed out before, each with its release time (replay ms) and the
    /// time it is due by the trace (fixed mode; for the lag), in session order.
    /// `session_start_ms` is when a live session began (ignored in fixed mode).
    pub fn ready(&mut self, session_start_ms: f64) -> Vec<(RequestId, f64, f64)> {
        let mut out = Vec::new();
        for i in 0..self.nodes.len() {
            let n = &self.nodes[i];
            if n.released {
                continue;
            }
            let deps: Vec<usize> = n
                .main_dep
                .iter()
                .copied()
                .chain(n.sub_deps.iter().copied())
                .collect();
            if deps.iter().any(|&d| self.nodes[d].done.is_none()) {
                continue;
            }
            let deps_done = deps
                .iter()
                .filter_map(|&d| self.nodes[d].done.map(|x| x.0))
                .fold(0.0, f64::max);
            let (release, due) = match self.mode {
                Mode::Fixed { origin_ms } => {
                    let due = (self.start_ms.unwrap_or(origin_ms) + n.at_ms)
                        .saturating_sub(origin_ms) as f64;
                    (due.max(deps_done), due)
                }
                Mode::Live { max_gap_ms } => {
                    let after_main = match n.main_dep {
                        None => session_start_ms,
                        Some(d) => {
                            let prev = &self.nodes[d];
                            let (done_at, latency) = prev.done.unwrap_or((0.0, 0.0));
                            let gap = match n.gap_ms {
                                Some(g) => g as f64,
                                None => {
                                    (n.at_ms.saturating_sub(prev.at_ms) as f64 - latency).max(0.0)
                                }
                            };
                            done_at + gap.min(max_gap_ms as f64)
                        }
                    };
                    let r = after_main.max(deps_done);
                    (r, r)
                }
            };
            self.nodes[i].released = true;
            out.push((self.nodes[i].id, release, due));
        }
        out
    }

    /// Records that `id` completed (or failed: the agent goes on) at `at_ms`
    /// after `latency_ms` (both replay ms).
    pub fn complete(&mut self, id: RequestId, at_ms: f64, latency_ms: f64) {
        if let Some(&i) = self.index.get(&id)
            && self.nodes[i].done.is_none()
        {
            self.nodes[i].done = Some((at_ms, latency_ms));
            self.remaining -= 1;
        }
    }
}

#[cfg(test)]
mod tests;
