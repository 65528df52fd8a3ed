//! Device block pool: cached-block index, reference and retention counts, and the LRU free queue.
//!
//! Mirrors vLLM's `BlockPool`: a fixed set of slots, a hash → slot map for full cached
//! blocks, and a free queue evicted from the front. Callers release a request's chain
//! tail first, so chain tails are evicted before their heads. Unlike vLLM, the pool
//! also keeps the prefix tree (parent / child links): evicting a block evicts its
//! (necessarily unpinned) subtree with it, so no cached block is ever left without its
//! prefix, and a block whose descendants are pinned is never in the free queue
//! (pins propagate: a request or a retention holds its whole chain from the root).

use crate::hash::BlockHash;
use crate::payload::SlotId;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const NIL: u32 = u32::MAX;

/// Block hashes are already uniform: hash them by taking their low 64 bits.
#[derive(Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes.iter().take(8) {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

pub(crate) type HashIndex<V> = HashMap<BlockHash, V, BuildHasherDefault<PassThrough>>;

/// The pool's hash index: cached slot ids, bucketed by their hash's low 64 bits
/// (as [`PassThrough`]); the hash itself lives in the slot. Four bytes a bucket
/// instead of a `HashIndex<u32>`'s 32 keep the table several times smaller, and
/// removing an evicted slot matches its id without reading any hash. With
/// hundreds of simulated ranks the indexes fit no cache, and evicting through a
/// `HashIndex` was a third of a simulation's time (two cache misses per block;
/// BENCHMARKS.md "Planning a million requests").
type SlotIndex = hashbrown::HashTable<u32>;

/// The bucket hash of a block hash: its low 64 bits (they are uniform).
fn bucket(hash: BlockHash) -> u64 {
    hash.0 as u64
}

#[derive(Clone, Debug)]
struct Slot {
    hash: [u64; 2],
    parent: u32,
    first_child: u32,
    next_sib: u32,
    prev_sib: u32,
    lru_prev: u32,
    lru_next: u32,
    refs: u32,
    retains: u32,
    cached: bool,
    in_lru: bool,
    /// The pool's LRU clock when the slot entered the free queue.
    tick: u64,
}

impl Slot {
    const EMPTY: Slot = Slot {
        hash: [0, 0],
        parent: NIL,
        first_child: NIL,
        next_sib: NIL,
        prev_sib: NIL,
        lru_prev: NIL,
        lru_next: NIL,
        refs: 0,
        retains: 0,
        cached: false,
        in_lru: false,
        tick: 0,
    };

    fn block_hash(&self) -> BlockHash {
        join(self.hash)
    }
}

/// A block hash as a slot stores it.
fn split(hash: BlockHash) -> [u64; 2] {
    [hash.0 as u64, (hash.0 >> 64) as u64]
}

/// The block hash a slot stores.
fn join(hash: [u64; 2]) -> BlockHash {
    BlockHash(u128::from(hash[0]) | (u128::from(hash[1]) << 64))
}

/// A change to the set of cached device blocks, in the shape of vLLM's KV events
/// (`BlockStored` / `BlockRemoved`), for KV-aware routers that track rank contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// A block was published under `hash` (child of `parent`, `None` for a first block).
    Stored {
        /// The block.
        hash: BlockHash,
        /// Its parent block.
        parent: Option<BlockHash>,
    },
    /// A cached block was evicted.
    Removed {
        /// The block.
        hash: BlockHash,
    },
}

/// The device block pool of one rank.
///
/// Slots are created on first use, up to `capacity`: a pool sized for a real
/// device (tens of thousands of blocks) costs nothing until it fills, so a
/// fleet simulator can hold a thousand of them. `empty` holds only slots that
/// were used and freed; never-used slots are `capacity - slots.len()`.
#[derive(Debug)]
pub struct BlockPool {
    events: Option<Vec<KvEvent>>,
    capacity: usize,
    slots: Vec<Slot>,
    index: SlotIndex,
    empty: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    lru_len: usize,
    evicted: u64,
    /// LRU clock: advanced by every entry into the free queue.
    clock: u64,
    /// [`BlockPool::evict_lru_into`]'s walk of a victim's subtree (kept to reuse).
    stack: Vec<u32>,
}

