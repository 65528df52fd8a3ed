//! Linear-state snapshots on the device, keyed by the block hash of their boundary.
//!
//! A hybrid model's state is valid only exactly at the boundary it was taken at
//! (vLLM `--mamba-cache-mode align`), so a snapshot is named by the hash of the last
//! block before it: any request whose prefix chain reaches that hash can resume from it.
//! Snapshots share the device budget with KV blocks, as vLLM's hybrid allocator pads a
//! Mamba state into pages of the same pool: each one is backed by
//! `PolicyConfig::state_blocks` block slots taken from the block pool, which the
//! cache gives back when the snapshot goes. Snapshots nothing pins stay cached in LRU
//! order (like unpinned KV blocks); one whose boundary block is evicted goes with it.

use crate::hash::BlockHash;
use crate::payload::{SlotId, StateSlot};
use crate::pool::HashIndex;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
struct Entry {
    slot: StateSlot,
    pins: u32,
    /// Position in the LRU while unpinned.
    seq: u64,
    /// The caller's clock when it was last unpinned ([`StatePool::unpin_at`]).
    tick: u64,
    /// Block slots (pinned once each) whose device bytes hold this snapshot.
    backing: Vec<SlotId>,
}

/// The device's linear-state snapshots.
#[derive(Debug)]
pub struct StatePool {
    capacity: usize,
    /// Slot numbers given back; numbers `next..capacity` were never used.
    free: Vec<u32>,
    next: u32,
    by_boundary: HashIndex<Entry>,
    lru: BTreeMap<u64, BlockHash>,
    clock: u64,
    /// The latest tick [`StatePool::unpin_at`] was given (ticks never go back).
    last_tick: u64,
}

impl StatePool {
    /// A pool of at most `capacity` snapshots; slot numbers are handed out on first use.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            free: Vec::new(),
            next: 0,
            by_boundary: HashIndex::default(),
            lru: BTreeMap::new(),
            clock: 0,
            last_tick: 0,
        }
    }

    /// Snapshots held (pinned or cached).
    pub fn used(&self) -> usize {
        self.by_boundary.len()
    }

    /// Most snapshots the device can hold (its block budget ÷ blocks per snapshot).
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

    /// Records a new snapshot at `boundary`, pinned once, stored in `backing`. Gives
    /// `backing` back when no slot number is left (the caller releases it).
    pub fn insert(
        &mut self,
        boundary: BlockHash,
        backing: Vec<SlotId>,
    ) -> Result<StateSlot, Vec<SlotId>> {
        let n = match self.free.pop() {
            Some(n) => n,
            None if (self.next as usize) < self.capacity => {
                self.next += 1;
                self.next - 1
            }
            None => return Err(backing),
        };
        let slot = StateSlot(n);
        self.by_boundary.insert(
            boundary,
            Entry {
                slot,
                pins: 1,
                seq: 0,
                tick: 0,
                backing,
            },
        );
        Ok(slot)
    }

    /// Drops a pin; at zero pins the snapshot stays cached at the back of the LRU.
    pub fn unpin(&mut self, boundary: BlockHash) {
        self.unpin_at(boundary, self.last_tick);
    }

    /// [`StatePool::unpin`], stamping the snapshot with the caller's clock `tick` (the
    /// block pool's LRU clock), so an unpinned snapshot's age compares with a pinned
    /// retention's ([`StatePool::unpinned_lru`]). A tick below an earlier one counts as
    /// that one: the LRU order stays the order of unpinning.
    pub fn unpin_at(&mut self, boundary: BlockHash, tick: u64) {
        let tick = tick.max(self.last_tick);
        self.last_tick = tick;
        if let Some(e) = self.by_boundary.get_mut(&boundary) {
            debug_assert!(e.pins > 0, "unpin of an unpinned snapshot");
            e.pins = e.pins.saturating_sub(1);
            if e.pins == 0 {
                self.clock += 1;
                e.seq = self.clock;
                e.tick = tick;
                self.lru.insert(self.clock, boundary);
            }
        }
    }

    /// Drops a pin on a snapshot whose bytes were never written (a failed restore):
    /// at zero pins it is removed, not cached, so the garbage is never served. Returns
    /// the backing block slots to release.
    pub fn discard(&mut self, boundary: BlockHash) -> Vec<SlotId> {
        let Some(e) = self.by_boundary.get_mut(&boundary) else {
            return Vec::new();
        };
        e.pins = e.pins.saturating_sub(1);
        if e.pins > 0 {
            return Vec::new();
        }
        self.remove(boundary)
    }

    /// The unpinned snapshots, least recently unpinned first: (boundary, tick).
    pub fn unpinned_lru(&self) -> impl Iterator<Item = (BlockHash, u64)> + '_ {
        self.lru
            .values()
            .filter_map(|b| self.by_boundary.get(b).map(|e| (*b, e.tick)))
    }

    /// Removes the least recently unpinned snapshot; `None` when every snapshot is
    /// pinned, else the backing block slots to release.
    pub fn evict_unpinned(&mut self) -> Option<Vec<SlotId>> {
        let (_, b) = self.lru.pop_first()?;
        Some(self.remove(b))
    }

    /// Removes the snapshot at `boundary` if nothing pins it (its boundary block was
    /// evicted); returns the backing block slots to release.
    pub fn forget_unpinned(&mut self, boundary: BlockHash) -> Vec<SlotId> {
        match self.by_boundary.get(&boundary) {
            Some(e) if e.pins == 0 => {
                self.lru.remove(&e.seq);
                self.remove(boundary)
            }
            _ => Vec::new(),
        }
    }

    fn remove(&mut self, boundary: BlockHash) -> Vec<SlotId> {
        match self.by_boundary.remove(&boundary) {
            Some(e) => {
                self.free.push(e.slot.0);
                e.backing
            }
            None => Vec::new(),
        }
    }

    /// Sum of pins over snapshots (for invariant checks).
    pub fn total_pins(&self) -> u64 {
        self.by_boundary.values().map(|e| u64::from(e.pins)).sum()
    }

    /// Every block slot backing a snapshot (for invariant checks).
    pub fn backing_slots(&self) -> impl Iterator<Item = SlotId> + '_ {
        self.by_boundary
            .values()
            .flat_map(|e| e.backing.iter().copied())
    }

    /// The boundaries of all snapshots held (for invariant checks).
    pub fn boundaries(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.by_boundary.keys().copied()
    }

    /// Checks slot accounting and LRU membership.
    pub fn check(&self) -> Result<(), String> {
        if self.by_boundary.len() + self.free.len() != self.next as usize {
            return Err("state slots: entries + free != slots handed out".into());
        }
        if self.next as usize > self.capacity {
            return Err("state slots: more handed out than capacity".into());
        }
        let unpinned = self.by_boundary.values().filter(|e| e.pins == 0).count();
        if unpinned != self.lru.len() {
            return Err("state LRU disagrees with unpinned snapshots".into());
        }
        Ok(())
    }
}
