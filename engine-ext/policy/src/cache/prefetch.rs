//! Prefetch: a retention on the host tier brought back to the device before its key returns.
//!
//! The caller (the engine, which knows when a turn ended and how long its kind's
//! gaps run, `crate::gaps`) decides *when*, and which retentions it expects back
//! later than this one; this module decides *whether there is room* and moves the
//! state. Room, in this order:
//! 1. slots that hold nothing retained or running: empty slots, unpinned cached
//!    blocks, unpinned snapshots;
//! 2. expired retentions, dropped (the policy drops them first anyway);
//! 3. live retentions the caller says are expected back later (`may_displace`),
//!    least recently used first — each *offloaded* to the host tier, and only when
//!    the host tier has free room for it without evicting anything, so a prefetch
//!    never costs a recompute.
//!
//! Never a running request's blocks, never a retention the caller expects back
//! sooner. If those three cannot give the room, nothing moves. Once back, the
//! record is an ordinary device retention that keeps its last use and expiry: a
//! prefetch is a guess, so under demand it is the first live retention to yield
//! (offloaded again, at no copy: the host copy is kept, as a demand restore keeps
//! it), and unused it expires and goes in the policy's order. Ranking it as used
//! at the prefetch instead measured more recompute under load: the retentions it
//! then outranked were pushed to the host tier, which evicted for them.

use super::{RestoreMiss, RetentionCache, Room};
use crate::config::Millis;
use crate::hash::BlockHash;
use crate::host::HostKind;
use crate::marker::RetentionKey;
use crate::payload::{Mover, SlotId};
use crate::record::DeviceRecord;
use crate::victims::Class;

/// What a prefetch moved (its bytes cross the host link: the engine times them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetched {
    /// Blocks restored (the device already held the rest of the chain).
    pub blocks: usize,
    /// True when the prompt end's state snapshot was restored too (hybrid models).
    pub state: bool,
}

/// Why nothing was prefetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefetchSkip {
    /// The key has no retention on the host tier.
    NotOnHost,
    /// The key's retention is on the device already.
    OnDevice,
    /// The retention's interval is over: it would be dropped first anyway.
    Expired,
    /// The host tier cannot serve the whole record (a hybrid record without its
    /// prompt-end snapshot, or a payload gone).
    Unusable,
    /// Too few slots: taking more would evict running work or retentions
    /// expected back sooner.
    NoRoom {
        /// Slots the record needs.
        need: usize,
        /// Slots free of retained and running state, plus those the retentions
        /// it may displace would free.
        free: usize,
    },
    /// A payload failed its checksum or the copy failed; nothing was restored.
    Miss(RestoreMiss),
}

impl RetentionCache {
    /// Brings `key`'s host retention back to the device if free room allows. See
    /// the module docs for the rule; on any skip the device is as it was (a
    /// checksum failure drops the corrupt payload from the host, as a restore does).
    pub fn prefetch(
        &mut self,
        key: &RetentionKey,
        now: Millis,
        mover: &mut dyn Mover,
        may_displace: &mut dyn FnMut(&RetentionKey) -> bool,
    ) -> Result<Prefetched, PrefetchSkip> {
        if self.records.contains_key(key) {
            return Err(PrefetchSkip::OnDevice);
        }
        let rec = self.host.record(key).ok_or(PrefetchSkip::NotOnHost)?;
        if rec.meta.expires_ms <= now {
            return Err(PrefetchSkip::Expired);
        }
        let hashes = rec.hashes.clone();
        let state = if self.cfg.hybrid() {
            // The prompt end's snapshot (first) is the one the return resumes from.
            Some(*rec.states.first().ok_or(PrefetchSkip::Unusable)?)
        } else {
            None
        };
        let (mut meta, interval_ms) = (rec.meta.clone(), rec.interval_ms);
        let n = hashes.len();
        let m = self.pool.prefix_len(&hashes);
        if self.host.prefix_len(&hashes[m..]) < n - m {
            return Err(PrefetchSkip::Unusable);
        }
        let need_state = state.filter(|b| self.states.get(*b).is_none());
        // Hold the device prefix so making room cannot take it.
        let mut chain: Vec<SlotId> = Vec::with_capacity(n);
        for h in &hashes[..m] {
            let Some(s) = self.pool.get(*h) else { break };
            self.pool.acquire(s);
            chain.push(s);
        }
        let need = (n - m) + need_state.map_or(0, |_| self.cfg.state_blocks());
        let mut free = self.pool.empty_slots() + self.pool.evictable();
        if chain.len() == m && need > free {
            let (yielding, frees) = self.displaceable(key, need - free, now, may_displace);
            free += frees;
            if need <= free && !self.displace(&yielding, now, mover) {
                free = 0;
            }
        }
        if chain.len() < m || need > free {
            self.release_slots(&chain);
            return Err(PrefetchSkip::NoRoom { need, free });
        }
        let bytes = match self.fetch_range(&hashes[m..], need_state) {
            Ok(b) => b,
            Err(miss) => {
                self.release_slots(&chain);
                self.stats.restore_misses += 1;
                return Err(PrefetchSkip::Miss(miss));
            }
        };
        let mut fresh = Vec::with_capacity(n - m);
        while fresh.len() < n - m {
            match self.alloc_in(Room::Free, now, mover) {
                Some(s) => fresh.push(s),
                None => {
                    self.release_slots(&fresh);
                    self.release_slots(&chain);
                    return Err(PrefetchSkip::NoRoom { need, free });
                }
            }
        }
        let mut snapshot = None;
        if let Some(b) = state {
            let slot = match need_state {
                Some(_) => self.alloc_state_in(Room::Free, b, now, mover),
                None => self.states.pin(b),
            };
            let Some(slot) = slot else {
                self.release_slots(&fresh);
                self.release_slots(&chain);
                return Err(PrefetchSkip::NoRoom { need, free });
            };
            snapshot = Some((b, slot));
        }
        let copied =
            mover
                .scatter_blocks(&fresh, &bytes.0)
                .and_then(|()| match (&bytes.1, snapshot) {
                    (Some(sb), Some((_, slot))) => mover.scatter_states(&[slot], sb),
                    _ => Ok(()),
                });
        if let Err(e) = copied {
            if let Some((b, _)) = snapshot {
                if need_state.is_some() {
                    let backing = self.states.discard(b);
                    self.release_backing(backing);
                } else {
                    self.states.unpin_at(b, self.pool.lru_clock());
                }
            }
            self.release_slots(&fresh);
            self.release_slots(&chain);
            self.stats.restore_misses += 1;
            return Err(PrefetchSkip::Miss(RestoreMiss::Copy(e.0)));
        }
        // Publish the restored blocks under the device prefix, then pin the whole
        // chain for the record and drop the allocation's own references.
        for (h, s) in hashes[m..].iter().zip(&fresh) {
            let parent = chain.last().copied();
            if !self.pool.insert(*s, *h, parent) {
                // Unreachable: the chain's continuation was not cached (prefix tree).
                self.release_slots(&fresh);
                self.release_slots(&chain);
                return Err(PrefetchSkip::Unusable);
            }
            chain.push(*s);
        }
        for s in &chain {
            self.pool.retain(*s);
        }
        self.release_slots(&chain);
        meta.bytes =
            n as u64 * self.cfg.block_bytes + u64::from(snapshot.is_some()) * self.cfg.state_bytes;
        self.insert_record(DeviceRecord {
            meta,
            chain,
            hashes,
            states: snapshot.into_iter().collect(),
            interval_ms,
            lru_tick: self.pool.lru_clock(),
            prefetched: true,
        });
        self.stats.prefetched += 1;
        self.stats.prefetched_blocks += (n - m) as u64;
        Ok(Prefetched {
            blocks: n - m,
            state: need_state.is_some(),
        })
    }

