//! Rebalancing in tool gaps: where a retained state is copied while its session
//! waits on a tool, so that the next turn finds it on a cooler rank (issue 27;
//! `docs/gateway.md` "Residency-aware placement", rule 1's tie between holders).
//!
//! The gateway keeps no per-session state: the engines copy, and the residency
//! rule only reads their summaries. At a `tool`/`handoff` turn's end the home (the
//! endpoint that just retained the state) asks this function for a target; when
//! there is one, the target pulls the state during the gap. When the turn returns,
//! [`Placement::place_resident`] finds two holders of the same state and takes the
//! less loaded; the holder it did not take lets its copy go.
//!
//! **The trigger is memory, not requests.** A home is relieved when its device
//! KV in use (requests and retentions, the `/load` report's `kv_usage`) is above
//! [`Rebalance::kv_factor`] × the mean over the endpoints — the imbalance the copy
//! repairs. A home over the *request* bound needs no copy in the gap: the rule
//! moves its next turn at arrival (rule 3), and copying on that signal was
//! measured to spread KV no better (BENCHMARKS.md, "Rebalancing in tool gaps").
//!
//! **The target** is the key's candidate (first *d* rendezvous choices) with the
//! least KV in use among those that are under the request bound, hold less KV than
//! the mean, would still hold less than the home holds now once the state landed
//! (a state large against a rank's KV only moves the hot spot), and have no more
//! prefill queued than the home (a returning turn must not land behind another
//! session's cold prefill); ties go to the rendezvous order.
//!
//! **The home lets its device copy go** when the copy lands: it moves its own to
//! the host tier (`RetentionCache::demote`), so the relief starts in the gap, not
//! when the turn returns. Measured against keeping both on the device until the
//! turn returns (BENCHMARKS.md "Rebalancing in tool gaps"): with both copies on the
//! device a copy only adds KV to the target for the gap's length.

use crate::{Placement, Rule};

/// Rebalancing settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rebalance {
    /// A home whose device KV in use is above this × the mean is relieved (> 1).
    pub kv_factor: f64,
}

impl Default for Rebalance {
    fn default() -> Self {
        Self { kv_factor: 1.1 }
    }
}

/// What the home knows of every endpoint (its last poll of their `/load`).
#[derive(Clone, Copy, Debug)]
pub struct Loads<'a> {
    /// Requests running + waiting, per endpoint (the residency rule's loads).
    pub requests: &'a [f64],
    /// Device KV in use, 0–1, per endpoint.
    pub kv_usage: &'a [f64],
    /// Prompt tokens queued for prefill, per endpoint.
    pub backlog: &'a [f64],
}

impl Placement {
    /// The candidate to copy `key`'s state to from `home` during a tool gap
    /// ([module docs](self)), or `None`: the home is not one of the key's
    /// candidates (the rule would not look for the state there), its KV in use
    /// is within `settings.kv_factor` × the mean, or no candidate qualifies.
    /// `state` is the state's size as a share of one endpoint's device KV (the
    /// home's own capacity stands for every endpoint's; 0 when unknown).
    pub fn rebalance_target(
        &self,
        key: u64,
        home: usize,
        rule: &Rule,
        settings: Rebalance,
        view: Loads<'_>,
        state: f64,
    ) -> Option<usize> {
        let state = if state.is_finite() {
            state.max(0.0)
        } else {
            0.0
        };
        let d = rule.candidates.max(1);
        let cands = self.pick(key, d - 1)?.order;
        let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
        let kv = |i: usize| at(view.kv_usage, i);
        let n = self.endpoints().len().max(1);
        let mean_kv = (0..n).map(kv).sum::<f64>() / n as f64;
        if !cands.contains(&home) || kv(home) <= settings.kv_factor * mean_kv {
            return None;
        }
        let shares = self.shares();
        let total: f64 = view.requests.iter().sum();
        let room = |i: usize| {
            at(view.requests, i)
                < rule
                    .bound
                    .capacity(total, shares.get(i).copied().unwrap_or(0.0))
        };
        cands
            .iter()
            .copied()
            .filter(|&i| {
                i != home
                    && room(i)
                    && kv(i) + state < kv(home)
                    && kv(i) < mean_kv
                    && at(view.backlog, i) <= at(view.backlog, home)
            })
            .fold(None, |best: Option<usize>, i| match best {
                Some(b) if kv(b) <= kv(i) => Some(b),
                _ => Some(i),
            })
    }
}

#[cfg(test)]
mod tests;
