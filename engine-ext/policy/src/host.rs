//! Host tier: checksummed block and state payloads in host memory, with session-aware eviction.
//!
//! Payloads are stored once per block hash (sessions sharing a prefix share its host
//! copy) and reference-counted by the host records that need them. Room is made by
//! evicting expired records first, then live records strictly less valuable than the
//! one coming in; if that is not enough the incoming record is refused (dropped),
//! so used bytes never exceed capacity.

use crate::config::Millis;
use crate::hash::BlockHash;
use crate::marker::RetentionKey;
use crate::payload::{ChecksumMismatch, Payload};
use crate::pool::HashIndex;
use crate::record::HostRecord;
use crate::victims::VictimIndex;
use std::collections::HashMap;

mod usage;
use usage::Use;
pub use usage::{Fate, HostUsage, Tally};

#[derive(Debug)]
struct Entry {
    payload: Payload,
    refs: u32,
    bytes: u64,
}

/// Which store of the host tier a payload lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostKind {
    /// A KV block, by its hash.
    Block,
    /// A linear-state snapshot, by its boundary block hash.
    State,
}

/// The host tier of one rank.
#[derive(Debug)]
pub struct HostTier {
    capacity: u64,
    used: u64,
    blocks: HashIndex<Entry>,
    states: HashIndex<Entry>,
    records: HashMap<RetentionKey, HostRecord>,
    victims: VictimIndex,
    evicted_records: u64,
    /// Payloads freed since the last [`HostTier::take_freed`], when recording.
    freed: Option<Vec<(HostKind, BlockHash)>>,
    /// Where the written bytes went, by how records ended.
    usage: HostUsage,
    /// Per held record: bytes its offload wrote, and what became of them so far.
    record_use: HashMap<RetentionKey, (u64, Use)>,
    /// Bytes and snapshots [`HostTier::put`] stored new since the last record went in.
    pending: (u64, u64),
}

impl HostTier {
    /// A tier of `capacity` bytes (0 = disabled).
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: 0,
            blocks: HashIndex::default(),
            states: HashIndex::default(),
            records: HashMap::new(),
            victims: VictimIndex::default(),
            evicted_records: 0,
            freed: None,
            usage: HostUsage::default(),
            record_use: HashMap::new(),
            pending: (0, 0),
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in use (logical sizes).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Starts recording which payloads are freed, for an integration whose bytes live
    /// elsewhere (the vLLM connector's workers hold them; this tier only accounts).
    pub fn record_freed(&mut self) {
        self.freed.get_or_insert_with(Vec::new);
    }