    /// Retentions that may yield to `target`'s prefetch, in eviction order, until
    /// they would free `short` slots: expired ones, then live ones `may_displace`
    /// accepts whose blocks the host tier has free room for. Counts only slots
    /// nothing else pins (shared prefixes stay), so it never overstates the room.
    fn displaceable(
        &self,
        target: &RetentionKey,
        short: usize,
        now: Millis,
        may_displace: &mut dyn FnMut(&RetentionKey) -> bool,
    ) -> (Vec<RetentionKey>, usize) {
        let mut host_free = self.host.capacity() - self.host.used();
        let (mut out, mut frees) = (Vec::new(), 0);
        let expired = self.victims.expired(now);
        let live = self.victims.by_recency().filter(|k| !expired.contains(k));
        for k in expired.iter().copied().chain(live) {
            if frees >= short {
                break;
            }
            let Some(r) = self.records.get(&k).filter(|_| k != *target) else {
                continue;
            };
            if r.meta.expires_ms > now {
                if r.meta.bytes > host_free || !may_displace(&k) {
                    continue;
                }
                host_free -= r.meta.bytes;
            }
            frees += r
                .chain
                .iter()
                .filter(|s| self.pool.retains(**s) == 1 && self.pool.refs(**s) == 0)
                .count();
            out.push(k);
        }
        (out, frees)
    }

    /// Gives up the retentions `displaceable` chose: expired ones dropped, live
    /// ones offloaded. Stops (false) at a live one the host tier refuses, which
    /// stays on the device.
    pub(super) fn displace(
        &mut self,
        keys: &[RetentionKey],
        now: Millis,
        mover: &mut dyn Mover,
    ) -> bool {
        for k in keys {
            match self.victims.class_of(k, now) {
                Class::Expired => {
                    self.evict_key(Class::Expired, *k, now, mover);
                }
                Class::Live => {
                    let Some(rec) = self.take_record(k) else {
                        continue;
                    };
                    if self.offload(&rec, now, mover).is_err() {
                        self.insert_record(rec);
                        return false;
                    }
                    self.stats.offloaded += 1;
                    self.drop_device_record_cold(rec);
                }
            }
        }
        true
    }

    /// Verified copies of the host payloads of `blocks` and of the snapshot at `state`.
    #[allow(
        clippy::type_complexity,
        reason = "private helper returning the two payload kinds"
    )]
    pub(super) fn fetch_range(
        &mut self,
        blocks: &[BlockHash],
        state: Option<BlockHash>,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), RestoreMiss> {
        let mut out = Vec::new();
        for h in blocks {
            out.extend_from_slice(&self.fetch_one(HostKind::Block, *h)?);
        }
        let s = state
            .map(|b| self.fetch_one(HostKind::State, b))
            .transpose()?;
        Ok((out, s))
    }

    /// One verified host payload: a checksum mismatch or a missing payload is a miss.
    fn fetch_one(&mut self, kind: HostKind, h: BlockHash) -> Result<Vec<u8>, RestoreMiss> {
        match self.host.fetch(kind, h) {
            Some(Ok(b)) => Ok(b),
            Some(Err(_)) => Err(RestoreMiss::Checksum),
            None => Err(RestoreMiss::Copy("host payload vanished".into())),
        }
    }

    /// Drops one request-style reference from each slot, tail first.
    fn release_slots(&mut self, slots: &[SlotId]) {
        for s in slots.iter().rev() {
            self.pool.release(*s);
        }
    }
}
