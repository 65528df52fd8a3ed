//! Retention over a block pool the engine owns (vLLM): which block ids to hold and for
//! how long, which blocks to copy to the host tier, which host payloads to free.
//!
//! [`crate::RetentionCache`] owns its device pool. An engine that keeps its own (vLLM's
//! `BlockPool`, with its prefix cache and LRU) needs the same decisions as instructions
//! instead: [`Ledger::retain`] at a prompt end says which block ids to take a reference
//! on and which superseded ones to let go, and which blocks to write through to the host
//! tier; [`Ledger::yield_blocks`] under device pressure says which retentions to let go
//! (expired first, then least recently used — the same order and the same [`HostTier`]
//! as the cache); [`Ledger::take_freed`] says which host payloads the byte holders may
//! free. The ledger never moves a byte: host payloads here are empty, their logical
//! sizes do the accounting, and the engine's workers hold the checksummed bytes.
//!
//! Because every retained turn is written through to the host tier when it is retained,
//! letting a device retention go under pressure costs no copy: the turn is already on
//! the host ("goes to host, never to nothing"), unless the host tier refused it (every
//! record there more recently used), which [`LedgerStats::dropped`] counts.

use crate::config::{ConfigError, Millis, PolicyConfig};
use crate::hash::BlockHash;
use crate::host::{HostKind, HostTier};
use crate::marker::{RetentionKey, TurnMarker};
use crate::payload::Payload;
use crate::record::{HostRecord, RecordMeta};
use crate::victims::{Class, VictimIndex};
use std::collections::HashMap;

/// Engine block id (vLLM's `int32` block ids).
pub type BlockId = u32;

/// What the engine does after [`Ledger::retain`], in this order: take a reference on
/// every id of `hold`, then drop one on every id of `release`, and copy the blocks at
/// `store` (indices into the retained list) to the host tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetainPlan {
    /// Block ids to reference for the retention (the whole retained chain).
    pub hold: Vec<BlockId>,
    /// Block ids of the superseded retention to release.
    pub release: Vec<BlockId>,
    /// Indices of the retained blocks the host tier lacks: copy these to host.
    pub store: Vec<usize>,
    /// True when the host tier took the record (the turn survives device pressure).
    pub on_host: bool,
}

/// Counters for metrics and the benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerStats {
    /// Retentions created.
    pub retained: u64,
    /// Retentions replaced by the same key's next prompt end.
    pub superseded: u64,
    /// Retentions refreshed by a returning turn.
    pub refreshed: u64,
    /// Device retentions released because their interval ran out.
    pub expired: u64,
    /// Device retentions released under pressure whose turn is on the host tier.
    pub yielded_to_host: u64,
    /// Device retentions released under pressure with no host copy.
    pub dropped: u64,
    /// Blocks the host tier was asked to store.
    pub host_blocks_stored: u64,
    /// Host records evicted to make room.
    pub host_evicted: u64,
}

#[derive(Debug)]
struct Held {
    meta: RecordMeta,
    blocks: Vec<BlockId>,
    on_host: bool,
    interval_ms: Millis,
}

/// Retention decisions for an engine-owned block pool (see the module docs).
#[derive(Debug)]
pub struct Ledger {
    cfg: PolicyConfig,
    held: HashMap<RetentionKey, Held>,
    victims: VictimIndex,
    host: HostTier,
    held_blocks: usize,
    stats: LedgerStats,
}

