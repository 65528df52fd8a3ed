//! One allocation cut into equal slots: where the host tier keeps its payloads and where
//! a pull's READs land, so that each is a single region a NIXL agent registers once
//! (docs/vllm.md, "State pull (NIXL)") instead of one registration per payload.
//!
//! The memory is reached only through raw pointers: a registered region may be read (the
//! holder's host tier) or written (the puller's staging) by the NIXL agent's threads
//! while this process runs, which no Rust reference may be alive across. A slice is made
//! for the length of one copy, at a moment the caller owns that slot (a payload being
//! written or verified; a READ that reported done).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// Alignment of the allocation. At most the allocator's minimum, so that `alloc_zeroed`
/// is a `calloc`: large zeroed allocations come from `mmap` and pages are committed on
/// first touch, so an arena sized for the whole host tier costs only what is used.
const ALIGN: usize = 16;

/// `slots` slots of `slot_bytes` each, handed out and taken back by index.
pub struct SlotArena {
    ptr: NonNull<u8>,
    layout: Option<Layout>,
    slot_bytes: usize,
    slots: u32,
    /// Slots never handed out start here.
    fresh: u32,
    /// Slots handed back, reused first (keeps touched pages few).
    free: Vec<u32>,
    /// One bit per slot handed out and not back.
    used: Vec<u64>,
}

// SAFETY: the arena owns its allocation; every access goes through `&self` / `&mut self`
// methods (one thread at a time on the Rust side) or through a NIXL agent that the
// connector sequences with them (docs above).
unsafe impl Send for SlotArena {}
// SAFETY: `&self` methods only read, and only slots the caller owns.
unsafe impl Sync for SlotArena {}

impl SlotArena {
    /// An arena of `slots` slots of `slot_bytes` (zero slots: no allocation).
    pub fn new(slots: usize, slot_bytes: usize) -> Result<Self, String> {
        let n = u32::try_from(slots).map_err(|_| format!("{slots} slots: at most {}", u32::MAX))?;
        let total = slots
            .checked_mul(slot_bytes)
            .ok_or_else(|| format!("{slots} slots of {slot_bytes} bytes overflow"))?;
        if total == 0 {
            return Ok(Self {
                ptr: NonNull::dangling(),
                layout: None,
                slot_bytes,
                slots: 0,
                fresh: 0,
                free: Vec::new(),
                used: Vec::new(),
            });
        }
        let layout = Layout::from_size_align(total, ALIGN).map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| format!("cannot allocate {total} bytes for {slots} slots"))?;
        Ok(Self {
            ptr,
            layout: Some(layout),
            slot_bytes,
            slots: n,
            fresh: 0,
            free: Vec::new(),
            used: vec![0; slots.div_ceil(64)],
        })
    }

    /// A free slot, or None when every slot is in use.
    pub fn alloc(&mut self) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.fresh < self.slots => {
                self.fresh += 1;
                self.fresh - 1
            }
            None => return None,
        };
        self.used[slot as usize / 64] |= 1 << (slot % 64);
        Some(slot)
    }

    /// `n` free slots, or None (and none taken) when fewer are free.
    pub fn alloc_n(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.available() < n {
            return None;
        }
        (0..n).map(|_| self.alloc()).collect()
    }

    /// Hands a slot back. A slot out of range or already free is ignored (a double free
    /// would hand one slot to two owners).
    pub fn release(&mut self, slot: u32) {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        if slot < self.fresh && self.used[word] & bit != 0 {
            self.used[word] &= !bit;
            self.free.push(slot);
        }
    }

    /// Slots not in use.
    pub fn available(&self) -> usize {
        (self.slots - self.fresh) as usize + self.free.len()
    }

    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Address and length of the whole region (what an agent registers).
    pub fn region(&self) -> (u64, usize) {
        (
            self.ptr.as_ptr() as u64,
            self.slots as usize * self.slot_bytes,
        )
    }

    /// Address of a slot.
    pub fn addr(&self, slot: u32) -> u64 {
        self.region().0 + slot as u64 * self.slot_bytes as u64
    }

    fn check(&self, slot: u32) {
        assert!(slot < self.slots, "slot {slot} of {}", self.slots);
    }

    /// A slot's bytes. The caller owns the slot (no agent writes it now).
    pub fn bytes(&self, slot: u32) -> &[u8] {
        self.check(slot);
        // SAFETY: in bounds (checked); the allocation lives as long as `self`.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.as_ptr().add(slot as usize * self.slot_bytes),
                self.slot_bytes,
            )
        }
    }

    /// A slot's bytes, writable. The caller owns the slot.
    pub fn bytes_mut(&mut self, slot: u32) -> &mut [u8] {
        self.check(slot);
        // SAFETY: in bounds (checked); `&mut self` excludes every other Rust access.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.as_ptr().add(slot as usize * self.slot_bytes),
                self.slot_bytes,
            )
        }
    }
}

impl Drop for SlotArena {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated with this layout in `new`.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}
