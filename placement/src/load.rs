//! Load-aware choices on top of rendezvous placement: spilling a key down its
//! rendezvous order when its endpoint is over a load bound, the least-loaded
//! endpoint of a pool, and the P/D decision (prefill remotely or not).
//!
//! Pure functions of a *load view* (one number per endpoint, whatever the
//! caller measures: requests in flight, a polled `/load` report). Given the
//! same view, every gateway replica and the fleet simulator make the same
//! choice; ties are broken by the key's rendezvous order, never by iteration
//! order or chance.
//!
//! - [`LoadBound`] / [`first_under_bound`]: consistent hashing with bounded
//!   loads (Mirrokni, Thorup and Zadimoghaddam, SODA 2018; Envoy's
//!   `hash_balance_factor`): an endpoint takes a new key only while its load is
//!   below `⌈c · (total + 1) / n⌉` (scaled by its weight), or below a floor. A
//!   key therefore stays on its primary until that endpoint holds `c` times its
//!   share, then goes to its first fallback that has room — the next rendezvous
//!   choice, so a spilled key still lands where it lands again next time the
//!   primary is full. The floor keeps a lightly loaded fleet from spilling: with
//!   fewer requests in flight than endpoints the paper's bound is 1, so any
//!   endpoint already serving one request would pass its keys on, and a
//!   session's turns would scatter (and lose their cache) while no endpoint is
//!   anywhere near busy.
//! - [`Placement::least_loaded`]: the endpoint with the lowest load, ties broken
//!   by the key's rendezvous score (a P/D prefill pool chosen by load).
//! - [`disaggregate`]: llm-d's prefix-based P/D decider — send the prefill to a
//!   prefill endpoint only when the prompt tokens the decode endpoint is not
//!   expected to hold exceed a threshold (a returning turn of a pinned session
//!   is mostly cached and prefills in place).

use crate::rendezvous::Placement;

pub mod rate;
pub mod report;

/// A bounded-load rule: the allowed excess over a fair share, and a floor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadBound {
    /// `c` > 1: an endpoint may hold `c` times its share of the load.
    pub factor: f64,
    /// Below this load an endpoint always has room (≥ 1).
    pub floor: f64,
}

impl LoadBound {
    /// The capacity of an endpoint of relative weight `share` (its weight over
    /// the sum of weights; `1/n` for equal weights) when the endpoints hold
    /// `total` before the new key is placed: `max(⌈c · (total + 1) · share⌉,
    /// floor, 1)`.
    pub fn capacity(&self, total: f64, share: f64) -> f64 {
        load_bound(total, share, self.factor).max(self.floor)
    }
}

/// The paper's bound alone: `⌈c · (total + 1) · share⌉`, at least 1.
pub fn load_bound(total: f64, share: f64, factor: f64) -> f64 {
    (factor * (total.max(0.0) + 1.0) * share).ceil().max(1.0)
}

/// Position in `order` of the first endpoint whose load is below its
/// capacity, given `loads[i]` and `shares[i]` per endpoint and the `total` load
/// of all endpoints (see [`LoadBound::capacity`]). When every endpoint of
/// `order` is at or over capacity (a short fallback list), the one with the
/// lowest load relative to its share, earliest in `order` on ties. `None` only
/// for an empty `order` or indices outside `loads`/`shares`.
pub fn first_under_bound(
    order: &[usize],
    loads: &[f64],
    shares: &[f64],
    total: f64,
    bound: LoadBound,
) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (pos, &i) in order.iter().enumerate() {
        let (load, share) = (*loads.get(i)?, *shares.get(i)?);
        if load < bound.capacity(total, share) {
            return Some(pos);
        }
        let rel = load / share.max(f64::MIN_POSITIVE);
        if best.is_none_or(|(_, b)| rel < b) {
            best = Some((pos, rel));
        }
    }
    best.map(|(pos, _)| pos)
}

/// Whether to prefill a request on a separate prefill endpoint: only when its
/// prompt tokens not expected in the decode endpoint's cache exceed
/// `threshold` (llm-d `prefix-based-pd-decider`, `nonCachedTokens`).
pub fn disaggregate(prompt_tokens: u64, expected_cached: u64, threshold: u64) -> bool {
    prompt_tokens.saturating_sub(expected_cached) > threshold
}

impl Placement {
    /// Weight shares of the endpoints (weight over the sum of weights), for
    /// [`first_under_bound`].
    pub fn shares(&self) -> Vec<f64> {
        let sum: f64 = self.endpoints().iter().map(|e| e.weight).sum();
        self.endpoints()
            .iter()
            .map(|e| if sum > 0.0 { e.weight / sum } else { 0.0 })
            .collect()
    }

    /// Bounded-load pick: the key's rendezvous order (primary and up to
    /// `fallbacks` more), taking the first endpoint under its load bound
    /// ([`first_under_bound`]); the returned [`crate::Pick`]'s order starts with
    /// the chosen endpoint, followed by the rest in rendezvous order.
    pub fn pick_bounded(
        &self,
        key: u64,
        fallbacks: usize,
        loads: &[f64],
        bound: LoadBound,
    ) -> Option<crate::Pick> {
        let mut pick = self.pick(key, fallbacks)?;
        let total = loads.iter().sum();
        let pos = first_under_bound(&pick.order, loads, &self.shares(), total, bound)?;
        let chosen = pick.order.remove(pos);
        pick.order.insert(0, chosen);
        pick.rank = crate::dp_rank(key, self.endpoints().get(chosen)?.dp_size);
        Some(pick)
    }

    /// Among `candidates` (endpoint indices), the one with the lowest load in
    /// `loads`, ties broken by the highest rendezvous score for `key`. `None`
    /// when no candidate is a known endpoint with a load.
    pub fn least_loaded(
        &self,
        key: u64,
        candidates: impl IntoIterator<Item = usize>,
        loads: &[f64],
    ) -> Option<usize> {
        let mut best: Option<(f64, f64, usize)> = None;
        for i in candidates {
            let (Some(&load), Some(score)) = (loads.get(i), self.score_of(key, i)) else {
                continue;
            };
            let better = match best {
                None => true,
                Some((l, s, j)) => load
                    .total_cmp(&l)
                    .then(s.total_cmp(&score))
                    .then(i.cmp(&j))
                    .is_lt(),
            };
            if better {
                best = Some((load, score, i));
            }
        }
        best.map(|(_, _, i)| i)
    }
}

#[cfg(test)]
mod tests;
