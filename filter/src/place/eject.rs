//! Passive outlier detection for pick mode: what the response path saw
//! (status, which endpoint answered, how many attempts) ejects an endpoint
//! that failed several times in a row, so its keys go to their next fallback
//! — the same one for every turn of a key, so the cache builds there — and
//! come home once it answers again.
//!
//! Envoy's own `outlier_detection` cannot do this in pick mode: its
//! `override_host` policy sends a request to the listed address whatever its
//! health (docs/envoy-mechanisms.md). Pure: the shell feeds it the outcome of
//! each response and the clock; each VM (worker) keeps its own table.

use crate::config::eject::EjectConfig;
use tether_placement::{Pick, Placement, dp_rank};

/// One endpoint's record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Record {
    /// Failures since its last success.
    failures: u32,
    /// Ejected until this time (ms; 0: never ejected).
    until_ms: u64,
}

/// What one response says about the endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The endpoint that answered was not the one listed first.
    pub served_by_fallback: bool,
    /// This response ejected the listed-first endpoint.
    pub ejected: bool,
}

/// The ejection table of one VM.
#[derive(Debug, Clone, Default)]
pub struct Health {
    records: Vec<Record>,
}

impl Health {
    /// A table for `n` endpoints, all in.
    pub fn new(n: usize) -> Self {
        Self {
            records: vec![Record::default(); n],
        }
    }

    /// Whether any endpoint was ever ejected (until then nothing needs the clock).
    pub fn ever_ejected(&self) -> bool {
        self.records.iter().any(|r| r.until_ms != 0)
    }

    /// Whether endpoint `i` is out at `now_ms`.
    pub fn ejected(&self, i: usize, now_ms: u64) -> bool {
        self.records.get(i).is_some_and(|r| now_ms < r.until_ms)
    }

    /// Moves ejected endpoints behind the others (keeping the key's order
    /// among each), so the key's first healthy fallback serves it; the DP
    /// rank follows the new primary. Returns whether the primary changed.
    /// Every endpoint ejected: the order stays (someone must answer).
    pub fn reorder(&self, placement: &Placement, key: u64, pick: &mut Pick, now_ms: u64) -> bool {
        let Some(&first) = pick.order.first() else {
            return false;
        };
        if !self.ejected(first, now_ms) {
            return false;
        }
        let (mut order, out): (Vec<usize>, Vec<usize>) =
            pick.order.iter().partition(|&&i| !self.ejected(i, now_ms));
        // The listed fallbacks may all be out: take the key's next choices.
        if order.is_empty() {
            let n = placement.endpoints().len();
            if let Some(all) = placement.pick(key, n.saturating_sub(1)) {
                order = all
                    .order
                    .into_iter()
                    .filter(|i| !self.ejected(*i, now_ms))
                    .take(pick.order.len())
                    .collect();
            }
        }
        let Some(&primary) = order.first() else {
            return false;
        };
        order.extend(out);
        order.truncate(pick.order.len().max(1));
        pick.order = order;
        pick.rank = placement
            .endpoints()
            .get(primary)
            .map_or(0, |e| dp_rank(key, e.dp_size));
        true
    }

    /// Records one response. `first` is the endpoint listed first for the
    /// request, `served` the one that answered (`None`: no upstream answered,
    /// e.g. every connection failed), `attempts` Envoy's
    /// `x-envoy-attempt-count`, `status` the response status.
    pub fn record(
        &mut self,
        cfg: &EjectConfig,
        first: usize,
        served: Option<usize>,
        attempts: u32,
        status: u32,
        now_ms: u64,
    ) -> Outcome {
        let failed = status >= 500;
        let served_by_fallback = served.is_some_and(|s| s != first);
        // The first endpoint failed if it answered with a failure, if
        // another one answered after a retry, or if nobody answered.
        let first_failed = match served {
            Some(s) if s == first => failed,
            Some(_) => attempts > 1,
            None => failed,
        };
        if let Some(s) = served.filter(|s| *s != first) {
            self.note(cfg, s, failed, now_ms);
        }
        let ejected = if served == Some(first) || first_failed {
            self.note(cfg, first, first_failed, now_ms)
        } else {
            false
        };
        Outcome {
            served_by_fallback,
            ejected,
        }
    }

    /// One success or failure of endpoint `i`; true when it ejects it.
    fn note(&mut self, cfg: &EjectConfig, i: usize, failed: bool, now_ms: u64) -> bool {
        let Some(r) = self.records.get_mut(i) else {
            return false;
        };
        if !failed {
            r.failures = 0;
            return false;
        }
        r.failures = r.failures.saturating_add(1);
        // An ejection leaves `failures` at the threshold: back from it, one
        // more failure sends the endpoint out again; a success clears it.
        if r.failures >= cfg.failures && now_ms >= r.until_ms {
            r.until_ms = now_ms.saturating_add(cfg.ms);
            r.failures = cfg.failures;
            return true;
        }
        false
    }

    /// Index of the endpoint with this `ip:port`.
    pub fn index_of(placement: &Placement, address: &[u8]) -> Option<usize> {
        placement
            .endpoints()
            .iter()
            .position(|e| e.address.as_bytes() == address)
    }
}

#[cfg(test)]
mod tests;
