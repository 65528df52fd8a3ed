use super::*;
use std::hash::BuildHasher;

fn h(i: u128) -> BlockHash {
    BlockHash(i * 0x9e37_79b9_7f4a_7c15 + 1)
}

/// Allocates and publishes a chain of `n` blocks, returning its slots (all pinned once).
fn chain(p: &mut BlockPool, base: u128, n: usize, under: Option<SlotId>) -> Vec<SlotId> {
    let mut parent = under;
    let mut out = Vec::new();
    for i in 0..n {
        let s = p.take_empty().expect("room");
        assert!(p.insert(s, h(base + i as u128), parent));
        parent = Some(s);
        out.push(s);
    }
    out
}

#[test]
fn released_chains_evict_tail_before_head() {
    let mut p = BlockPool::new(8);
    let a = chain(&mut p, 0, 3, None);
    for s in a.iter().rev() {
        p.release(*s);
    }
    assert_eq!(p.lru_order(), vec![a[2], a[1], a[0]]);
    p.check().expect("invariants");
    // Evicting the front takes only the tail; the head stays reusable.
    assert_eq!(p.evict_lru(), 1);
    assert_eq!(p.prefix_len(&[h(0), h(1), h(2)]), 2);
    p.check().expect("invariants");
}

#[test]
fn evicting_a_head_takes_its_subtree_so_nothing_is_orphaned() {
    let mut p = BlockPool::new(8);
    let a = chain(&mut p, 0, 3, None);
    // Released head first (a caller bug in ordering) still never orphans the tail.
    for s in &a {
        p.release(*s);
    }
    assert_eq!(p.evict_lru(), 3);
    assert_eq!(p.cached(), 0);
    assert_eq!(p.empty_slots(), 8);
    p.check().expect("invariants");
}

#[test]
fn retained_and_referenced_blocks_leave_the_free_queue() {
    let mut p = BlockPool::new(4);
    let a = chain(&mut p, 0, 2, None);
    p.retain(a[0]);
    p.retain(a[1]);
    for s in a.iter().rev() {
        p.release(*s);
    }
    assert_eq!(p.evictable(), 0);
    assert_eq!(p.evict_lru(), 0);
    p.unretain(a[1]);
    p.unretain(a[0]);
    assert_eq!(p.lru_order(), vec![a[1], a[0]]);
    p.acquire(a[0]);
    p.acquire(a[1]);
    assert_eq!(p.evictable(), 0);
    p.check().expect("invariants");
}

#[test]
fn duplicate_hashes_stay_uncached_and_free_on_release() {
    let mut p = BlockPool::new(4);
    let a = chain(&mut p, 0, 1, None);
    let dup = p.take_empty().expect("room");
    assert!(!p.insert(dup, h(0), None));
    p.release(dup);
    assert_eq!(p.empty_slots(), 3);
    assert_eq!(p.get(h(0)), Some(a[0]));
    p.check().expect("invariants");
}

#[test]
fn events_report_stores_and_cascaded_removals_only_when_recording() {
    let mut p = BlockPool::new(4);
    let a = chain(&mut p, 0, 1, None);
    assert!(p.drain_events().is_empty(), "not recording by default");
    p.record_events();
    let b = chain(&mut p, 1, 2, Some(a[0]));
    assert_eq!(
        p.drain_events(),
        vec![
            KvEvent::Stored {
                hash: h(1),
                parent: Some(h(0))
            },
            KvEvent::Stored {
                hash: h(2),
                parent: Some(h(1))
            },
        ]
    );
    for s in b.iter().rev().chain(&a) {
        p.release(*s);
    }
    // The head goes last in the queue but its subtree went first; evict everything.
    while p.evict_lru() > 0 {}
    let removed: Vec<KvEvent> = p.drain_events();
    assert_eq!(removed.len(), 3);
    assert!(removed.contains(&KvEvent::Removed { hash: h(0) }));
    assert!(p.drain_events().is_empty());
}

#[test]
fn slots_are_created_on_first_use_so_an_unused_pool_costs_nothing() {
    // A pool sized for a real device holds no per-slot memory until it fills.
    let mut p = BlockPool::new(1 << 20);
    assert_eq!(p.capacity(), 1 << 20);
    assert_eq!(p.empty_slots(), 1 << 20);
    assert!(p.metadata_bytes() < 1024, "{}", p.metadata_bytes());
    let a = chain(&mut p, 0, 3, None);
    assert_eq!(p.empty_slots(), (1 << 20) - 3);
    assert!(p.metadata_bytes() < 64 * 1024, "{}", p.metadata_bytes());
    for s in a.iter().rev() {
        p.release(*s);
    }
    // Freed slots are reused before new ones are created.
    assert_eq!(p.evict_lru(), 1);
    let s = p.take_empty().unwrap();
    assert_eq!(s, a[2]);
    p.check().expect("invariants");
    // Never-used slots read as unpinned.
    assert_eq!(p.refs(SlotId(1000)), 0);
    assert_eq!(p.retains(SlotId(1000)), 0);
}

