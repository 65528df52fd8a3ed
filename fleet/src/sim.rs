//! Replays derived trace turns through one [`RetentionCache`] per rank and counts avoidable re-prefill.
//!
//! This is the engine's own policy code driven by a trace, not a model of it: each
//! turn's prompt is tokenised synthetically ([`crate::trace::synth_tokens`]), hashed
//! with [`BlockHasher`], and passed through `admit` → `finish_prefill` → `release` at
//! its timestamp, with a marker built from the derived session, subagent and kind.
//! Sessions go to ranks by the gateway's own placement code (`tether-placement`).
//! *Avoidable* re-prefill is what an unlimited per-rank cache would have reused but
//! this configuration had to recompute. For hybrid models the unlimited cache keeps a
//! state snapshot at every boundary this configuration would snapshot (prompt ends and
//! checkpoints), since a prefix is only reusable up to such a boundary.

use crate::trace::{Turn, synth_tokens};
use std::collections::HashSet;
use tether_engine::cache::{CacheError, RequestId, RetentionCache, Stats, snapshot_boundaries};
use tether_engine::config::PolicyConfig;
use tether_engine::hash::{BlockHash, BlockHasher, RequestKeys};
use tether_engine::marker::{HexId, RetentionKey, TurnKind, TurnMarker};
use tether_engine::payload::MetadataOnly;
use tether_placement::keys::routing_key;
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

/// Rank of a session: the gateway's rendezvous pick of the session's routing key
/// (this replay keys on the session, so a session's subagents share its rank).
pub fn rank_of(placement: &Placement, session: u64) -> usize {
    let key = routing_key(b"", &session.to_le_bytes(), None);
    placement
        .pick(key, 0)
        .and_then(|p| p.order.first().copied())
        .unwrap_or(0)
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

/// Runs `turns` (sorted by time) on `ranks` caches configured by `cfg`.
pub fn replay(turns: &[Turn], ranks: usize, cfg: &PolicyConfig) -> Result<SimReport, CacheError> {
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
    let placement = rank_placement(ranks);
    let mut rep = SimReport::default();
    let mut mover = MetadataOnly;
    for t in turns {
        let r = rank_of(&placement, t.session);
        synth_tokens(&t.record, &mut tokens);
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
        let key = RetentionKey {
            tenant: HexId(0),
            session: HexId(u128::from(t.session)),
            subagent: HexId(u128::from(t.subagent)),
        };
        let marker = TurnMarker {
            key,
            prompt_end: true,
            kind: t.kind,
            turn: None,
            retention_ms: None,
        };
        let now = t.record.timestamp;
        let id = RequestId(t.index as u64);
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
        if t.kind != TurnKind::First {
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
