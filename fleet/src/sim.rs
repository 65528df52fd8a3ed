//! Replays a trace through one [`RetentionCache`] per rank and counts avoidable re-prefill.
//!
//! This is the engine's own policy code driven by a trace, not a model of it: each
//! request's prompt is tokenised synthetically ([`synth_tokens`]), hashed with
//! [`BlockHasher`], and passed through `admit` → `finish_prefill` → `release` at its
//! arrival, with a marker built from its session, agent and turn kind. Requests go to
//! ranks by the gateway's own placement code (`tether-placement`), keyed as the gateway
//! keys them: the session, plus the agent for subagents (each subagent its own key).
//! *Avoidable* re-prefill is what an unlimited per-rank cache would have reused but
//! this configuration had to recompute. For hybrid models the unlimited cache keeps a
//! state snapshot at every boundary this configuration would snapshot (prompt ends and
//! checkpoints), since a prefix is only reusable up to such a boundary.

use crate::trace::{RequestId, Trace};
use std::collections::HashSet;
use tether_engine::cache::{
    CacheError, RequestId as CacheRequestId, RetentionCache, Stats, snapshot_boundaries,
};
use tether_engine::config::PolicyConfig;
use tether_engine::hash::{BlockHash, BlockHasher, RequestKeys};
use tether_engine::marker::{HexId, RetentionKey, TurnKind, TurnMarker};
use tether_engine::payload::MetadataOnly;
use tether_placement::keys::{routing_key, session_hash, subagent_hash};
use tether_placement::{Endpoint, Placement};

/// `ranks` equal endpoints as the gateway would be configured with them.
pub fn rank_placement(ranks: usize) -> Placement {
    let endpoints: Vec<Endpoint> = (0..ranks)
        .map(|i| Endpoint {
            address: format!("10.0.{}.{}:8000", i / 250, i % 250 + 1),
            weight: 1.0,
            dp_size: 1,
        })
        .collect();
    Placement::new(&endpoints)
}

/// The routing key of a request as the gateway derives it from explicit ids:
/// the session, plus the agent for a subagent (the main agent has none).
pub fn request_key(trace: &Trace, id: RequestId) -> (u64, RetentionKey) {
    let r = trace.request(id);
    let s = trace.session(r.session);
    let a = trace.agent(r.agent);
    let tenant = s.tenant.as_deref().unwrap_or_default().as_bytes();
    let sub = a.parent.map(|_| a.id.as_bytes());
    let key = routing_key(tenant, s.id.as_bytes(), sub);
    let rk = RetentionKey {
        tenant: HexId(0),
        session: HexId(u128::from(session_hash(tenant, s.id.as_bytes()))),
        subagent: HexId(u128::from(subagent_hash(tenant, sub))),
    };
    (key, rk)
}

/// Rank of a routing key: the gateway's rendezvous pick.
pub fn rank_of(placement: &Placement, key: u64) -> usize {
    placement
        .pick(key, 0)
        .and_then(|p| p.order.first().copied())
        .unwrap_or(0)
}

/// Token ids standing in for a request's prompt: position `p` of the block with
/// id `id` gets a token derived from `(id, p mod block_size)`, so equal id
/// prefixes give equal tokens. Positions past the request's ids get tokens
/// unique to the request (nothing is shared that the trace does not share).
pub fn synth_tokens(trace: &Trace, id: RequestId, ids: &mut Vec<u64>, out: &mut Vec<u32>) {
    out.clear();
    trace.hash_ids_into(id, ids);
    let n = trace.request(id).input_tokens as usize;
    let bs = trace.block_size() as usize;
    let mix = |base: u64, p: u64| {
        // A cheap mix of (base, position); only equality of whole blocks matters downstream.
        let mut z = base ^ p.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^= z >> 31;
        z as u32 ^ (z >> 32) as u32
    };
    for (b, block) in ids.iter().enumerate() {
        let start = b * bs;
        if start >= n {
            break;
        }
        let end = (start + bs).min(n);
        let base = block.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        out.extend((0..(end - start) as u64).map(|p| mix(base, p)));
    }
    let base = (u64::from(id.0) | 1 << 63).wrapping_mul(0xd6e8_feb8_6659_fd93);
    let done = out.len() as u64;
    out.extend((done..n as u64).map(|p| mix(base, p)));
}