#[test]
fn a_full_pool_refuses_more_slots_until_one_is_freed() {
    let mut p = BlockPool::new(2);
    let a = p.take_empty().unwrap();
    let _b = p.take_empty().unwrap();
    assert_eq!(p.take_empty(), None);
    assert_eq!(p.empty_slots(), 0);
    p.release(a);
    assert_eq!(p.empty_slots(), 1);
    assert_eq!(p.take_empty(), Some(a));
    p.check().expect("invariants");
}

/// The index hashes a block by its low 64 bits (block hashes are uniform
/// already); a hasher that loses them would turn every lookup into a scan of
/// one bucket — correct, but no longer O(1) (cargo-mutants survivors in
/// `PassThrough`).
#[test]
fn the_index_hasher_passes_the_low_64_bits_through() {
    let mut a = PassThrough::default();
    a.write_u128(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210);
    assert_eq!(a.finish(), 0xfedc_ba98_7654_3210);
    let mut b = PassThrough::default();
    b.write(&[0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0xff]);
    assert_eq!(
        b.finish(),
        0x0102_0304_0506_0708,
        "first 8 bytes, big-endian"
    );
    let build = BuildHasherDefault::<PassThrough>::default();
    assert_eq!(
        build.hash_one(BlockHash(7 | (9 << 64))),
        7,
        "a BlockHash hashes as its low half"
    );
}

/// Counters callers report: cached blocks and evictions, exactly.
#[test]
fn cached_and_evicted_count_blocks_exactly() {
    let mut p = BlockPool::new(8);
    let a = chain(&mut p, 0, 3, None);
    let b = chain(&mut p, 10, 2, None);
    assert_eq!((p.cached(), p.evicted()), (5, 0));
    for s in a.iter().chain(&b).rev() {
        p.release(*s);
    }
    // The free queue's front is b's tail (released first), then b's head, then a's tail.
    assert_eq!(p.evict_lru(), 1);
    assert_eq!(p.evict_lru(), 1);
    assert_eq!((p.cached(), p.evicted()), (3, 2));
    assert_eq!(p.evict_lru(), 1);
    assert_eq!((p.cached(), p.evicted()), (2, 3));
    p.check().expect("invariants");
}

/// `metadata_bytes` is the memory figure BENCHMARKS.md quotes per block: slots,
/// the hash index (a slot id plus hashbrown's one control byte per bucket) and the
/// free list, all by capacity.
#[test]
fn metadata_bytes_counts_slots_index_and_free_list() {
    let mut p = BlockPool::new(64);
    let a = chain(&mut p, 0, 40, None);
    for s in a.iter().rev() {
        p.release(*s);
    }
    assert_eq!(p.evict_lru(), 1);
    let slots = p.slots.capacity();
    let buckets = p.index.capacity();
    let free = p.empty.capacity();
    assert!(slots >= 40 && buckets >= 39 && free >= 1);
    assert_eq!(
        p.metadata_bytes(),
        slots * std::mem::size_of::<Slot>() + buckets * (std::mem::size_of::<u32>() + 1) + free * 4
    );
    assert!(
        (48..=200).contains(&(p.metadata_bytes() / 40)),
        "{} B for 40 blocks",
        p.metadata_bytes()
    );
}

/// The index buckets by a hash's low 64 bits but matches whole hashes: blocks that
/// share their low half are distinct, each found, published and evicted on its own,
/// also after the index has grown (its rehash reads the hashes from the slots).
#[test]
fn hashes_sharing_their_low_half_stay_distinct_through_growth_and_eviction() {
    let mut p = BlockPool::new(512);
    let twin = |i: u128| BlockHash((i + 1) << 64 | 5);
    let slots: Vec<SlotId> = (0..300)
        .map(|i| {
            let s = p.take_empty().expect("room");
            assert!(p.insert(s, twin(i), None), "twin {i} refused");
            s
        })
        .collect();
    for (i, s) in slots.iter().enumerate() {
        assert_eq!(p.get(twin(i as u128)), Some(*s), "twin {i}");
    }
    assert_eq!(p.get(BlockHash(5)), None);
    // A duplicate of a cached hash is refused; the original keeps its slot.
    let dup = p.take_empty().expect("room");
    assert!(!p.insert(dup, twin(7), None));
    assert_eq!(p.get(twin(7)), Some(slots[7]));
    p.release(dup);
    // Release in order: the free queue evicts twin 0 first, then twin 1.
    for s in &slots {
        p.release(*s);
    }
    assert_eq!(p.evict_lru(), 1);
    assert_eq!(p.evict_lru(), 1);
    assert_eq!((p.get(twin(0)), p.get(twin(1))), (None, None));
    assert_eq!(p.get(twin(2)), Some(slots[2]));
    assert_eq!(p.prefix_len(&[twin(299), twin(0)]), 1);
    assert_eq!(p.cached(), 298);
    p.check().expect("invariants");
}
