//! Device slots for linear-state snapshots, keyed by the block hash of their boundary.
//!
//! A hybrid model's state is valid only exactly at the boundary it was taken at
//! (vLLM `--mamba-cache-mode align`), so a snapshot is named by the hash of the last
//! block before it: any request whose prefix chain reaches that hash can resume from it.
//! Snapshots nothing pins stay cached in LRU order (like unpinned KV blocks) and are
//! the first to give up their slot.

use crate::hash::BlockHash;
use crate::payload::StateSlot;
use crate::pool::HashIndex;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: StateSlot,
    pins: u32,
    /// Position in the LRU while unpinned.
    seq: u64,
}

/// The device's pool of state snapshot slots.
#[derive(Debug)]
pub struct StatePool {
    capacity: usize,
    free: Vec<u32>,
    by_boundary: HashIndex<Entry>,
    lru: BTreeMap<u64, BlockHash>,
    clock: u64,
}

impl StatePool {
    /// A pool of `capacity` slots.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            free: (0..capacity as u32).rev().collect(),
            by_boundary: HashIndex::default(),
            lru: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Slots in use (pinned or cached).
    pub fn used(&self) -> usize {
        self.capacity - self.free.len()
    }

    /// Slot count.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Cached snapshots nothing pins.
    pub fn unpinned(&self) -> usize {
        self.lru.len()
    }

    /// The slot holding the snapshot at `boundary`.
    pub fn get(&self, boundary: BlockHash) -> Option<StateSlot> {
        self.by_boundary.get(&boundary).map(|e| e.slot)
    }

    /// Pins an existing snapshot.
    pub fn pin(&mut self, boundary: BlockHash) -> Option<StateSlot> {
        let e = self.by_boundary.get_mut(&boundary)?;
        if e.pins == 0 {
            self.lru.remove(&e.seq);
        }
        e.pins += 1;
        Some(e.slot)
    }

    /// True when a slot is free.
    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Takes a free slot for a new snapshot at `boundary`, pinned once (or pins the existing one).
    pub fn insert(&mut self, boundary: BlockHash) -> Option<StateSlot> {
        if let Some(s) = self.pin(boundary) {
            return Some(s);
        }
        let slot = StateSlot(self.free.pop()?);
        self.by_boundary.insert(
            boundary,
            Entry {
                slot,
                pins: 1,
                seq: 0,
            },
        );
        Some(slot)
    }

    /// Drops a pin; at zero pins the snapshot stays cached at the back of the LRU.
    pub fn unpin(&mut self, boundary: BlockHash) {
        if let Some(e) = self.by_boundary.get_mut(&boundary) {
            debug_assert!(e.pins > 0, "unpin of an unpinned snapshot");
            e.pins = e.pins.saturating_sub(1);
            if e.pins == 0 {
                self.clock += 1;
                e.seq = self.clock;
                self.lru.insert(self.clock, boundary);
            }
        }
    }

    /// Drops a pin on a snapshot whose bytes were never written (a failed restore):
    /// at zero pins the slot is freed, not cached, so the garbage is never served.
    pub fn discard(&mut self, boundary: BlockHash) {
        if let Some(e) = self.by_boundary.get_mut(&boundary) {
            e.pins = e.pins.saturating_sub(1);
            if e.pins == 0 {
                self.free.push(e.slot.0);
                self.by_boundary.remove(&boundary);
            }
        }
    }

    /// Frees the least recently unpinned snapshot; false when every snapshot is pinned.
    pub fn evict_unpinned(&mut self) -> bool {
        let Some((_, b)) = self.lru.pop_first() else {
            return false;
        };
        if let Some(e) = self.by_boundary.remove(&b) {
            self.free.push(e.slot.0);
        }
        true
    }

    /// Sum of pins over snapshots (for invariant checks).
    pub fn total_pins(&self) -> u64 {
        self.by_boundary.values().map(|e| u64::from(e.pins)).sum()
    }

    /// Checks slot accounting and LRU membership.
    pub fn check(&self) -> Result<(), String> {
        if self.by_boundary.len() + self.free.len() != self.capacity {
            return Err("state slots: entries + free != capacity".into());
        }
        let unpinned = self.by_boundary.values().filter(|e| e.pins == 0).count();
        if unpinned != self.lru.len() {
            return Err("state LRU disagrees with unpinned snapshots".into());
        }
        Ok(())
    }
}
