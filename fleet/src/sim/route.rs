//! Routing policies: where the gateway sends each request, on the same
//! placement code the tether filter links (`tether-placement`).
//!
//! Each policy sees only what a real gateway of its kind sees: hash policies a
//! key ([`super::identity`]), load-aware ones a load view — requests in flight
//! per rank as the gateway counts them (exact: it sees every response end), or
//! the ranks' `/load` reports polled on a tick (stale by up to a tick).

use super::config::{Policy, PrefixOptions};
use super::prefix::ApproxTree;
use crate::trace::{BlockRef, BlockStore};
use std::collections::HashMap;
use tether_placement::{
    Endpoint, How, Knows, LoadBound, Loads, Placement, Rebalance, Rule, first_under_bound,
};

/// `n` equal endpoints with stable addresses (rank `i` keeps its address when
/// the active set changes, so rendezvous moves only the keys of ranks that
/// come or go).
pub fn endpoints(pool: &str, ranks: impl IntoIterator<Item = usize>) -> Vec<Endpoint> {
    ranks
        .into_iter()
        .map(|i| Endpoint {
            address: format!("{pool}-{i}.fleet:8000"),
            weight: 1.0,
            dp_size: 1,
            name: None,
        })
        .collect()
}

/// What a policy may look at when placing a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    /// The policy's hash key (routing key, user or address key); for policies
    /// without one, a per-request value used only to break ties.
    pub key: u64,
    /// Requests in flight per rank, as the gateway counts them.
    pub inflight: &'a [f64],
    /// Their sum.
    pub inflight_total: f64,
    /// The polled load view (running + waiting per rank at the last poll).
    pub polled: &'a [f64],
    /// The request's block-tree path (prefix policy).
    pub path: &'a [BlockRef],
    /// The trace's block tree.
    pub store: &'a BlockStore,
    /// Its prompt tokens (prefix policy's match rate).
    pub prompt_tokens: u64,
}

/// One pool's router: a policy over the pool's active ranks.
#[derive(Debug)]
pub struct Router {
    policy: Policy,
    /// Active ranks (pool indices); placement endpoint `j` is rank `active[j]`.
    active: Vec<usize>,
    /// `active` as a mask over the pool.
    mask: Vec<bool>,
    placement: Placement,
    shares: Vec<f64>,
    /// Rendezvous orders by key, for the active set (cleared when it changes).
    orders: HashMap<u64, Vec<u32>>,
    fallbacks: usize,
    bound: LoadBound,
    rr: usize,
    prefix: PrefixOptions,
    tree: Option<ApproxTree>,
    /// Scratch: loads of the active ranks.
    view: Vec<f64>,
}

impl Router {
    /// A router for `ranks` ranks of pool `pool` (all active).
    pub fn new(
        policy: Policy,
        pool: &str,
        ranks: usize,
        fallbacks: usize,
        bound: LoadBound,
        prefix: PrefixOptions,
        tree: Option<(&BlockStore, u32)>,
    ) -> Self {
        let active: Vec<usize> = (0..ranks).collect();
        let placement = Placement::new(&endpoints(pool, active.iter().copied()));
        Self {
            policy,
            shares: placement.shares(),
            placement,
            mask: vec![true; ranks],
            active,
            orders: HashMap::new(),
            fallbacks,
            bound,
            rr: 0,
            prefix,
            tree: tree.map(|(s, b)| ApproxTree::new(s, ranks, b)),
            view: Vec::new(),
        }
    }

    /// Changes the active ranks (a scaling step): keys of ranks that stay keep
    /// their rank.
    pub fn set_active(&mut self, pool: &str, active: Vec<usize>) {
        self.placement = Placement::new(&endpoints(pool, active.iter().copied()));
        self.shares = self.placement.shares();
        self.mask.iter_mut().for_each(|m| *m = false);
        for &r in &active {
            if let Some(m) = self.mask.get_mut(r) {
                *m = true;
            }
        }
        self.active = active;
        self.orders.clear();
    }

    /// The active ranks.
    pub fn active(&self) -> &[usize] {
        &self.active
    }

    fn order(&mut self, key: u64) -> &[u32] {
        let (placement, fallbacks) = (&self.placement, self.fallbacks);
        self.orders.entry(key).or_insert_with(|| {
            placement
                .pick(key, fallbacks)
                .map(|p| p.order.iter().map(|&i| i as u32).collect())
                .unwrap_or_default()
        })
    }

    fn gather(&mut self, loads: &[f64]) {
        self.view.clear();
        self.view.extend(
            self.active
                .iter()
                .map(|&r| loads.get(r).copied().unwrap_or(0.0)),
        );
    }

    /// Least loaded active rank by `loads`, ties broken by `key`'s rendezvous score.
    fn least(&mut self, key: u64, loads: &[f64]) -> Option<usize> {
        self.gather(loads);
        let min = self.view.iter().copied().fold(f64::INFINITY, f64::min);
        let view = &self.view;
        let tied = (0..view.len()).filter(|&j| view[j] == min);
        self.placement
            .least_loaded(key, tied, view)
            .map(|j| self.active[j])
    }