    /// The payloads freed since the last call (empty unless recording).
    pub fn take_freed(&mut self) -> Vec<(HostKind, BlockHash)> {
        self.freed.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Records evicted to make room so far.
    pub fn evicted_records(&self) -> u64 {
        self.evicted_records
    }

    /// The record of `key`.
    pub fn record(&self, key: &RetentionKey) -> Option<&HostRecord> {
        self.records.get(key)
    }

    /// Every record held, in no order.
    pub fn records(&self) -> impl Iterator<Item = &HostRecord> {
        self.records.values()
    }

    /// A hit on `key`: refreshes its record's interval; false when there is none.
    pub(crate) fn refresh(&mut self, key: &RetentionKey, now: Millis) -> bool {
        let Some(r) = self.records.get_mut(key) else {
            return false;
        };
        r.meta.refresh(now, r.interval_ms);
        self.victims.insert(&r.meta);
        if let Some(u) = self.record_use.get_mut(key)
            && u.1 == Use::NeverReturned
        {
            u.1 = Use::ReturnedUnused;
        }
        true
    }

    /// True when the payload is held.
    pub fn contains(&self, kind: HostKind, hash: BlockHash) -> bool {
        self.store(kind).contains_key(&hash)
    }

    /// How many hashes of `chain` are held, counting from the start.
    pub fn prefix_len(&self, chain: &[BlockHash]) -> usize {
        chain
            .iter()
            .take_while(|h| self.blocks.contains_key(h))
            .count()
    }

    fn store(&self, kind: HostKind) -> &HashIndex<Entry> {
        match kind {
            HostKind::Block => &self.blocks,
            HostKind::State => &self.states,
        }
    }

    fn store_mut(&mut self, kind: HostKind) -> &mut HashIndex<Entry> {
        match kind {
            HostKind::Block => &mut self.blocks,
            HostKind::State => &mut self.states,
        }
    }

    /// Adds a reference to each held payload of `hashes`; returns the hashes not held.
    pub(crate) fn pin_present(&mut self, kind: HostKind, hashes: &[BlockHash]) -> Vec<BlockHash> {
        let store = self.store_mut(kind);
        let mut missing = Vec::new();
        for h in hashes {
            match store.get_mut(h) {
                Some(e) => e.refs += 1,
                None => missing.push(*h),
            }
        }
        missing
    }

    /// Drops one reference to each payload of `hashes` that is held; frees those at zero.
    pub(crate) fn unpin(&mut self, kind: HostKind, hashes: &[BlockHash]) {
        let mut freed = 0;
        let store = match kind {
            HostKind::Block => &mut self.blocks,
            HostKind::State => &mut self.states,
        };
        for h in hashes {
            if let Some(e) = store.get_mut(h) {
                e.refs -= 1;
                if e.refs == 0 {
                    freed += e.bytes;
                    store.remove(h);
                    if let Some(log) = self.freed.as_mut() {
                        log.push((kind, *h));
                    }
                }
            }
        }
        self.used -= freed;
    }

    /// Stores a new payload with one reference. The caller has made room.
    pub(crate) fn put(&mut self, kind: HostKind, hash: BlockHash, payload: Payload, bytes: u64) {
        debug_assert!(self.used + bytes <= self.capacity);
        let store = self.store_mut(kind);
        if let Some(e) = store.get_mut(&hash) {
            e.refs += 1;
            return;
        }
        store.insert(
            hash,
            Entry {
                payload,
                refs: 1,
                bytes,
            },
        );
        self.used += bytes;
        self.pending.0 += bytes;
        self.pending.1 += u64::from(kind == HostKind::State);
    }

    /// Frees at least `need` bytes: expired records first (earliest expiry), then live
    /// records used less recently than the incoming one (least recently used first).
    /// Records of `spare` are never chosen. Returns false, having evicted what it chose,
    /// when it cannot make enough room.
    pub(crate) fn make_room(
        &mut self,
        need: u64,
        incoming_priority: Millis,
        spare: Option<RetentionKey>,
        now: Millis,
    ) -> bool {
        if need > self.capacity {
            return false;
        }
        while self.capacity - self.used < need {
            let Some((_, key)) = self
                .victims
                .pick(now, Some(incoming_priority), |k| Some(*k) != spare)
            else {
                return false;
            };
            self.remove_as(&key, Fate::Evicted);
            self.evicted_records += 1;
        }
        true
    }

    /// Inserts a record whose payload references are already taken, replacing (and
    /// releasing) any previous record of the same key.
    /// The bytes [`HostTier::put`] stored since the previous record are charged to it.
    pub(crate) fn insert_record(&mut self, rec: HostRecord) {
        let key = rec.meta.key;
        self.victims.insert(&rec.meta);
        if let Some(old) = self.records.insert(key, rec) {
            self.unpin(HostKind::Block, &old.hashes);
            self.unpin(HostKind::State, &old.states);
            self.end_use(&key, Fate::Superseded);
        }
        let (bytes, states) = std::mem::take(&mut self.pending);
        self.usage.written.records += 1;
        self.usage.written.bytes += bytes;
        self.usage.states_written += states;
        self.record_use.insert(key, (bytes, Use::NeverReturned));
    }

    /// Removes a record and releases its payloads: its key's next prompt end
    /// superseded it (counted so in [`HostTier::usage`]).
    pub fn remove_record(&mut self, key: &RetentionKey) -> Option<HostRecord> {
        self.remove_as(key, Fate::Superseded)
    }

    fn remove_as(&mut self, key: &RetentionKey, fate: Fate) -> Option<HostRecord> {
        let old = self.records.remove(key)?;
        self.victims.remove(key);
        self.unpin(HostKind::Block, &old.hashes);
        self.unpin(HostKind::State, &old.states);
        self.end_use(key, fate);
        Some(old)
    }

    fn end_use(&mut self, key: &RetentionKey, fate: Fate) {
        if let Some((bytes, how)) = self.record_use.remove(key) {
            self.usage.ended(fate, how, bytes);
        }
    }

    /// A request restored from the record of `key` (its own retention, or for a
    /// hybrid model the record whose snapshot it resumed from).
    pub(crate) fn mark_used(&mut self, key: &RetentionKey) {
        if let Some(u) = self.record_use.get_mut(key) {
            u.1 = Use::Restored;
        }
    }

    /// The record holding the snapshot at `boundary`: `preferred` when it does, else
    /// any. O(records), for the rare restore of another key's snapshot.
    pub(crate) fn state_owner(
        &self,
        boundary: BlockHash,
        preferred: Option<RetentionKey>,
    ) -> Option<RetentionKey> {
        let holds = |r: &HostRecord| r.states.contains(&boundary);
        if let Some(k) = preferred.filter(|k| self.records.get(k).is_some_and(holds)) {
            return Some(k);
        }
        self.records.values().find(|r| holds(r)).map(|r| r.meta.key)
    }

    /// Where the bytes written so far went: records that ended, by fate, and the
    /// records still held, each split into restored, returned unused, never returned.
    pub fn usage(&self) -> HostUsage {
        let mut u = self.usage;
        for (bytes, how) in self.record_use.values() {
            u.held(*how, *bytes);
        }
        u
    }

    /// A verified copy of a payload. On a checksum mismatch the payload and every
    /// record that needs it are dropped, so corrupt bytes are never offered again.
    pub fn fetch(
        &mut self,
        kind: HostKind,
        hash: BlockHash,
    ) -> Option<Result<Vec<u8>, ChecksumMismatch>> {
        let result = self
            .store(kind)
            .get(&hash)?
            .payload
            .verify()
            .map(<[u8]>::to_vec);
        if result.is_err() {
            self.drop_payload(kind, hash);
        }
        Some(result)
    }

    /// Drops a payload and every record that references it.
    pub fn drop_payload(&mut self, kind: HostKind, hash: BlockHash) {
        let keys: Vec<RetentionKey> = self
            .records
            .values()
            .filter(|r| match kind {
                HostKind::Block => r.hashes.contains(&hash),
                HostKind::State => r.states.contains(&hash),
            })
            .map(|r| r.meta.key)
            .collect();
        for k in keys {
            self.remove_as(&k, Fate::Dropped);
        }
        // Unreferenced payloads are already gone; a pinned-but-unrecorded one cannot exist.
        if let Some(e) = self.store_mut(kind).remove(&hash) {
            self.used -= e.bytes;
            if let Some(log) = self.freed.as_mut() {
                log.push((kind, hash));
            }
        }
    }

    /// The stored payload, for fault injection (corrupting host memory in tests).
    pub fn payload_mut(&mut self, kind: HostKind, hash: BlockHash) -> Option<&mut Payload> {
        self.store_mut(kind).get_mut(&hash).map(|e| &mut e.payload)
    }

    /// Checks accounting: used = Σ payload bytes ≤ capacity; refs = record references.
    pub fn check(&self) -> Result<(), String> {
        if !self.victims.matches(self.records.values().map(|r| &r.meta)) {
            return Err("host victim index disagrees with records".into());
        }
        let sum: u64 = self
            .blocks
            .values()
            .chain(self.states.values())
            .map(|e| e.bytes)
            .sum();
        if sum != self.used {
            return Err(format!("host used {} != payload bytes {sum}", self.used));
        }
        if self.used > self.capacity {
            return Err(format!(
                "host used {} > capacity {}",
                self.used, self.capacity
            ));
        }
        let mut want: HashMap<(bool, BlockHash), u32> = HashMap::new();
        for r in self.records.values() {
            for h in &r.hashes {
                *want.entry((true, *h)).or_default() += 1;
            }
            for h in &r.states {
                *want.entry((false, *h)).or_default() += 1;
            }
        }
        for (is_block, store) in [(true, &self.blocks), (false, &self.states)] {
            for (h, e) in store {
                if want.get(&(is_block, *h)).copied().unwrap_or(0) != e.refs {
                    return Err(format!(
                        "host payload {h:?} refs {} disagree with records",
                        e.refs
                    ));
                }
            }
        }
        if want.len() != self.blocks.len() + self.states.len() {
            return Err("a host record references a missing payload".into());
        }
        Ok(())
    }
}