impl BlockPool {
    /// A pool of `capacity` empty slots (allocated as they are first used).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(NIL as usize - 1);
        Self {
            events: None,
            capacity,
            slots: Vec::new(),
            index: SlotIndex::new(),
            empty: Vec::new(),
            lru_head: NIL,
            lru_tail: NIL,
            lru_len: 0,
            evicted: 0,
            clock: 0,
            stack: Vec::new(),
        }
    }

    /// Starts recording [`KvEvent`]s (off by default: they cost memory until drained).
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// Takes the events recorded since the last call.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots holding nothing (freed ones and those never used yet).
    pub fn empty_slots(&self) -> usize {
        self.empty.len() + (self.capacity - self.slots.len())
    }

    /// Cached blocks that nothing pins (evictable now).
    pub fn evictable(&self) -> usize {
        self.lru_len
    }

    /// Cached blocks in the index.
    pub fn cached(&self) -> usize {
        self.index.len()
    }

    /// Blocks evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The cached slot holding `hash`.
    pub fn get(&self, hash: BlockHash) -> Option<SlotId> {
        self.find(hash).map(SlotId)
    }

    /// The slot the index holds `hash` in.
    fn find(&self, hash: BlockHash) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(bucket(hash), |&s| slots[s as usize].hash == split(hash))
            .copied()
    }

    /// Hash of a cached slot.
    pub fn hash_of(&self, slot: SlotId) -> Option<BlockHash> {
        let s = self.slots.get(slot.0 as usize)?;
        s.cached.then(|| s.block_hash())
    }

    /// How many leading hashes of `chain` are cached.
    pub fn prefix_len(&self, chain: &[BlockHash]) -> usize {
        chain
            .iter()
            .take_while(|h| self.find(**h).is_some())
            .count()
    }

    /// Takes an empty slot, if any (does not evict): a freed one first, else a
    /// slot never used before.
    pub fn take_empty(&mut self) -> Option<SlotId> {
        let s = match self.empty.pop() {
            Some(s) => s,
            None if self.slots.len() < self.capacity => {
                self.slots.push(Slot::EMPTY);
                (self.slots.len() - 1) as u32
            }
            None => return None,
        };
        self.slots[s as usize].refs = 1;
        Some(SlotId(s))
    }

    /// Evicts the front of the free queue and its subtree; returns the number of slots freed.
    pub fn evict_lru(&mut self) -> usize {
        self.evict_lru_into(&mut Vec::new())
    }

    /// As [`BlockPool::evict_lru`], appending the evicted blocks' hashes to `out`
    /// (a hybrid model's snapshots at those boundaries become unusable with them).
    pub fn evict_lru_into(&mut self, out: &mut Vec<BlockHash>) -> usize {
        if self.lru_head == NIL {
            return 0;
        }
        let victim = self.lru_head;
        // One buffer for every eviction (an allocation per evicted block was ~3 %
        // of a simulation).
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        stack.push(victim);
        let mut freed = 0;
        while let Some(s) = stack.pop() {
            let mut c = self.slots[s as usize].first_child;
            while c != NIL {
                let next = self.slots[c as usize].next_sib;
                if self.slots[c as usize].in_lru {
                    stack.push(c);
                } else {
                    // Unreachable while pins cover whole chains; keep the pinned child
                    // cached as a root rather than corrupting the tree.
                    debug_assert!(false, "pinned block under an evictable parent");
                    self.unlink_child(c);
                }
                c = next;
            }
            self.lru_remove(s);
            self.unlink_child(s);
            let h = self.slots[s as usize].block_hash();
            if let Ok(entry) = self.index.find_entry(bucket(h), |&v| v == s) {
                entry.remove();
            }
            if let Some(ev) = &mut self.events {
                ev.push(KvEvent::Removed { hash: h });
            }
            out.push(h);
            self.slots[s as usize] = Slot::EMPTY;
            self.empty.push(s);
            freed += 1;
        }
        self.stack = stack;
        self.evicted += freed as u64;
        freed
    }

    /// Pins a slot for a running request (reference count + 1).
    pub fn acquire(&mut self, slot: SlotId) {
        let s = slot.0;
        self.lru_remove(s);
        self.slots[s as usize].refs += 1;
    }

    /// Drops a request's pin. An unpinned cached block joins the back of the free
    /// queue; an unpinned uncached slot becomes empty.
    pub fn release(&mut self, slot: SlotId) {
        let s = slot.0;
        let e = &mut self.slots[s as usize];
        debug_assert!(e.refs > 0, "release of an unreferenced slot");
        e.refs = e.refs.saturating_sub(1);
        self.settle(s);
    }

    /// Drops a retention pin from a block of a retention that yielded for being older
    /// than the free queue's front: a block it leaves unpinned goes to the *front*
    /// (call head first, so the chain's tail ends up evicted first).
    pub fn unretain_cold(&mut self, slot: SlotId) {
        let s = slot.0;
        let e = &mut self.slots[s as usize];
        debug_assert!(e.retains > 0, "unretain of an unretained slot");
        e.retains = e.retains.saturating_sub(1);
        if !(e.refs == 0 && e.retains == 0 && e.cached) {
            self.settle(s);
            return;
        }
        let head = self.lru_head;
        let tick = if head == NIL {
            self.clock
        } else {
            self.slots[head as usize].tick
        };
        let e = &mut self.slots[s as usize];
        e.in_lru = true;
        e.lru_prev = NIL;
        e.lru_next = head;
        e.tick = tick;
        if head != NIL {
            self.slots[head as usize].lru_prev = s;
        } else {
            self.lru_tail = s;
        }
        self.lru_head = s;
        self.lru_len += 1;
    }

    /// The LRU clock now (ticks of free-queue entries so far).
    pub fn lru_clock(&self) -> u64 {
        self.clock
    }

    /// The LRU tick of the free queue's front (the next block evicted), if any.
    pub fn lru_front_tick(&self) -> Option<u64> {
        (self.lru_head != NIL).then(|| self.slots[self.lru_head as usize].tick)
    }

    /// Pins a cached slot for a retention record.
    pub fn retain(&mut self, slot: SlotId) {
        self.lru_remove(slot.0);
        let e = &mut self.slots[slot.0 as usize];
        e.retains = e.retains.saturating_add(1);
    }

    /// Drops a retention pin.
    pub fn unretain(&mut self, slot: SlotId) {
        let e = &mut self.slots[slot.0 as usize];
        debug_assert!(e.retains > 0, "unretain of an unretained slot");
        e.retains = e.retains.saturating_sub(1);
        self.settle(slot.0);
    }

    /// Retention pins on a slot (0 for a slot never used).
    pub fn retains(&self, slot: SlotId) -> u32 {
        self.slots.get(slot.0 as usize).map_or(0, |s| s.retains)
    }

    /// Request pins on a slot (0 for a slot never used).
    pub fn refs(&self, slot: SlotId) -> u32 {
        self.slots.get(slot.0 as usize).map_or(0, |s| s.refs)
    }

    fn settle(&mut self, s: u32) {
        let e = &self.slots[s as usize];
        if e.refs == 0 && e.retains == 0 {
            if e.cached {
                self.lru_push_back(s);
            } else {
                self.slots[s as usize] = Slot::EMPTY;
                self.empty.push(s);
            }
        }
    }

    /// Publishes a computed block under `hash` as a child of `parent`. Returns false
    /// (leaving the slot uncached) when another slot already holds the hash.
    pub fn insert(&mut self, slot: SlotId, hash: BlockHash, parent: Option<SlotId>) -> bool {
        if self.find(hash).is_some() {
            return false;
        }
        let s = slot.0;
        self.slots[s as usize].hash = split(hash);
        let slots = &self.slots;
        self.index
            .insert_unique(bucket(hash), s, |&v| bucket(slots[v as usize].block_hash()));
        if let Some(ev) = &mut self.events {
            let parent = parent.map(|p| self.slots[p.0 as usize].block_hash());
            ev.push(KvEvent::Stored { hash, parent });
        }
        let e = &mut self.slots[s as usize];
        e.cached = true;
        if let Some(p) = parent {
            let p = p.0;
            let old = self.slots[p as usize].first_child;
            let e = &mut self.slots[s as usize];
            e.parent = p;
            e.next_sib = old;
            e.prev_sib = NIL;
            if old != NIL {
                self.slots[old as usize].prev_sib = s;
            }
            self.slots[p as usize].first_child = s;
        }
        true
    }

    fn unlink_child(&mut self, s: u32) {
        let (p, prev, next) = {
            let e = &self.slots[s as usize];
            (e.parent, e.prev_sib, e.next_sib)
        };
        if p == NIL {
            return;
        }
        if prev != NIL {
            self.slots[prev as usize].next_sib = next;
        } else {
            self.slots[p as usize].first_child = next;
        }
        if next != NIL {
            self.slots[next as usize].prev_sib = prev;
        }
        let e = &mut self.slots[s as usize];
        e.parent = NIL;
        e.prev_sib = NIL;
        e.next_sib = NIL;
    }

    fn lru_push_back(&mut self, s: u32) {
        if self.slots[s as usize].in_lru {
            return;
        }
        let tail = self.lru_tail;
        self.clock += 1;
        {
            let e = &mut self.slots[s as usize];
            e.in_lru = true;
            e.lru_prev = tail;
            e.lru_next = NIL;
            e.tick = self.clock;
        }
        if tail != NIL {
            self.slots[tail as usize].lru_next = s;
        } else {
            self.lru_head = s;
        }
        self.lru_tail = s;
        self.lru_len += 1;
    }

    fn lru_remove(&mut self, s: u32) {
        let (in_lru, prev, next) = {
            let e = &self.slots[s as usize];
            (e.in_lru, e.lru_prev, e.lru_next)
        };
        if !in_lru {
            return;
        }
        if prev != NIL {
            self.slots[prev as usize].lru_next = next;
        } else {
            self.lru_head = next;
        }
        if next != NIL {
            self.slots[next as usize].lru_prev = prev;
        } else {
            self.lru_tail = prev;
        }
        let e = &mut self.slots[s as usize];
        e.in_lru = false;
        e.lru_prev = NIL;
        e.lru_next = NIL;
        self.lru_len -= 1;
    }

    /// The free queue front to back (eviction order), for tests and diagnostics.
    pub fn lru_order(&self) -> Vec<SlotId> {
        let mut out = Vec::with_capacity(self.lru_len);
        let mut c = self.lru_head;
        while c != NIL {
            out.push(SlotId(c));
            c = self.slots[c as usize].lru_next;
        }
        out
    }

    /// Heap bytes of the pool's metadata (slots, index, empty list), by capacity.
    pub fn metadata_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.index.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.empty.capacity() * 4
    }

    /// Checks the pool's structural invariants; returns the first violation found.
    pub fn check(&self) -> Result<(), String> {
        let mut lru = 0;
        for (i, e) in self.slots.iter().enumerate() {
            let i = i as u32;
            if e.cached {
                if self.find(e.block_hash()) != Some(i) {
                    return Err(format!("slot {i} cached but not indexed"));
                }
                if e.parent != NIL && !self.slots[e.parent as usize].cached {
                    return Err(format!("slot {i} orphaned: parent {} not cached", e.parent));
                }
                let pinned = e.refs > 0 || e.retains > 0;
                if e.in_lru == pinned {
                    return Err(format!(
                        "slot {i} free-queue membership wrong (pinned={pinned})"
                    ));
                }
                if pinned && e.parent != NIL {
                    let p = &self.slots[e.parent as usize];
                    if p.refs == 0 && p.retains == 0 {
                        return Err(format!(
                            "slot {i} pinned under unpinned parent {}",
                            e.parent
                        ));
                    }
                }
            } else if e.in_lru {
                return Err(format!("uncached slot {i} in free queue"));
            }
            lru += usize::from(e.in_lru);
        }
        if lru != self.lru_len || self.lru_order().len() != lru {
            return Err("free queue length mismatch".into());
        }
        let used = self.slots.iter().filter(|e| e.cached || e.refs > 0).count();
        if used + self.empty.len() != self.slots.len() || self.slots.len() > self.capacity {
            return Err(format!(
                "slot accounting: {used} used + {} freed != {} created (capacity {})",
                self.empty.len(),
                self.slots.len(),
                self.capacity
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