    /// The rank for a request. `None` only without active ranks.
    pub fn route(&mut self, input: &RouteInput) -> Option<usize> {
        if self.active.is_empty() {
            return None;
        }
        let n = self.active.len();
        match self.policy {
            Policy::RoundRobin => {
                let r = self.active[self.rr % n];
                self.rr = self.rr.wrapping_add(1);
                Some(r)
            }
            Policy::LeastLoaded | Policy::Oracle => self.least(input.key, input.inflight),
            Policy::ClientHash | Policy::UserHash | Policy::Tether => {
                let j = *self.order(input.key).first()? as usize;
                Some(self.active[j])
            }
            Policy::TetherBounded => {
                self.bounded(input.key, input.inflight, Some(input.inflight_total))
            }
            // `tether-resident` without residency: the bounded pick it falls back to.
            Policy::TetherLoad | Policy::TetherResident => {
                self.bounded(input.key, input.polled, None)
            }
            Policy::Prefix => self.prefix(input),
        }
    }

    fn bounded(&mut self, key: u64, loads: &[f64], total: Option<f64>) -> Option<usize> {
        self.order(key);
        let order: Vec<usize> = self.orders.get(&key)?.iter().map(|&j| j as usize).collect();
        // Endpoint j is rank active[j]; with every rank active that is j itself,
        // and the pool's loads serve as the view without a copy.
        let all = self.active.len() == loads.len();
        let view: &[f64] = if all {
            loads
        } else {
            self.gather(loads);
            &self.view
        };
        let total = match total {
            Some(t) if all => t,
            _ => view.iter().sum(),
        };
        let pos = first_under_bound(&order, view, &self.shares, total, self.bound)?;
        Some(self.active[*order.get(pos)?])
    }

    /// `tether-resident`: the key placed by residency and load among its
    /// first `rule.candidates` rendezvous candidates
    /// ([`Placement::place_resident`], the filter's code), `loads` per pool
    /// rank and `knows(rank)` what a rank holds for the key. Returns the rank
    /// and why; a migration's `from` is a pool rank too.
    pub fn route_resident(
        &mut self,
        key: u64,
        loads: &[f64],
        backlog: &[f64],
        rule: &Rule,
        knows: impl Fn(usize) -> Knows,
    ) -> Option<(usize, How)> {
        self.gather(loads);
        let active = &self.active;
        // Each backlog as a wait at the rule's rate: the profile's own, as a
        // rank of it reports in `/load` (`prefill_tokens_per_s`).
        let waits: Vec<f64> = if backlog.is_empty() {
            Vec::new()
        } else {
            active
                .iter()
                .map(|&r| {
                    rule.cost
                        .wait_ms(backlog.get(r).copied().unwrap_or(0.0), None)
                })
                .collect()
        };
        let choice = self.placement.place_resident_in(
            key,
            rule.candidates.saturating_sub(1),
            rule,
            &self.view,
            &waits,
            |j| active.get(j).map_or(Knows::Unknown, |&r| knows(r)),
        )?;
        let rank = |j: usize| active.get(j).copied();
        let how = match choice.how {
            How::Migrate { from } => How::Migrate { from: rank(from)? },
            How::Recompute { from } => How::Recompute { from: rank(from)? },
            h => h,
        };
        Some((rank(choice.endpoint()?)?, how))
    }

    /// `tether-resident` rebalancing: the pool rank to copy `key`'s state to
    /// from pool rank `home` during a tool gap
    /// ([`Placement::rebalance_target`] over the active ranks); the views per
    /// pool rank.
    pub fn rebalance_target(
        &mut self,
        key: u64,
        home: usize,
        rule: &Rule,
        settings: Rebalance,
        view: Loads<'_>,
        state: f64,
    ) -> Option<usize> {
        let pick = |v: &[f64]| -> Vec<f64> {
            self.active
                .iter()
                .map(|&r| v.get(r).copied().unwrap_or(0.0))
                .collect()
        };
        let (requests, kv_usage, backlog) =
            (pick(view.requests), pick(view.kv_usage), pick(view.backlog));
        let j = self.active.iter().position(|&r| r == home)?;
        let active = Loads {
            requests: &requests,
            kv_usage: &kv_usage,
            backlog: &backlog,
        };
        let t = self
            .placement
            .rebalance_target(key, j, rule, settings, active, state)?;
        self.active.get(t).copied()
    }

    /// SGLang's cache-aware policy: shortest queue when the pool is imbalanced
    /// (max − min > abs and max > rel × min), else the best prefix match when its
    /// match rate exceeds the threshold, else the rank with the smallest tree.
    fn prefix(&mut self, input: &RouteInput) -> Option<usize> {
        self.gather(input.inflight);
        let (mut min, mut max) = (f64::INFINITY, 0.0f64);
        for &l in &self.view {
            min = min.min(l);
            max = max.max(l);
        }
        let p = self.prefix;
        let chosen = if max - min > p.balance_abs && max > p.balance_rel * min {
            self.least(input.key, input.inflight)?
        } else {
            let tree = self.tree.as_mut()?;
            let m = tree.best(input.store, input.path, &self.mask);
            let rate = m.tokens.min(input.prompt_tokens) as f64 / input.prompt_tokens.max(1) as f64;
            match m.rank {
                Some(r) if rate > p.cache_threshold => r,
                _ => {
                    let sizes: Vec<f64> = (0..self.active.len())
                        .map(|j| tree.size(self.active[j]) as f64)
                        .collect();
                    let min = sizes.iter().copied().fold(f64::INFINITY, f64::min);
                    let tied = (0..sizes.len()).filter(|&j| sizes[j] == min);
                    self.active[self.placement.least_loaded(input.key, tied, &sizes)?]
                }
            }
        };
        if let Some(t) = self.tree.as_mut() {
            t.insert(input.store, input.path, chosen);
        }
        Some(chosen)
    }
}

#[cfg(test)]
mod tests;
