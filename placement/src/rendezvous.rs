//! Weighted rendezvous hashing: a key's endpoint and an ordered fallback list.
//! Deterministic, so every gateway replica (and the fleet simulator) agrees
//! without shared state; removing an endpoint moves only its own keys.

use crate::dp::dp_rank;
use crate::keys::SEED;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// One rank (engine) a key may be placed on.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// `ip:port` as Envoy's `override_host` / `ORIGINAL_DST` expect it.
    pub address: String,
    /// Relative share of keys (> 0).
    pub weight: f64,
    /// Data-parallel ranks behind the address (≥ 1).
    pub dp_size: u32,
    /// A stable name hashed instead of the address (`None`: the address),
    /// so a rank restarted on a new address keeps its keys.
    pub name: Option<String>,
}

impl Endpoint {
    /// What rendezvous hashes: the name, else the address.
    pub fn identity(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.address)
    }
}

/// Endpoint set prepared for picking (identity hashes computed once).
#[derive(Debug, Clone)]
pub struct Placement {
    endpoints: Vec<Endpoint>,
    ids: Vec<u64>,
}

/// The pick for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    /// Endpoint indices, best first: primary then fallbacks.
    pub order: Vec<usize>,
    /// DP rank on the primary, in `[0, dp_size)`.
    pub rank: u32,
}

/// Maps 64 hash bits to a uniform `u` in the open interval (0, 1).
fn unit(h: u64) -> f64 {
    // In the top half of the range `+ 0.5` rounds to an integer, and at the very
    // top up to 2^53 (u = 1, ln u = 0, a score of -inf): clamp to the largest
    // value below 1. Every other hash keeps its value, so placements are unchanged.
    (((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64).min(1.0 - f64::EPSILON / 2.0)
}

impl Placement {
    pub fn new(endpoints: &[Endpoint]) -> Self {
        let ids = endpoints
            .iter()
            .map(|e| xxh3_64_with_seed(e.identity().as_bytes(), SEED))
            .collect();
        Self {
            endpoints: endpoints.to_vec(),
            ids,
        }
    }

    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Score of endpoint `i` for `key`: `-weight / ln(u)`, the weighted rendezvous score
    /// (the highest score wins; an endpoint with twice the weight wins twice as often).
    fn score(&self, key: u64, i: usize) -> f64 {
        let (Some(e), Some(id)) = (self.endpoints.get(i), self.ids.get(i)) else {
            return f64::NEG_INFINITY;
        };
        let pair = (u128::from(key) << 64 | u128::from(*id)).to_le_bytes();
        let u = unit(xxh3_64_with_seed(&pair, SEED));
        -e.weight / u.ln()
    }

    /// The rendezvous score of endpoint `i` for `key` (higher wins); `None`
    /// for an index that is not an endpoint.
    pub(crate) fn score_of(&self, key: u64, i: usize) -> Option<f64> {
        (i < self.endpoints.len()).then(|| self.score(key, i))
    }

    /// Primary plus up to `fallbacks` more endpoints, best first; `None` without endpoints.
    pub fn pick(&self, key: u64, fallbacks: usize) -> Option<Pick> {
        let mut scored: Vec<(f64, usize)> = (0..self.endpoints.len())
            .map(|i| (self.score(key, i), i))
            .collect();
        let best_first =
            |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let want = fallbacks.saturating_add(1).min(scored.len());
        // Only the first `want` need ordering: select them, then sort them (a
        // total order, so the result is the full sort's prefix).
        if want > 0 && want < scored.len() {
            scored.select_nth_unstable_by(want - 1, best_first);
            scored.truncate(want);
        }
        scored.sort_by(best_first);
        let order: Vec<usize> = scored.iter().take(want).map(|(_, i)| *i).collect();
        let primary = self.endpoints.get(*order.first()?)?;
        Some(Pick {
            rank: dp_rank(key, primary.dp_size),
            order,
        })
    }

    /// `ip:port,ip:port…` for `x-gateway-destination-endpoint`.
    pub fn destination(&self, pick: &Pick) -> String {
        let addrs: Vec<&str> = pick
            .order
            .iter()
            .filter_map(|i| self.endpoints.get(*i))
            .map(|e| e.address.as_str())
            .collect();
        addrs.join(",")
    }
}

#[cfg(test)]
mod tests;
