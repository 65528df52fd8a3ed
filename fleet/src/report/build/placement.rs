//! Prefill the configuration could have avoided: what one infinite cache
//! shared by the fleet, and an infinite cache per engine at the placement the
//! run saw, would have served, minus what was cached.

use super::super::model::Reprefill;
use super::super::observe::Observation;
use super::scope::infinite_cache_hits;
use crate::trace::{RequestId, Trace};
use std::collections::HashMap;

/// Avoidable re-prefill of the served `observations`, replayed in send order
/// against one infinite cache for the fleet, and against one per engine (per
/// session for requests whose engine was not reported).
pub(super) fn reprefill(trace: &Trace, observations: &[Observation]) -> Reprefill {
    let mut served: Vec<&Observation> = observations
        .iter()
        .filter(|o| o.served().is_some())
        .collect();
    served.sort_by(|a, b| {
        a.sent_ms
            .total_cmp(&b.sent_ms)
            .then(a.request.cmp(&b.request))
    });
    let engines: Vec<Option<String>> = served
        .iter()
        .map(|o| o.served().and_then(|s| s.engine()))
        .collect();
    let per_rank = engines.iter().any(Option::is_some);
    let mut engine_ids: HashMap<String, u64> = HashMap::new();
    let cache_ids: HashMap<RequestId, u64> = served
        .iter()
        .zip(&engines)
        .map(|(o, e)| {
            let id = RequestId(o.request);
            let c = match e {
                Some(e) => {
                    let n = engine_ids.len() as u64;
                    *engine_ids.entry(e.clone()).or_insert(n)
                }
                // No identity: its session's own cache (ids above any engine's).
                None => (1 << 40) + u64::from(trace.request(id).session.0),
            };
            (id, c)
        })
        .collect();
    let order: Vec<RequestId> = served.iter().map(|o| RequestId(o.request)).collect();
    let at_placement =
        infinite_cache_hits(trace, &order, |r| cache_ids.get(&r).copied().unwrap_or(0));
    let fleet = infinite_cache_hits(trace, &order, |_| 0);
    let mut out = Reprefill {
        basis: "fleet".to_owned(),
        placement_basis: if per_rank { "per_rank" } else { "per_session" }.to_owned(),
        ..Default::default()
    };
    for o in &served {
        if let Some(s) = o.served() {
            let id = RequestId(o.request);
            let f = fleet.get(&id).copied().unwrap_or(0);
            out.reusable_tokens += f;
            out.avoidable_tokens += f.saturating_sub(s.cached_tokens);
            let p = at_placement.get(&id).copied().unwrap_or(0);
            out.reusable_at_placement_tokens += p;
            out.avoidable_at_placement_tokens += p.saturating_sub(s.cached_tokens);
        }
    }
    out
}