impl Ledger {
    /// A ledger for `cfg` (`block_size`, `block_bytes`, `host_bytes`, intervals and
    /// `retention` are read; `device_blocks` is the engine's pool size, for reference).
    pub fn try_new(cfg: PolicyConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let mut host = HostTier::new(cfg.host_bytes);
        host.record_freed();
        Ok(Self {
            cfg,
            held: HashMap::new(),
            victims: VictimIndex::default(),
            host,
            held_blocks: 0,
            stats: LedgerStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PolicyConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> LedgerStats {
        LedgerStats {
            host_evicted: self.host.evicted_records(),
            ..self.stats
        }
    }

    /// Block references held by device retentions (a block shared by two retentions counts twice).
    pub fn held_blocks(&self) -> usize {
        self.held_blocks
    }

    /// Device retentions held.
    pub fn device_records(&self) -> usize {
        self.held.len()
    }

    /// The host tier (accounting only).
    pub fn host(&self) -> &HostTier {
        &self.host
    }

    /// Block ids `key` holds on the device.
    pub fn held_by(&self, key: &RetentionKey) -> Option<&[BlockId]> {
        self.held.get(key).map(|h| h.blocks.as_slice())
    }

    /// Every retained turn state, in no order: its key, its record's tokens and whether
    /// the device holds it (a device retention usually has a host copy too; `false`:
    /// host tier only). What a residency summary lists.
    pub fn resident(&self) -> impl Iterator<Item = (RetentionKey, u64, bool)> + '_ {
        let device = self
            .held
            .values()
            .map(|h| (h.meta.key, h.meta.tokens, true));
        let host = self
            .host
            .records()
            .filter(|r| !self.held.contains_key(&r.meta.key))
            .map(|r| (r.meta.key, r.meta.tokens, false));
        device.chain(host)
    }

    /// Leading blocks of `chain` the host tier holds.
    pub fn host_prefix(&self, chain: &[BlockHash]) -> usize {
        if self.host.capacity() == 0 {
            return 0;
        }
        self.host.prefix_len(chain)
    }

    /// A turn of `key` arrived: its retention (on either tier) is refreshed by the interval.
    pub fn touch(&mut self, key: &RetentionKey, now: Millis) {
        if let Some(mut h) = self.take(key) {
            h.meta.refresh(now, h.interval_ms);
            self.put(h);
            self.stats.refreshed += 1;
        } else if self.host.refresh(key, now) {
            self.stats.refreshed += 1;
        }
    }

    /// A prompt end of `marker.key` whose full blocks are `hashes` in block ids `blocks`
    /// (same length, root first): supersedes the key's retention on both tiers.
    /// Returns an empty plan when the marker is not a prompt end, retention is off or
    /// the lists are empty or of different lengths.
    pub fn retain(
        &mut self,
        marker: &TurnMarker,
        hashes: &[BlockHash],
        blocks: &[BlockId],
        now: Millis,
    ) -> RetainPlan {
        let mut plan = RetainPlan::default();
        if !marker.prompt_end || !self.cfg.retention || hashes.is_empty() {
            return plan;
        }
        if hashes.len() != blocks.len() {
            return plan;
        }
        let key = marker.key;
        let interval = self.cfg.interval(marker.kind, marker.retention_ms);
        let meta = RecordMeta {
            key,
            kind: marker.kind,
            tokens: (hashes.len() * self.cfg.block_size) as u64,
            created_ms: now,
            last_use_ms: now,
            expires_ms: now.saturating_add(interval),
            bytes: hashes.len() as u64 * self.cfg.block_bytes,
            past_end: Vec::new(),
        };
        if let Some(old) = self.take(&key) {
            plan.release = old.blocks;
            self.stats.superseded += 1;
        }
        // Write through to the host tier: pin what it already holds (prefix sharing) before
        // the superseded record lets go of it, make room for the rest (expired, then less
        // recently used records), record.
        let missing = self.host.pin_present(HostKind::Block, hashes);
        if self.host.remove_record(&key).is_some() {
            self.stats.superseded += 1;
        }
        if self.host.capacity() > 0 {
            let need = missing.len() as u64 * self.cfg.block_bytes;
            if self.host.make_room(need, meta.priority(), Some(key), now) {
                for h in &missing {
                    self.host.put(
                        HostKind::Block,
                        *h,
                        Payload::seal(Vec::new()),
                        self.cfg.block_bytes,
                    );
                }
                plan.store = hashes
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| missing.contains(h))
                    .map(|(i, _)| i)
                    .collect();
                self.host.insert_record(HostRecord {
                    meta: meta.clone(),
                    hashes: hashes.to_vec(),
                    states: Vec::new(),
                    interval_ms: interval,
                });
                self.stats.host_blocks_stored += plan.store.len() as u64;
                plan.on_host = true;
            } else {
                let present: Vec<BlockHash> = hashes
                    .iter()
                    .filter(|h| !missing.contains(h))
                    .copied()
                    .collect();
                self.host.unpin(HostKind::Block, &present);
            }
        }
        plan.hold = blocks.to_vec();
        self.put(Held {
            meta,
            blocks: blocks.to_vec(),
            on_host: plan.on_host,
            interval_ms: interval,
        });
        self.stats.retained += 1;
        plan
    }

    /// Releases every device retention whose interval has run out; returns the block
    /// ids to release (one reference each). Their host copies stay.
    pub fn release_expired(&mut self, now: Millis) -> Vec<BlockId> {
        let mut out = Vec::new();
        while let Some((Class::Expired, key)) = self.victims.pick(now, Some(0), |_| true) {
            let Some(h) = self.take(&key) else { break };
            self.stats.expired += 1;
            out.extend(h.blocks);
        }
        out
    }

    /// Device pressure: releases retentions — expired first, then least recently used —
    /// until at least `need` block references are released, never those of `spare` (the
    /// request being admitted). Returns the block ids to release.
    pub fn yield_blocks(
        &mut self,
        need: usize,
        now: Millis,
        spare: Option<RetentionKey>,
    ) -> Vec<BlockId> {
        let mut out = Vec::new();
        while out.len() < need {
            let Some((class, key)) = self.victims.pick(now, None, |k| Some(*k) != spare) else {
                break;
            };
            let Some(h) = self.take(&key) else { break };
            match (class, h.on_host && self.host.record(&key).is_some()) {
                (Class::Expired, _) => self.stats.expired += 1,
                (Class::Live, true) => self.stats.yielded_to_host += 1,
                (Class::Live, false) => self.stats.dropped += 1,
            }
            out.extend(h.blocks);
        }
        out
    }

    /// A byte holder found a host payload corrupt (checksum mismatch): it and every
    /// host record needing it are dropped, so it is never offered again.
    pub fn host_payload_lost(&mut self, hash: BlockHash) {
        self.host.drop_payload(HostKind::Block, hash);
    }

    /// Host payloads freed since the last call: the byte holders free them.
    pub fn take_freed(&mut self) -> Vec<BlockHash> {
        self.host
            .take_freed()
            .into_iter()
            .filter(|(k, _)| *k == HostKind::Block)
            .map(|(_, h)| h)
            .collect()
    }

    fn put(&mut self, h: Held) {
        self.victims.insert(&h.meta);
        self.held_blocks += h.blocks.len();
        self.held.insert(h.meta.key, h);
    }

    fn take(&mut self, key: &RetentionKey) -> Option<Held> {
        let h = self.held.remove(key)?;
        self.victims.remove(key);
        self.held_blocks -= h.blocks.len();
        Some(h)
    }

    /// Checks the accounting: held-block count, victim index, host tier.
    pub fn check(&self) -> Result<(), String> {
        let n: usize = self.held.values().map(|h| h.blocks.len()).sum();
        if n != self.held_blocks {
            return Err(format!("held blocks {} != records {n}", self.held_blocks));
        }
        if !self.victims.matches(self.held.values().map(|h| &h.meta)) {
            return Err("victim index disagrees with device records".into());
        }
        self.host.check()
    }
}

#[cfg(test)]
mod tests;