/// Totals of one replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimReport {
    /// Prompt tokens of all turns.
    pub prompt_tokens: u64,
    /// Tokens served from cache (device hits + host restores).
    pub reused_tokens: u64,
    /// Tokens an unlimited per-rank cache would have served.
    pub reusable_tokens: u64,
    /// `reusable - reused`, summed per turn.
    pub avoidable_tokens: u64,
    /// Avoidable tokens on returning turns (not a session's first turn).
    pub avoidable_returning_tokens: u64,
    /// Tokens restored from the host tier.
    pub restored_tokens: u64,
    /// Turns the cache could not admit (all slots pinned).
    pub rejected: u64,
    /// Largest host-tier use seen, in bytes.
    pub host_peak_bytes: u64,
    /// Policy counters, summed over ranks.
    pub stats: Stats,
}

/// Runs every request of `trace`, in arrival order, on `ranks` caches configured by `cfg`.
pub fn replay(trace: &Trace, ranks: usize, cfg: &PolicyConfig) -> Result<SimReport, CacheError> {
    let mut caches = (0..ranks)
        .map(|_| RetentionCache::try_new(cfg.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen: Vec<HashSet<BlockHash>> = vec![HashSet::new(); ranks];
    let mut snaps: Vec<HashSet<BlockHash>> = vec![HashSet::new(); ranks];
    let hasher = BlockHasher::try_new(cfg.block_size).ok_or(CacheError::Config(
        tether_engine::config::ConfigError::Zero("block_size"),
    ))?;
    let bs = cfg.block_size as u64;
    let keys = RequestKeys::default();
    let mut tokens = Vec::new();
    let mut ids = Vec::new();
    let placement = rank_placement(ranks);
    let mut rep = SimReport::default();
    let mut mover = MetadataOnly;
    for rid in trace.by_arrival() {
        let req = trace.request(rid);
        let (routing, key) = request_key(trace, rid);
        let r = rank_of(&placement, routing);
        synth_tokens(trace, rid, &mut ids, &mut tokens);
        let hashes = hasher.hash_prompt(&tokens, &keys);
        let matched = hashes.iter().take_while(|h| seen[r].contains(h)).count();
        let usable = if cfg.hybrid() {
            (1..=matched)
                .rev()
                .find(|&j| snaps[r].contains(&hashes[j - 1]))
                .unwrap_or(0)
        } else {
            matched
        };
        let reusable = usable as u64 * bs;
        seen[r].extend(hashes.iter().copied());
        snaps[r].extend(
            snapshot_boundaries(cfg, hashes.len())
                .into_iter()
                .map(|b| hashes[b - 1]),
        );
        let marker = TurnMarker {
            key,
            prompt_end: true,
            kind: req.opened_by,
            turn: None,
            retention_ms: None,
        };
        let now = trace.arrival_ms(rid).unwrap_or(req.at_ms);
        let id = CacheRequestId(u64::from(rid.0));
        let cache = &mut caches[r];
        rep.prompt_tokens += tokens.len() as u64;
        rep.reusable_tokens += reusable;
        let reused = match cache.admit(id, &hashes, Some(key), now, &mut mover) {
            Ok(a) => {
                rep.restored_tokens += a.restored_blocks as u64 * bs;
                cache.finish_prefill(id, Some(&marker), now, &mut mover)?;
                cache.release(id)?;
                a.cached_blocks as u64 * bs
            }
            Err(CacheError::OutOfBlocks { .. }) => {
                rep.rejected += 1;
                0
            }
            Err(e) => return Err(e),
        };
        rep.reused_tokens += reused;
        let avoidable = reusable.saturating_sub(reused);
        rep.avoidable_tokens += avoidable;
        if req.opened_by != TurnKind::First {
            rep.avoidable_returning_tokens += avoidable;
        }
        rep.host_peak_bytes = rep.host_peak_bytes.max(cache.host().used());
    }
    for c in &caches {
        let s = c.stats();
        let a = &mut rep.stats;
        a.retained += s.retained;
        a.superseded += s.superseded;
        a.refreshed += s.refreshed;
        a.expired_dropped += s.expired_dropped;
        a.offloaded += s.offloaded;
        a.dropped += s.dropped;
        a.restored_blocks += s.restored_blocks;
        a.restore_misses += s.restore_misses;
    }
    Ok(rep)
}
