use super::*;
use crate::hash::{ROOT_HASH, block_hash};
use crate::marker::{HexId, TurnKind};
use crate::payload::MetadataOnly;
use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64;

const BB: usize = 32;

/// A fake paged KV cache in host memory: every slot holds `BB` bytes. "Prefill" writes
/// a block's canonical content (a function of its hash), so a served block can be
/// checked byte for byte.
#[derive(Debug)]
struct VecMover {
    blocks: Vec<Vec<u8>>,
    states: Vec<Vec<u8>>,
    fail_scatter: bool,
}

impl VecMover {
    fn new(blocks: usize, states: usize) -> Self {
        Self {
            blocks: vec![vec![0; BB]; blocks],
            states: vec![vec![0; BB]; states],
            fail_scatter: false,
        }
    }
    fn content(h: BlockHash) -> Vec<u8> {
        (0..BB as u64)
            .map(|i| xxh3_64(&[h.0.to_le_bytes().as_slice(), &i.to_le_bytes()].concat()) as u8)
            .collect()
    }
    fn state_content(h: BlockHash) -> Vec<u8> {
        Self::content(h).into_iter().map(|b| !b).collect()
    }
    /// Plays the engine: writes the KV of blocks the cache said were not cached.
    fn prefill(&mut self, a: &Admission, hashes: &[BlockHash]) {
        for (s, h) in a.slots.iter().zip(hashes).skip(a.cached_blocks) {
            self.blocks[s.0 as usize] = Self::content(*h);
        }
    }
}

impl Mover for VecMover {
    fn gather_blocks(&mut self, slots: &[SlotId]) -> Result<Vec<u8>, MoveError> {
        Ok(slots
            .iter()
            .flat_map(|s| self.blocks[s.0 as usize].clone())
            .collect())
    }
    fn scatter_blocks(&mut self, slots: &[SlotId], data: &[u8]) -> Result<(), MoveError> {
        if self.fail_scatter {
            return Err(MoveError("injected".into()));
        }
        for (s, c) in slots.iter().zip(data.chunks_exact(BB)) {
            self.blocks[s.0 as usize] = c.to_vec();
        }
        Ok(())
    }
    fn gather_states(&mut self, slots: &[StateSlot]) -> Result<Vec<u8>, MoveError> {
        Ok(slots
            .iter()
            .flat_map(|s| self.states[s.0 as usize].clone())
            .collect())
    }
    fn scatter_states(&mut self, slots: &[StateSlot], data: &[u8]) -> Result<(), MoveError> {
        if self.fail_scatter {
            return Err(MoveError("injected".into()));
        }
        for (s, c) in slots.iter().zip(data.chunks_exact(BB)) {
            self.states[s.0 as usize] = c.to_vec();
        }
        Ok(())
    }
}

fn chain(session: u32, n: usize) -> Vec<BlockHash> {
    let mut p = ROOT_HASH;
    (0..n as u32)
        .map(|i| {
            p = block_hash(p, &[session, i], &[]);
            p
        })
        .collect()
}

fn key(s: u128) -> RetentionKey {
    RetentionKey {
        tenant: HexId(1),
        session: HexId(s),
        subagent: HexId(0),
    }
}

fn marker(s: u128, kind: TurnKind) -> TurnMarker {
    TurnMarker {
        key: key(s),
        prompt_end: true,
        kind,
        turn: None,
        retention_ms: None,
    }
}

fn cfg(device_blocks: usize, host_blocks: u64) -> PolicyConfig {
    PolicyConfig {
        device_blocks,
        block_bytes: BB as u64,
        host_bytes: host_blocks * BB as u64,
        ..PolicyConfig::default()
    }
}

/// One whole turn: admit, prefill, finish with a marker, release. Returns the admission.
fn turn(
    c: &mut RetentionCache,
    m: &mut VecMover,
    id: u64,
    hashes: &[BlockHash],
    mk: Option<TurnMarker>,
    now: Millis,
) -> Admission {
    let a = c
        .admit(RequestId(id), hashes, mk.map(|m| m.key), now, m)
        .expect("admit");
    // Every block the cache calls cached must already hold exactly its content.
    for (i, (s, h)) in a.slots.iter().zip(hashes).take(a.cached_blocks).enumerate() {
        assert_eq!(
            m.blocks[s.0 as usize],
            VecMover::content(*h),
            "wrong KV served at block {i}"
        );
    }
    m.prefill(&a, hashes);
    let r = c
        .finish_prefill(RequestId(id), mk.as_ref(), now, m)
        .expect("finish");
    for (b, s) in r.state_slots {
        m.states[s.0 as usize] = VecMover::state_content(hashes[b - 1]);
    }
    c.release(RequestId(id)).expect("release");
    c.check().expect("invariants");
    a
}

#[test]
fn next_turn_supersedes_and_frees_the_old_tail() {
    let mut c = RetentionCache::try_new(cfg(16, 0)).expect("cfg");
    let mut m = VecMover::new(16, 0);
    let t1 = chain(1, 4);
    turn(&mut c, &mut m, 1, &t1, Some(marker(1, TurnKind::First)), 0);
    assert_eq!(c.pool().evictable(), 0, "retained blocks are not evictable");
    // Turn 2 shares 3 blocks and replaces the 4th.
    let mut t2 = t1[..3].to_vec();
    t2.extend(chain(99, 2));
    let a = turn(&mut c, &mut m, 2, &t2, Some(marker(1, TurnKind::Tool)), 10);
    assert_eq!(a.cached_blocks, 3);
    assert_eq!(c.device_records(), 1);
    assert_eq!(c.stats().superseded, 1);
    assert_eq!(
        c.device_record(&key(1)).map(|r| r.hashes.clone()),
        Some(t2.clone())
    );
    // Only turn 1's last block is now evictable.
    assert_eq!(
        c.pool().lru_order(),
        vec![c.pool().get(t1[3]).expect("cached")]
    );
}

#[test]
fn a_hit_refreshes_and_an_unrefreshed_retention_expires_first() {
    let mut c = RetentionCache::try_new(cfg(8, 0)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    let tool = c.config().intervals.tool;
    turn(
        &mut c,
        &mut m,
        1,
        &chain(1, 3),
        Some(marker(1, TurnKind::Tool)),
        0,
    );
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 3),
        Some(marker(2, TurnKind::Tool)),
        0,
    );
    // A plain hit on session 1 (no prompt end) refreshes its interval.
    let a = turn(
        &mut c,
        &mut m,
        3,
        &chain(1, 3),
        Some(TurnMarker {
            prompt_end: false,
            ..marker(1, TurnKind::Tool)
        }),
        tool - 1,
    );
    assert_eq!(a.cached_blocks, 3);
    let exp = c.device_record(&key(1)).map(|r| r.meta.expires_ms);
    assert_eq!(exp, Some(2 * tool - 1));
    assert_eq!(c.stats().refreshed, 1);
    // At `tool`, session 2 has expired: it goes first though session 1 is older.
    turn(&mut c, &mut m, 4, &chain(3, 3), None, tool);
    assert!(c.device_record(&key(2)).is_none());
    assert!(c.device_record(&key(1)).is_some());
    assert_eq!(c.stats().expired_dropped, 1);
    assert_eq!(c.stats().offloaded + c.stats().dropped, 0);
}

/// Among several expired retentions the earliest expiry goes first, however
/// recently they were used: here the earliest to expire is the most recent.
#[test]
fn the_earliest_expired_retention_goes_first() {
    let mut c = RetentionCache::try_new(cfg(9, 0)).expect("cfg");
    let mut m = VecMover::new(9, 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 3),
        Some(marker(2, TurnKind::User)),
        0,
    );
    turn(
        &mut c,
        &mut m,
        3,
        &chain(3, 3),
        Some(marker(3, TurnKind::User)),
        5,
    );
    turn(
        &mut c,
        &mut m,
        1,
        &chain(1, 3),
        Some(marker(1, TurnKind::Tool)),
        10,
    );
    let now = 5 + c.config().intervals.user + 1;
    let exp = |k| {
        c.device_record(&key(k))
            .map(|r| r.meta.expires_ms)
            .expect("held")
    };
    assert!(
        exp(1) < exp(2) && exp(2) < exp(3) && exp(3) < now,
        "all three expired"
    );
    // Room for one 3-block prompt: exactly one expired retention goes, the earliest.
    turn(&mut c, &mut m, 4, &chain(4, 3), None, now);
    assert!(c.device_record(&key(1)).is_none());
    assert!(c.device_record(&key(2)).is_some());
    assert!(c.device_record(&key(3)).is_some());
    // Then the next earliest.
    turn(&mut c, &mut m, 5, &chain(5, 6), None, now);
    assert!(c.device_record(&key(2)).is_none());
    assert!(c.device_record(&key(3)).is_some());
    assert_eq!(c.stats().expired_dropped, 2);
}

#[test]
fn unretained_blocks_go_before_any_retention() {
    let mut c = RetentionCache::try_new(cfg(8, 0)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    turn(
        &mut c,
        &mut m,
        1,
        &chain(1, 4),
        Some(marker(1, TurnKind::User)),
        0,
    );
    turn(&mut c, &mut m, 2, &chain(2, 4), None, 1);
    turn(&mut c, &mut m, 3, &chain(3, 4), None, 2);
    assert!(c.device_record(&key(1)).is_some());
    assert_eq!(c.peek_prefix(&chain(1, 4)), 4);
    assert_eq!(c.peek_prefix(&chain(2, 4)), 0);
}

#[test]
fn least_recently_used_retention_is_evicted_first() {
    let mut c = RetentionCache::try_new(cfg(8, 0)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    // Kind does not order live records (it acts through the interval): a tool wait
    // retained first goes first, and a hit makes a record the most recently used.
    turn(
        &mut c,
        &mut m,
        1,
        &chain(1, 3),
        Some(marker(1, TurnKind::Tool)),
        0,
    );
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 3),
        Some(marker(2, TurnKind::User)),
        5,
    );
    turn(
        &mut c,
        &mut m,
        3,
        &chain(3, 4),
        Some(marker(3, TurnKind::User)),
        10,
    );
    assert!(
        c.device_record(&key(1)).is_none(),
        "oldest retention goes first"
    );
    assert!(c.device_record(&key(2)).is_some());
    assert_eq!(c.stats().dropped, 1);
    // Session 2 returns (a hit without a new prompt end), so session 3 is now the older.
    let hit = TurnMarker {
        prompt_end: false,
        ..marker(2, TurnKind::User)
    };
    turn(&mut c, &mut m, 4, &chain(2, 3), Some(hit), 20);
    turn(&mut c, &mut m, 5, &chain(5, 4), None, 30);
    assert!(c.device_record(&key(3)).is_none());
    assert!(c.device_record(&key(2)).is_some());
}

/// Session 1 returns (request `id`) with one block more than `s1`, at `now`.
fn session_one_returns(
    c: &mut RetentionCache,
    m: &mut VecMover,
    s1: &[BlockHash],
    id: u64,
    kind: TurnKind,
    now: Millis,
) -> Admission {
    let mut next = s1.to_vec();
    next.extend(chain(11, 1));
    turn(c, m, id, &next, Some(marker(1, kind)), now)
}

#[test]
fn pressure_offloads_to_host_and_the_return_restores_bit_exactly() {
    let mut c = RetentionCache::try_new(cfg(8, 16)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    assert_eq!((c.host().len(), c.host().is_empty()), (0, true));
    let s1 = chain(1, 5);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::User)), 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 6),
        Some(marker(2, TurnKind::Tool)),
        5,
    );
    assert_eq!(c.stats().offloaded, 1);
    assert!(c.host().record(&key(1)).is_some());
    assert_eq!((c.host().len(), c.host().is_empty()), (1, false));
    assert!(c.host().used() <= c.host().capacity());
    assert_eq!(c.peek_prefix(&s1), 2, "device lost part of session 1");
    let a = session_one_returns(&mut c, &mut m, &s1, 3, TurnKind::User, 60_000);
    assert_eq!(a.cached_blocks, 5);
    assert_eq!(a.restored_blocks, 3, "the 3 blocks the device lost");
    assert_eq!(c.stats().restored_blocks, 3);
    assert_eq!(c.stats().restore_misses, 0);
    assert_eq!(a.miss, None);
    assert!(
        c.host().record(&key(1)).is_none(),
        "the new prompt end superseded the host copy"
    );
    assert_eq!(c.stats().superseded, 1);
    assert_eq!(c.stats().retained, 3);
}

#[test]
fn a_corrupt_host_byte_is_a_miss_and_never_served() {
    let mut c = RetentionCache::try_new(cfg(8, 16)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    let s1 = chain(1, 5);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::User)), 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 6),
        Some(marker(2, TurnKind::Tool)),
        5,
    );
    let device = c.peek_prefix(&s1);
    let victim = s1[device + 1];
    let p = c
        .host_mut()
        .payload_mut(HostKind::Block, victim)
        .expect("offloaded");
    p.bytes_mut_unchecked()[7] ^= 1;
    // A hit without a prompt end, so nothing supersedes the host record: the miss
    // itself must drop the corrupt payload and the record that needs it.
    let hit = TurnMarker {
        prompt_end: false,
        ..marker(1, TurnKind::User)
    };
    let a = turn(&mut c, &mut m, 3, &s1, Some(hit), 10);
    assert_eq!(a.miss, Some(RestoreMiss::Checksum));
    assert_eq!(a.restored_blocks, 0);
    assert_eq!(a.cached_blocks, device);
    assert!(
        c.host().record(&key(1)).is_none(),
        "the record needing it is dropped"
    );
    assert!(!c.host().contains(HostKind::Block, victim));
    assert_eq!(c.stats().restore_misses, 1);
}

#[test]
fn a_failed_copy_is_a_miss() {
    let mut c = RetentionCache::try_new(cfg(8, 16)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    let s1 = chain(1, 5);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::User)), 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 6),
        Some(marker(2, TurnKind::Tool)),
        5,
    );
    let device = c.peek_prefix(&s1);
    m.fail_scatter = true;
    let a = c
        .admit(RequestId(3), &s1, Some(key(1)), 10, &mut m)
        .expect("admit");
    assert!(matches!(a.miss, Some(RestoreMiss::Copy(_))));
    assert_eq!(a.cached_blocks, device);
    assert_eq!(
        c.peek_prefix(&s1),
        device,
        "unrestored blocks are not published"
    );
    assert_eq!(c.stats().restore_misses, 1);
    assert_eq!(c.stats().restored_blocks, 0);
    c.release(RequestId(3)).expect("release");
    c.check().expect("invariants");
}

#[test]
fn host_tier_refuses_what_was_used_less_recently_than_it_holds() {
    // The host holds 5 to 9 blocks: one 5-block retention fits; an older one cannot
    // displace it, whatever room is left beside it.
    for host_blocks in [5, 7, 9] {
        let mut c = RetentionCache::try_new(cfg(6, host_blocks)).expect("cfg");
        let mut m = VecMover::new(6, 0);
        turn(
            &mut c,
            &mut m,
            1,
            &chain(1, 5),
            Some(marker(1, TurnKind::Tool)),
            0,
        );
        turn(
            &mut c,
            &mut m,
            2,
            &chain(2, 5),
            Some(marker(2, TurnKind::User)),
            1,
        );
        assert!(c.host().record(&key(1)).is_some());
        // Session 1 sends an unrelated short request: its host record is refreshed (used at 2).
        let hit = TurnMarker {
            prompt_end: false,
            ..marker(1, TurnKind::Tool)
        };
        turn(&mut c, &mut m, 3, &chain(9, 1), Some(hit), 2);
        turn(&mut c, &mut m, 4, &chain(3, 5), None, 3);
        assert!(
            c.host().record(&key(1)).is_some(),
            "the more recently used record stays on the host"
        );
        assert!(c.host().record(&key(2)).is_none());
        assert_eq!(c.stats().dropped, 1);
        assert_eq!(
            c.host().used(),
            5 * BB as u64,
            "host of {host_blocks} blocks"
        );
    }
}

#[test]
fn hybrid_prefix_is_usable_only_at_a_snapshot_boundary() {
    let mut conf = cfg(12, 64);
    conf.state_bytes = BB as u64;
    conf.checkpoint_every_tokens = 4 * conf.block_size;
    let mut c = RetentionCache::try_new(conf).expect("cfg");
    let mut m = VecMover::new(12, 12);
    let s1 = chain(1, 10);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::Tool)), 0);
    // Snapshots at 10, 8 and 4 blocks were wanted; each takes a block slot from the same
    // 12-slot budget as the 10 KV blocks, so the prompt end and the latest checkpoint
    // are kept.
    let rec = c.device_record(&key(1)).expect("retained");
    let kept: Vec<BlockHash> = rec.states.iter().map(|(h, _)| *h).collect();
    assert_eq!(kept, vec![s1[9], s1[7]]);
    // What the record pins: 10 blocks and 2 snapshots, and the tokens it saves.
    assert_eq!(rec.meta.bytes, 10 * BB as u64 + 2 * BB as u64);
    assert_eq!(rec.meta.tokens, 10 * c.config().block_size as u64);
    // A request sharing 9 blocks can only resume at the 8-block checkpoint.
    let mut other = s1[..9].to_vec();
    other.extend(chain(7, 2));
    let a = turn(&mut c, &mut m, 2, &other, None, 1);
    assert_eq!(a.cached_blocks, 8);
    let s = a.state.expect("checkpoint state");
    assert_eq!(m.states[s.0 as usize], VecMover::state_content(s1[7]));
    // The full prompt resumes exactly at its end.
    // (Its two new blocks pushed the record to the host tier: the prompt end comes back
    // from there, blocks and state.)
    let a = turn(&mut c, &mut m, 3, &s1, None, 2);
    assert_eq!(a.cached_blocks, 10);
    let s = a.state.expect("prompt-end state");
    assert_eq!(m.states[s.0 as usize], VecMover::state_content(s1[9]));
    c.check().expect("invariants");
}

/// A hybrid cache of `device` blocks whose snapshots take one block each, and its mover.
fn hybrid(device: usize, host_blocks: u64) -> (RetentionCache, VecMover) {
    let mut conf = cfg(device, host_blocks);
    conf.state_bytes = BB as u64;
    let c = RetentionCache::try_new(conf).expect("cfg");
    (c, VecMover::new(device, device))
}

#[test]
fn hybrid_state_offloads_and_restores_with_its_blocks() {
    let (mut c, mut m) = hybrid(12, 64);
    let s1 = chain(1, 6);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::User)), 0);
    // Session 2 needs the only state slot: session 1's record moves to the host.
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 6),
        Some(marker(2, TurnKind::Tool)),
        1,
    );
    assert!(c.host().record(&key(1)).is_some());
    assert!(c.host().contains(HostKind::State, s1[5]));
    turn(&mut c, &mut m, 3, &chain(3, 4), None, 2);
    let a = turn(&mut c, &mut m, 4, &s1, Some(marker(1, TurnKind::User)), 3);
    assert_eq!(a.cached_blocks, 6);
    let s = a.state.expect("restored state");
    assert_eq!(m.states[s.0 as usize], VecMover::state_content(s1[5]));
}

/// The "never wrong state" promise for hybrid models: a corrupt linear-state snapshot
/// on the host tier is a miss (dropped with the records needing it), never resumed from.
#[test]
fn a_corrupt_host_state_is_a_miss_and_never_served() {
    let mut conf = cfg(12, 64);
    conf.state_bytes = BB as u64;
    let mut c = RetentionCache::try_new(conf).expect("cfg");
    let mut m = VecMover::new(12, 12);
    let s1 = chain(1, 6);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::User)), 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 6),
        Some(marker(2, TurnKind::Tool)),
        1,
    );
    assert!(c.host().contains(HostKind::State, s1[5]), "offloaded");
    c.host_mut()
        .payload_mut(HostKind::State, s1[5])
        .expect("offloaded state")
        .bytes_mut_unchecked()[3] ^= 1;
    let a = turn(&mut c, &mut m, 3, &s1, Some(marker(1, TurnKind::User)), 3);
    assert_eq!(a.miss, Some(RestoreMiss::Checksum));
    assert_eq!(a.state, None, "no snapshot to resume from");
    assert_eq!(
        a.cached_blocks, 0,
        "a hybrid prefix without its state is not usable"
    );
    assert!(!c.host().contains(HostKind::State, s1[5]));
    assert!(c.host().record(&key(1)).is_none());
    assert_eq!(c.stats().restore_misses, 1);
}

#[test]
fn retention_off_is_plain_lru() {
    let mut conf = cfg(8, 0);
    conf.retention = false;
    let mut c = RetentionCache::try_new(conf).expect("cfg");
    let mut m = MetadataOnly;
    let a = c
        .admit(RequestId(1), &chain(1, 4), Some(key(1)), 0, &mut m)
        .expect("admit");
    assert_eq!(a.cached_blocks, 0);
    let r = c
        .finish_prefill(RequestId(1), Some(&marker(1, TurnKind::User)), 0, &mut m)
        .expect("finish");
    assert_eq!(r, Retained::default());
    c.release(RequestId(1)).expect("release");
    assert_eq!(c.device_records(), 0);
    assert_eq!(c.pool().evictable(), 4);
    assert!(matches!(
        c.release(RequestId(1)),
        Err(CacheError::Unknown(_))
    ));
}

#[test]
fn a_prompt_bigger_than_the_pool_is_refused_cleanly() {
    let mut c = RetentionCache::try_new(cfg(4, 0)).expect("cfg");
    let mut m = MetadataOnly;
    let e = c.admit(RequestId(1), &chain(1, 5), None, 0, &mut m);
    assert!(matches!(e, Err(CacheError::OutOfBlocks { need: 5 })));
    c.check().expect("invariants");
    assert_eq!(c.pool().empty_slots(), 4);
}

/// Case count: `PROPTEST_CASES` when set (for long soak runs), else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone)]
enum Op {
    /// Admit a new request for session `s`, turn grows its prompt by `grow` blocks;
    /// with `fail`, the copy into device memory fails (a partial restore).
    Start {
        s: u8,
        grow: u8,
        kind: u8,
        fail: bool,
    },
    /// Finish (with a prompt-end marker or not) and release the oldest running request.
    Finish { prompt_end: bool },
    /// Advance the clock.
    Tick(u32),
    /// Corrupt one host payload byte (of a block, or with `state` of a linear-state snapshot).
    Corrupt { i: u8, state: bool },
    /// Prefetch session `s`'s host retention, with `fail` a failing copy; with
    /// `displace`, every live retention may yield to it.
    Prefetch { s: u8, fail: bool, displace: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0u8..4, 0u8..4, proptest::bool::weighted(0.15))
            .prop_map(|(s, grow, kind, fail)| Op::Start { s, grow, kind, fail }),
        4 => any::<bool>().prop_map(|prompt_end| Op::Finish { prompt_end }),
        2 => (0u32..200_000).prop_map(Op::Tick),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(i, state)| Op::Corrupt { i, state }),
        2 => (0u8..6, proptest::bool::weighted(0.15), any::<bool>())
            .prop_map(|(s, fail, displace)| Op::Prefetch { s, fail, displace }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(96), ..ProptestConfig::default() })]
    /// Under random traffic: every invariant holds after every step (capacities,
    /// pins, no orphaned prefix), and every block reported cached holds its exact bytes.
    #[test]
    fn invariants_hold_under_random_operations(
        ops in proptest::collection::vec(op(), 1..120),
        device in 6usize..24, host in 0u64..40, hybrid in any::<bool>()) {
        let mut conf = cfg(device, host);
        if hybrid {
            conf.state_bytes = BB as u64;
            conf.checkpoint_every_tokens = 3 * conf.block_size;
            // Odd-sized devices also align snapshots to 2 blocks.
            conf.state_align_tokens = conf.block_size * (1 + device % 2);
        }
        let mut c = RetentionCache::try_new(conf).expect("cfg");
        let mut m = VecMover::new(device, device);
        let mut lens = [1usize; 6];
        let mut running: std::collections::VecDeque<(u64, Vec<BlockHash>, u8, u8)> = Default::default();
        let (mut now, mut next) = (0u64, 0u64);
        for o in ops {
            match o {
                Op::Start { s, grow, kind, fail } => {
                    m.fail_scatter = fail;
                    lens[s as usize] = (lens[s as usize] + grow as usize).min(device);
                    let hashes = chain(u32::from(s), lens[s as usize]);
                    next += 1;
                    match c.admit(RequestId(next), &hashes, Some(key(u128::from(s))), now, &mut m) {
                        Ok(a) => {
                            for (s, h) in a.slots.iter().zip(&hashes).take(a.cached_blocks) {
                                prop_assert_eq!(&m.blocks[s.0 as usize], &VecMover::content(*h));
                            }
                            if let Some(st) = a.state {
                                prop_assert!(a.cached_blocks > 0);
                                prop_assert_eq!(&m.states[st.0 as usize], &VecMover::state_content(hashes[a.cached_blocks - 1]));
                            }
                            m.prefill(&a, &hashes);
                            running.push_back((next, hashes, s, kind));
                        }
                        Err(CacheError::OutOfBlocks { .. }) => {}
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                Op::Finish { prompt_end } => {
                    if let Some((id, hashes, s, kind)) = running.pop_front() {
                        let kind = [TurnKind::First, TurnKind::User, TurnKind::Tool, TurnKind::Handoff][kind as usize];
                        let mk = TurnMarker { prompt_end, ..marker(u128::from(s), kind) };
                        let r = c.finish_prefill(RequestId(id), Some(&mk), now, &mut m).expect("finish");
                        for (b, st) in r.state_slots {
                            m.states[st.0 as usize] = VecMover::state_content(hashes[b - 1]);
                        }
                        c.release(RequestId(id)).expect("release");
                    }
                }
                Op::Tick(d) => now += u64::from(d),
                Op::Prefetch { s, fail, displace } => {
                    m.fail_scatter = fail;
                    let k = key(u128::from(s));
                    let on_device = c.device_record(&k).is_some();
                    let r = c.prefetch(&k, now, &mut m, &mut |_| displace);
                    prop_assert_eq!(c.device_record(&k).is_some(), r.is_ok() || on_device);
                    if r.is_ok() {
                        prop_assert!(c.host().record(&k).is_some(), "the host copy is kept");
                    }
                }
                Op::Corrupt { i, state } => {
                    // One byte of a payload the host tier actually holds.
                    let kind = if state { HostKind::State } else { HostKind::Block };
                    let held: Vec<BlockHash> = (0..6u32)
                        .flat_map(|s| chain(s, device))
                        .filter(|h| c.host().contains(kind, *h))
                        .collect();
                    if let Some(b) = held
                        .get(i as usize % held.len().max(1))
                        .and_then(|h| c.host_mut().payload_mut(kind, *h))
                        .and_then(|p| {
                            let bytes = p.bytes_mut_unchecked();
                            let at = i as usize % bytes.len().max(1);
                            bytes.get_mut(at)
                        })
                    {
                        *b ^= 0x5a;
                    }
                }
            }
            if let Err(e) = c.check() {
                prop_assert!(false, "invariant: {e}");
            }
            prop_assert!(c.host().used() <= c.host().capacity());
            prop_assert!(c.states().used() <= c.states().capacity());
        }
    }
}

#[test]
fn snapshot_boundaries_put_the_prompt_end_first_then_latest_checkpoints() {
    let mut conf = cfg(8, 0);
    assert!(
        snapshot_boundaries(&conf, 10).is_empty(),
        "attention-only models take no snapshots"
    );
    conf.state_bytes = 1;
    assert_eq!(snapshot_boundaries(&conf, 10), vec![10]);
    conf.checkpoint_every_tokens = 4 * conf.block_size;
    assert_eq!(snapshot_boundaries(&conf, 10), vec![10, 8, 4]);
    assert_eq!(snapshot_boundaries(&conf, 8), vec![8, 4]);
    assert!(snapshot_boundaries(&conf, 0).is_empty());
}

#[test]
fn hybrid_without_retention_caches_snapshots_unpinned_and_evicts_by_recency() {
    let mut conf = cfg(10, 0);
    conf.state_bytes = BB as u64;
    conf.retention = false;
    let mut c = RetentionCache::try_new(conf.clone()).expect("cfg");
    let mut m = VecMover::new(32, 32);
    turn(&mut c, &mut m, 1, &chain(1, 4), None, 0);
    assert_eq!(c.states().unpinned(), 1);
    let a = turn(&mut c, &mut m, 2, &chain(1, 4), None, 1);
    assert_eq!(
        a.cached_blocks, 4,
        "plain prefix caching reuses the cached snapshot"
    );
    // With retention: session 2 cached unpinned, then session 1 retained (5 + 5 of 10
    // slots, a snapshot taking one); a third prompt end takes session 2's blocks and
    // snapshot, not the retained ones, which are more recent.
    conf.retention = true;
    let mut c = RetentionCache::try_new(conf.clone()).expect("cfg");
    turn(&mut c, &mut m, 2, &chain(2, 4), None, 0);
    let s1 = Some(marker(1, TurnKind::User));
    turn(&mut c, &mut m, 1, &chain(1, 4), s1, 1);
    let s3 = Some(marker(3, TurnKind::User));
    turn(&mut c, &mut m, 3, &chain(3, 4), s3, 2);
    assert_eq!(c.stats().offloaded + c.stats().dropped, 0);
    assert!(c.states().get(chain(2, 4)[3]).is_none());
    assert_eq!(
        turn(&mut c, &mut m, 4, &chain(1, 4), None, 3).cached_blocks,
        4
    );
    // Hybrid models rank a retention against unpinned blocks by recency: retained
    // before session 2 ran, session 1 is the colder one and yields (no host tier here:
    // dropped), while session 2's more recent blocks stay cached.
    let mut c = RetentionCache::try_new(conf).expect("cfg");
    turn(&mut c, &mut m, 1, &chain(1, 4), s1, 0);
    turn(&mut c, &mut m, 2, &chain(2, 4), None, 1);
    turn(&mut c, &mut m, 3, &chain(3, 4), s3, 2);
    assert_eq!(c.stats().dropped, 1);
    assert!(c.device_record(&key(1)).is_none());
    assert_eq!(
        turn(&mut c, &mut m, 4, &chain(2, 4), None, 3).cached_blocks,
        4
    );
    c.check().expect("invariants");
}

#[test]
fn a_hit_refreshes_a_retention_held_on_the_host() {
    let mut c = RetentionCache::try_new(cfg(8, 16)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    turn(
        &mut c,
        &mut m,
        1,
        &chain(1, 5),
        Some(marker(1, TurnKind::User)),
        0,
    );
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 6),
        Some(marker(2, TurnKind::Tool)),
        5,
    );
    let before = c
        .host()
        .record(&key(1))
        .map(|r| r.meta.expires_ms)
        .expect("offloaded");
    // A request of session 1 without a prompt end (say, a retried call) hits and refreshes.
    let hit = TurnMarker {
        prompt_end: false,
        ..marker(1, TurnKind::User)
    };
    turn(&mut c, &mut m, 3, &chain(1, 5), Some(hit), 100_000);
    let r = c.host().record(&key(1)).expect("still on host");
    assert_eq!(
        r.meta.expires_ms,
        before.max(100_000 + c.config().intervals.user)
    );
    assert_eq!(r.meta.last_use_ms, 100_000);
    assert_eq!(c.stats().refreshed, 1);
}

/// A KV-aware router sees every block the cache publishes (with its parent) and
/// every block it evicts, in order, once per drain.
#[test]
fn kv_events_report_published_and_evicted_blocks() {
    let mut c = RetentionCache::try_new(cfg(4, 0)).expect("cfg");
    let mut m = VecMover::new(4, 0);
    assert!(c.drain_events().is_empty(), "off until asked for");
    c.record_events();
    let s1 = chain(1, 3);
    turn(&mut c, &mut m, 1, &s1, None, 0);
    assert_eq!(
        c.drain_events(),
        vec![
            KvEvent::Stored {
                hash: s1[0],
                parent: None
            },
            KvEvent::Stored {
                hash: s1[1],
                parent: Some(s1[0])
            },
            KvEvent::Stored {
                hash: s1[2],
                parent: Some(s1[1])
            },
        ]
    );
    assert!(c.drain_events().is_empty(), "drained");
    // Two new blocks need one slot beyond the free one: the LRU tail goes.
    let s2 = chain(2, 2);
    turn(&mut c, &mut m, 2, &s2, None, 1);
    assert_eq!(
        c.drain_events(),
        vec![
            KvEvent::Removed { hash: s1[2] },
            KvEvent::Stored {
                hash: s2[0],
                parent: None
            },
            KvEvent::Stored {
                hash: s2[1],
                parent: Some(s2[0])
            },
        ]
    );
}

#[test]
fn the_cache_keeps_the_configuration_it_was_given() {
    let mut conf = cfg(7, 3);
    conf.checkpoint_every_tokens = 5 * conf.block_size;
    let c = RetentionCache::try_new(conf.clone()).expect("cfg");
    assert_eq!(c.config(), &conf);
}

/// After a checksum miss nothing comes from the host tier for that request, not
/// even blocks another record still holds there (the request is served from the
/// device prefix alone, never from a partial restore).
#[test]
fn a_miss_restores_nothing_even_where_another_record_holds_the_prefix() {
    let mut c = RetentionCache::try_new(cfg(8, 16)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    // Sessions 1 and 2 share 3 blocks; both end up on the host tier.
    let shared = chain(9, 3);
    let s1: Vec<BlockHash> = shared.iter().copied().chain(chain(1, 2)).collect();
    let s2: Vec<BlockHash> = shared.iter().copied().chain(chain(2, 2)).collect();
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::User)), 0);
    turn(&mut c, &mut m, 2, &s2, Some(marker(2, TurnKind::User)), 1);
    turn(&mut c, &mut m, 3, &chain(3, 8), None, 2);
    assert!(c.host().record(&key(1)).is_some() && c.host().record(&key(2)).is_some());
    assert_eq!(c.peek_prefix(&s1), 0);
    // Corrupt session 1's own last block: its record goes, session 2's stays.
    c.host_mut()
        .payload_mut(HostKind::Block, s1[4])
        .expect("offloaded")
        .bytes_mut_unchecked()[0] ^= 1;
    let a = turn(&mut c, &mut m, 4, &s1, Some(marker(1, TurnKind::User)), 3);
    assert_eq!(a.miss, Some(RestoreMiss::Checksum));
    assert_eq!((a.cached_blocks, a.restored_blocks), (0, 0));
    assert!(
        c.host().record(&key(2)).is_some(),
        "the other record is untouched"
    );
    assert_eq!(c.host().prefix_len(&s2), 5);
}

/// A prompt shorter than one block has nothing to retain: its prompt end makes no record.
#[test]
fn a_prompt_without_a_full_block_is_not_retained() {
    let mut c = RetentionCache::try_new(cfg(4, 0)).expect("cfg");
    let mut m = VecMover::new(4, 0);
    let a = turn(&mut c, &mut m, 1, &[], Some(marker(1, TurnKind::Tool)), 0);
    assert_eq!((a.slots.len(), a.cached_blocks), (0, 0));
    assert_eq!(c.device_records(), 0);
    assert_eq!(c.stats().retained, 0);
}

/// An offload the host tier refuses leaves no reference behind on the payloads it
/// shares with records already there (the shared prefix, and for a hybrid model its
/// shared checkpoint, were pinned first).
#[test]
fn a_refused_offload_releases_the_shared_prefix_it_pinned() {
    for hybrid in [false, true] {
        // A hybrid model's snapshots take device slots too: 2 more for each prompt.
        let mut conf = cfg(if hybrid { 8 } else { 6 }, if hybrid { 7 } else { 5 });
        if hybrid {
            conf.state_bytes = BB as u64;
            conf.checkpoint_every_tokens = 3 * conf.block_size;
        }
        let mut c = RetentionCache::try_new(conf).expect("cfg");
        let mut m = VecMover::new(8, 8);
        let shared = chain(9, 3);
        let a: Vec<BlockHash> = shared.iter().copied().chain(chain(1, 2)).collect();
        let b: Vec<BlockHash> = shared.iter().copied().chain(chain(2, 2)).collect();
        turn(&mut c, &mut m, 1, &a, Some(marker(1, TurnKind::Tool)), 0);
        turn(&mut c, &mut m, 2, &b, Some(marker(2, TurnKind::User)), 1);
        assert!(
            c.host().record(&key(1)).is_some(),
            "a went to the host tier"
        );
        if hybrid {
            assert!(
                c.host().contains(HostKind::State, shared[2]),
                "shared checkpoint"
            );
        }
        // Session 1 is used again (an unrelated short request refreshes its host record).
        let hit = TurnMarker {
            prompt_end: false,
            ..marker(1, TurnKind::Tool)
        };
        turn(&mut c, &mut m, 3, &chain(8, 1), Some(hit), 2);
        // b must go too, but the host is full of the more recently used a: refused, dropped.
        turn(&mut c, &mut m, 4, &chain(3, 5), None, 3);
        assert!(c.host().record(&key(2)).is_none(), "hybrid {hybrid}");
        assert!(c.host().record(&key(1)).is_some(), "hybrid {hybrid}");
        assert_eq!(c.stats().dropped, 1, "hybrid {hybrid}");
        assert_eq!(c.host().used(), c.host().capacity(), "hybrid {hybrid}");
        c.check().expect("no reference left on the shared prefix");
    }
}

/// A device of 6 blocks and a host of 5: session 1 retains 5 blocks at 0,
/// session 2 retains 5 at `second_at` (pushing session 1 to the host), then an
/// unrelated request at 2 pushes session 2 towards the host.
fn two_retentions_then_a_flood(second_at: u64) -> RetentionCache {
    let mut c = RetentionCache::try_new(cfg(6, 5)).expect("cfg");
    let mut m = VecMover::new(6, 0);
    for (id, at) in [(1u64, 0), (2, second_at)] {
        turn(
            &mut c,
            &mut m,
            id,
            &chain(id as u32, 5),
            Some(marker(u128::from(id), TurnKind::Tool)),
            at,
        );
    }
    assert!(c.host().record(&key(1)).is_some());
    assert_eq!(c.host().evicted_records(), 0);
    turn(&mut c, &mut m, 3, &chain(3, 5), None, 2);
    c.check().expect("invariants");
    c
}

/// On a tie in recency the host keeps what it holds: an incoming record must have
/// been used strictly more recently than its victim (cargo-mutants survivor:
/// `<` -> `<=` in `VictimIndex::pick`, which made equals displace each other).
#[test]
fn the_host_tier_keeps_its_record_when_the_incoming_one_is_as_recent() {
    let c = two_retentions_then_a_flood(0);
    assert!(
        c.host().record(&key(1)).is_some(),
        "an equally recent record does not displace the host's"
    );
    assert!(c.host().record(&key(2)).is_none());
    assert_eq!(c.host().evicted_records(), 0);
    assert_eq!(c.stats().dropped, 1);
}

/// The host tier makes room by evicting its least recently used record (never the
/// record being offloaded), and counts it.
#[test]
fn the_host_tier_evicts_its_least_recently_used_record_for_a_newer_one() {
    let c = two_retentions_then_a_flood(1);
    assert!(
        c.host().record(&key(1)).is_none(),
        "the older record made room"
    );
    assert!(c.host().record(&key(2)).is_some());
    assert_eq!(c.host().evicted_records(), 1);
    assert_eq!(c.stats().offloaded, 2);
}

/// Snapshots are paid from the KV block budget: a snapshot of 2.5 blocks' bytes takes 3
/// block slots, which come back when it goes.
#[test]
fn a_snapshot_takes_block_slots_from_the_device_budget() {
    let mut conf = cfg(12, 0);
    conf.state_bytes = 5 * BB as u64 / 2;
    assert_eq!(conf.state_blocks(), 3);
    let mut c = RetentionCache::try_new(conf).expect("cfg");
    assert_eq!(c.states().capacity(), 4);
    let mut m = VecMover::new(12, 4);
    turn(&mut c, &mut m, 1, &chain(1, 4), None, 0);
    assert_eq!(c.pool().cached(), 4);
    assert_eq!(c.states().used(), 1);
    assert_eq!(c.pool().empty_slots(), 12 - 4 - 3);
    // A second prompt of 6 blocks needs 9 slots: 5 are free, the first prompt's blocks
    // go, and its snapshot goes with its boundary block, giving its 3 slots back.
    turn(&mut c, &mut m, 2, &chain(2, 6), None, 1);
    assert!(c.states().get(chain(1, 4)[3]).is_none());
    assert!(c.states().get(chain(2, 6)[5]).is_some());
    assert_eq!(c.pool().cached() + 3 + c.pool().empty_slots(), 12);
    c.check().expect("invariants");
}

#[test]
fn a_snapshot_larger_than_the_device_is_refused_naming_the_fields() {
    let mut conf = cfg(4, 0);
    conf.state_bytes = 5 * BB as u64;
    let e = RetentionCache::try_new(conf.clone()).expect_err("too large");
    assert!(e.to_string().contains("state_bytes"), "{e}");
    assert!(e.to_string().contains("device_blocks"), "{e}");
    conf.block_bytes = 0;
    let e = RetentionCache::try_new(conf).expect_err("no block bytes");
    assert!(e.to_string().contains("block_bytes"), "{e}");
}

/// The previous prompt end stays pinned while the new prompt end's snapshot is saved:
/// the new snapshot takes its room from other retentions first (offloaded), not from the
/// session's old turn.
#[test]
fn the_previous_snapshot_is_kept_until_the_new_one_is_saved() {
    let mut conf = cfg(10, 64);
    conf.state_bytes = BB as u64;
    let mut c = RetentionCache::try_new(conf).expect("cfg");
    let mut m = VecMover::new(10, 10);
    let s1 = chain(1, 3);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::Tool)), 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 1),
        Some(marker(2, TurnKind::Tool)),
        1,
    );
    // 4 + 2 slots used. Session 1's next turn rewrote its last block (2 blocks shared,
    // 2 new; with no snapshot on its chain all 4 are computed into fresh slots) and
    // needs a snapshot: the old turn's tail and snapshot would be the cheapest room,
    // but they stay until the new snapshot is saved.
    let mut next = s1[..2].to_vec();
    next.extend(chain(5, 2));
    turn(&mut c, &mut m, 3, &next, Some(marker(1, TurnKind::Tool)), 2);
    assert_eq!(c.stats().offloaded, 1, "session 2 yielded to the host tier");
    assert!(c.host().record(&key(2)).is_some());
    let rec = c.device_record(&key(1)).expect("new prompt end retained");
    assert_eq!(rec.states.first().map(|s| s.0), Some(next[3]));
    assert_eq!(c.stats().superseded, 1);
    assert!(
        c.states().get(s1[2]).is_some(),
        "the old snapshot is still cached (unpinned) after the new one was saved"
    );
    c.check().expect("invariants");
}

/// vLLM `--mamba-cache-mode align`: snapshots only at multiples of the hybrid block
/// (here 4 blocks). A prompt ending mid-block is retained up to its last aligned
/// boundary, and the next turn resumes there and recomputes only the rest.
#[test]
fn hybrid_snapshots_align_to_the_engine_block_and_a_mid_block_return_resumes_there() {
    let mut conf = cfg(32, 0);
    conf.state_bytes = BB as u64;
    conf.state_align_tokens = 4 * conf.block_size;
    assert_eq!(snapshot_boundaries(&conf, 10), vec![8]);
    assert!(snapshot_boundaries(&conf, 3).is_empty());
    conf.checkpoint_every_tokens = 3 * conf.block_size;
    assert_eq!(snapshot_boundaries(&conf, 13), vec![12, 8, 4]);
    conf.checkpoint_every_tokens = 0;
    let mut c = RetentionCache::try_new(conf.clone()).expect("cfg");
    let mut m = VecMover::new(32, 32);
    let s1 = chain(1, 10);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::Tool)), 0);
    let rec = c.device_record(&key(1)).expect("retained");
    assert_eq!(rec.hashes.len(), 8, "retained up to the aligned prompt end");
    assert_eq!(
        rec.states.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![s1[7]]
    );
    // The next turn resends the 10 blocks and adds 3: it resumes at block 8.
    let mut s2 = s1.clone();
    s2.extend(chain(2, 3));
    let a = turn(&mut c, &mut m, 2, &s2, Some(marker(1, TurnKind::Tool)), 1);
    assert_eq!(a.cached_blocks, 8);
    let st = a.state.expect("aligned snapshot");
    assert_eq!(m.states[st.0 as usize], VecMover::state_content(s1[7]));
    assert_eq!(
        c.device_record(&key(1)).map(|r| r.hashes.len()),
        Some(12),
        "superseded by the new aligned prompt end"
    );
    // A prompt shorter than one hybrid block has nothing to resume from: not retained.
    turn(
        &mut c,
        &mut m,
        3,
        &chain(3, 3),
        Some(marker(3, TurnKind::Tool)),
        2,
    );
    assert!(c.device_record(&key(3)).is_none());
    let mut bad = conf;
    bad.state_align_tokens = bad.block_size + 1;
    let e = RetentionCache::try_new(bad).expect_err("unaligned");
    assert!(e.to_string().contains("state_align_tokens"), "{e}");
    c.check().expect("invariants");
}

/// Sessions 1 and 2 retained on a 12-block device; a 6-block request without a
/// prompt end then pushes session 1 (least recently used) to the host tier and
/// leaves its own blocks unpinned: free room a prefetch may take.
fn session_one_on_the_host() -> (RetentionCache, VecMover, Vec<BlockHash>) {
    session_one_on_a_host_of(32)
}

/// Tool turns of sessions 1 (`s1`) and 2 (6 blocks), then a `flood`-block request
/// without a prompt end: session 1, least recently used, yields to the host tier.
fn push_session_one_out(c: &mut RetentionCache, m: &mut VecMover, s1: &[BlockHash], flood: usize) {
    turn(c, m, 1, s1, Some(marker(1, TurnKind::Tool)), 0);
    turn(c, m, 2, &chain(2, 6), Some(marker(2, TurnKind::Tool)), 5);
    turn(c, m, 3, &chain(3, flood), None, 10);
}

fn session_one_on_a_host_of(host_blocks: u64) -> (RetentionCache, VecMover, Vec<BlockHash>) {
    let mut c = RetentionCache::try_new(cfg(12, host_blocks)).expect("cfg");
    let mut m = VecMover::new(12, 0);
    let s1 = chain(1, 5);
    push_session_one_out(&mut c, &mut m, &s1, 6);
    assert_eq!(c.stats().offloaded, 1);
    assert!(c.host().record(&key(1)).is_some());
    assert_eq!(c.peek_prefix(&s1), 0, "session 1 left the device");
    assert_eq!(c.pool().evictable(), 6);
    (c, m, s1)
}

#[test]
fn a_prefetched_state_is_on_the_device_when_its_session_returns() {
    let (mut c, mut m, s1) = session_one_on_the_host();
    let p = c
        .prefetch(&key(1), 1_000, &mut m, &mut |_| false)
        .expect("room for it");
    assert_eq!(
        p,
        Prefetched {
            blocks: 5,
            state: false
        }
    );
    c.check().expect("invariants");
    assert_eq!(c.peek_prefix(&s1), 5);
    assert!(
        c.device_record(&key(2)).is_some(),
        "a live retention was evicted"
    );
    let a = session_one_returns(&mut c, &mut m, &s1, 4, TurnKind::Tool, 4_000);
    assert_eq!(
        (a.cached_blocks, a.restored_blocks),
        (5, 0),
        "served from the device, bit-exact"
    );
    let s = c.stats();
    assert_eq!(
        (
            s.prefetched,
            s.prefetched_blocks,
            s.prefetch_used,
            s.prefetch_wasted
        ),
        (1, 5, 1, 0)
    );
    assert_eq!(s.restored_blocks, 0, "no demand restore was needed");
}

#[test]
fn no_prefetch_when_only_retentions_or_running_work_could_give_room() {
    let (mut c, mut m, _) = session_one_on_the_host();
    // A running 6-block request takes the free room and holds it.
    let a = c
        .admit(RequestId(9), &chain(9, 6), None, 20, &mut m)
        .expect("admit");
    m.prefill(&a, &chain(9, 6));
    let before = c.stats();
    assert_eq!(
        c.prefetch(&key(1), 1_000, &mut m, &mut |_| false),
        Err(PrefetchSkip::NoRoom { need: 5, free: 0 })
    );
    c.check().expect("invariants");
    assert!(
        c.device_record(&key(2)).is_some(),
        "the live retention stays"
    );
    assert_eq!(c.stats(), before, "nothing moved, nothing counted");
    assert!(c.host().record(&key(1)).is_some());
}

#[test]
fn a_prefetch_unused_before_expiry_is_counted_wasted_and_yields() {
    let (mut c, mut m, s1) = session_one_on_the_host();
    c.prefetch(&key(1), 1_000, &mut m, &mut |_| false)
        .expect("room");
    // Past both tool intervals (120 s); a flood needs the device.
    turn(&mut c, &mut m, 5, &chain(5, 12), None, 200_000);
    let s = c.stats();
    assert_eq!(
        (s.prefetched, s.prefetch_used, s.prefetch_wasted),
        (1, 0, 1)
    );
    assert_eq!(c.peek_prefix(&s1), 0);
    c.check().expect("invariants");
}

#[test]
fn prefetch_skips_what_it_cannot_or_need_not_move() {
    let (mut c, mut m, _) = session_one_on_the_host();
    assert_eq!(
        c.prefetch(&key(2), 20, &mut m, &mut |_| false),
        Err(PrefetchSkip::OnDevice)
    );
    assert_eq!(
        c.prefetch(&key(7), 20, &mut m, &mut |_| false),
        Err(PrefetchSkip::NotOnHost)
    );
    assert_eq!(
        c.prefetch(&key(1), 120_000, &mut m, &mut |_| false),
        Err(PrefetchSkip::Expired)
    );
    // A corrupt host byte: a miss, nothing restored, the record dropped.
    let h = chain(1, 5)[2];
    if let Some(b) = c
        .host_mut()
        .payload_mut(HostKind::Block, h)
        .and_then(|p| p.bytes_mut_unchecked().first_mut())
    {
        *b ^= 1;
    }
    assert_eq!(
        c.prefetch(&key(1), 30, &mut m, &mut |_| false),
        Err(PrefetchSkip::Miss(RestoreMiss::Checksum))
    );
    assert!(c.host().record(&key(1)).is_none());
    assert_eq!(c.stats().prefetched, 0);
    c.check().expect("invariants");
}

#[test]
fn a_hybrid_prefetch_brings_back_the_prompt_end_snapshot() {
    let (mut c, mut m) = hybrid(16, 64);
    let s1 = chain(1, 6);
    push_session_one_out(&mut c, &mut m, &s1, 8);
    assert!(c.host().record(&key(1)).is_some());
    let p = c
        .prefetch(&key(1), 3, &mut m, &mut |_| false)
        .expect("room");
    assert!(p.state, "the snapshot crossed the host link");
    c.check().expect("invariants");
    let a = turn(&mut c, &mut m, 4, &s1, Some(marker(1, TurnKind::Tool)), 4);
    assert_eq!(
        (a.cached_blocks, a.restored_blocks, a.state_restored),
        (6, 0, false)
    );
    assert_eq!(c.stats().prefetch_used, 1);
}

#[test]
fn a_prefetch_displaces_only_retentions_expected_back_later_and_only_to_the_host() {
    let (mut c, mut m, s1) = session_one_on_the_host();
    // Running work takes the free room; session 2's retention is all that could give way.
    let a = c
        .admit(RequestId(9), &chain(9, 6), None, 20, &mut m)
        .expect("admit");
    m.prefill(&a, &chain(9, 6));
    let mut asked = Vec::new();
    assert_eq!(
        c.prefetch(&key(1), 1_000, &mut m, &mut |k| {
            asked.push(*k);
            false
        }),
        Err(PrefetchSkip::NoRoom { need: 5, free: 0 })
    );
    assert_eq!(
        asked,
        vec![key(2)],
        "only live retentions are offered, never the target"
    );
    let offloaded = c.stats().offloaded;
    let p = c.prefetch(&key(1), 1_000, &mut m, &mut |k| *k == key(2));
    assert_eq!(
        p,
        Ok(Prefetched {
            blocks: 5,
            state: false
        })
    );
    assert_eq!(
        c.stats().offloaded,
        offloaded + 1,
        "session 2 went to the host tier"
    );
    assert!(c.host().record(&key(2)).is_some() && c.device_record(&key(2)).is_none());
    assert_eq!(c.peek_prefix(&s1), 5);
    c.check().expect("invariants");
}

#[test]
fn a_live_retention_never_yields_to_a_prefetch_without_free_host_room() {
    // The host tier holds exactly session 1: session 2 could only go there by evicting.
    let (mut c, mut m, _) = session_one_on_a_host_of(5);
    let a = c
        .admit(RequestId(9), &chain(9, 6), None, 20, &mut m)
        .expect("admit");
    m.prefill(&a, &chain(9, 6));
    assert!(matches!(
        c.prefetch(&key(1), 1_000, &mut m, &mut |_| true),
        Err(PrefetchSkip::NoRoom { .. })
    ));
    assert!(c.device_record(&key(2)).is_some());
    assert_eq!(c.host().evicted_records(), 0);
    c.check().expect("invariants");
}

/// Session 1's two turns on a hybrid cache of 16 blocks (host tier of `host_blocks`):
/// a 4-block prompt end, then an 8-block prompt that resumes from it. Returns its chain.
fn session_one_resumes_once(c: &mut RetentionCache, m: &mut VecMover) -> Vec<BlockHash> {
    let s = chain(1, 8);
    turn(c, m, 1, &s[..4], Some(marker(1, TurnKind::Tool)), 0);
    let a = turn(c, m, 2, &s, Some(marker(1, TurnKind::Tool)), 1);
    assert_eq!(
        a.cached_blocks, 4,
        "the second turn resumes at the first's end"
    );
    s
}

/// Session 2's 12-block turn, which needs 13 of the 16 slots: session 1 (8 blocks + 2
/// snapshots) goes to the host. Then session 1 returns with its prompt's tail
/// rewritten: 6 of its blocks and 3 new ones. Returns that return's admission.
fn push_out_and_return_rewritten(
    c: &mut RetentionCache,
    m: &mut VecMover,
    s: &[BlockHash],
    check: impl FnOnce(&RetentionCache),
) -> Admission {
    turn(c, m, 3, &chain(2, 12), Some(marker(2, TurnKind::Tool)), 2);
    check(c);
    let mut next = s[..6].to_vec();
    next.extend(chain(9, 3));
    turn(c, m, 4, &next, Some(marker(1, TurnKind::Tool)), 3)
}

fn kept_states(c: &RetentionCache, k: &RetentionKey) -> Vec<BlockHash> {
    let rec = c.device_record(k).expect("retained");
    rec.states.iter().map(|(h, _)| *h).collect()
}

/// The resume anchor: with a host tier a hybrid retention keeps, beside its prompt
/// end, the snapshot its turn resumed from; offloaded, the record carries both, and a
/// next turn that rewrites the prompt's tail (diverging before the prompt end)
/// resumes at the anchor from the host instead of recomputing everything.
#[test]
fn a_hybrid_retention_keeps_the_snapshot_its_turn_resumed_from() {
    let (mut c, mut m) = hybrid(16, 64);
    let s = session_one_resumes_once(&mut c, &mut m);
    assert_eq!(kept_states(&c, &key(1)), vec![s[7], s[3]]);
    assert_eq!(c.stats().anchors, 1);
    let a = push_out_and_return_rewritten(&mut c, &mut m, &s, |c| {
        assert!(c.device_record(&key(1)).is_none());
        let on_host = c.host().record(&key(1)).expect("offloaded");
        assert_eq!(on_host.states, vec![s[7], s[3]]);
    });
    assert_eq!(a.cached_blocks, 4, "resumed at the anchor");
    assert!(a.state_restored);
}

/// Without a host tier the anchor is not pinned: on the device alone an extra pinned
/// snapshot displaces what plain LRU keeps (measured, docs/engine.md).
#[test]
fn without_a_host_tier_a_hybrid_retention_keeps_only_its_prompt_end() {
    let (mut c, mut m) = hybrid(16, 0);
    let s = session_one_resumes_once(&mut c, &mut m);
    assert_eq!(kept_states(&c, &key(1)), vec![s[7]]);
    assert_eq!(c.stats().anchors, 0);
}

/// A turn that resumed from nothing, or from its own prompt end (a resend), has no
/// anchor to keep.
#[test]
fn the_anchor_is_strictly_before_the_prompt_end_and_not_kept_twice() {
    use super::anchor::anchor_of;
    let s = chain(1, 6);
    let slot = StateSlot(0);
    assert_eq!(anchor_of(Some(s[2]), &s, &[]), Some(s[2]));
    assert_eq!(anchor_of(None, &s, &[]), None);
    assert_eq!(
        anchor_of(Some(s[5]), &s, &[]),
        None,
        "the prompt end itself"
    );
    assert_eq!(
        anchor_of(Some(chain(2, 1)[0]), &s, &[]),
        None,
        "off the chain"
    );
    assert_eq!(
        anchor_of(Some(s[2]), &s, &[(s[2], slot)]),
        None,
        "kept already"
    );
    assert_eq!(anchor_of(Some(s[0]), &[], &[]), None);
}

/// The host tier's byte accounting adds up to what it wrote, and tells a record
/// restored from (then superseded) from one whose session never came back.
#[test]
fn host_usage_accounts_every_written_byte_by_fate() {
    let (mut c, mut m) = hybrid(16, 64);
    let s = session_one_resumes_once(&mut c, &mut m);
    push_out_and_return_rewritten(&mut c, &mut m, &s, |_| {});
    let u = c.host().usage();
    // Session 1: 8 blocks + 2 snapshots written, restored from, then superseded by
    // turn 4. Session 2: 12 blocks + 1 snapshot written when turn 4 pushed it out.
    assert_eq!(u.written.records, 2);
    assert_eq!(u.states_written, 3);
    assert_eq!(u.written.bytes, (8 + 2 + 12 + 1) * BB as u64);
    assert_eq!(u.superseded[0].records, 1);
    assert_eq!(u.superseded[0].bytes, 10 * BB as u64);
    assert_eq!(u.resident[2].records, 1, "session 2 never came back");
    let total: u64 = u.rows().iter().map(|(_, t)| t.bytes).sum();
    assert_eq!(total, u.written.bytes);
    assert_eq!(u.used().records, 1);
}

/// A record evicted for room before its session came back is counted so.
#[test]
fn host_usage_counts_an_evicted_record_that_never_returned() {
    let c = two_retentions_then_a_flood(1);
    let u = c.host().usage();
    assert_eq!(u.evicted[2].records, 1);
    assert_eq!(u.evicted[2].bytes, 5 * BB as u64);
    assert_eq!(u.resident[2].records, 1);
    assert_eq!(u.used().records, 0);
}

fn tail_cfg(device_blocks: usize, hold: bool) -> PolicyConfig {
    PolicyConfig {
        retention: false,
        hold_tail_blocks: hold,
        ..cfg(device_blocks, 0)
    }
}

/// Admit a prompt of `blocks` full blocks plus `extra` tokens, grow it by `output` tokens.
fn admit_grown(c: &mut RetentionCache, id: u64, hashes: &[BlockHash], extra: usize, output: usize) {
    let m = &mut MetadataOnly;
    let bs = c.config().block_size;
    c.admit(RequestId(id), hashes, None, 0, m).expect("admit");
    c.grow(RequestId(id), hashes.len() * bs + extra, 0, m)
        .expect("grow prompt");
    c.finish_prefill(RequestId(id), None, 0, m).expect("finish");
    c.grow(RequestId(id), hashes.len() * bs + extra + output, 0, m)
        .expect("grow output");
}

#[test]
fn a_running_requests_partial_and_output_blocks_take_room_as_in_vllm() {
    // x: 4 blocks, released. a: 2 full blocks + 5 tokens, then 20 output tokens — four
    // slots (57 tokens) held as vLLM holds them — while b (2 blocks) arrives: b's room comes from
    // x's tail. Without the tail a holds two slots and x keeps everything.
    for (hold, x_kept) in [(true, 2), (false, 4)] {
        let mut c = RetentionCache::try_new(tail_cfg(8, hold)).expect("cfg");
        let x = chain(1, 4);
        turn(&mut c, &mut VecMover::new(8, 0), 1, &x, None, 0);
        admit_grown(&mut c, 2, &chain(2, 2), 5, 20);
        assert_eq!(c.pool().empty_slots(), if hold { 0 } else { 2 });
        turn(&mut c, &mut VecMover::new(8, 0), 3, &chain(3, 2), None, 0);
        let back = c
            .admit(RequestId(4), &x, None, 0, &mut MetadataOnly)
            .expect("admit");
        assert_eq!(back.cached_blocks, x_kept, "hold_tail_blocks = {hold}");
        c.check().expect("invariants");
    }
}

#[test]
fn an_ended_requests_tail_blocks_are_evicted_before_its_prompt() {
    let mut c = RetentionCache::try_new(tail_cfg(6, true)).expect("cfg");
    let a = chain(1, 2);
    admit_grown(&mut c, 1, &a, 5, 20);
    c.release(RequestId(1)).expect("release");
    // Two dead blocks (never a prompt's hash) age in the queue ahead of a's prompt.
    assert_eq!(c.pool().evictable(), 4);
    c.check().expect("invariants");
    turn(&mut c, &mut VecMover::new(6, 0), 2, &chain(2, 4), None, 0);
    assert_eq!(c.pool().evicted(), 2);
    let back = c
        .admit(RequestId(3), &a, None, 0, &mut MetadataOnly)
        .expect("admit");
    assert_eq!(back.cached_blocks, 2);
}

#[test]
fn grow_is_a_no_op_when_off_and_refuses_an_unknown_request() {
    let mut c = RetentionCache::try_new(tail_cfg(4, false)).expect("cfg");
    let m = &mut MetadataOnly;
    c.admit(RequestId(1), &chain(1, 1), None, 0, m)
        .expect("admit");
    assert_eq!(c.grow(RequestId(1), 60, 0, m).expect("off"), 0);
    let mut on = RetentionCache::try_new(tail_cfg(4, true)).expect("cfg");
    assert!(matches!(
        on.grow(RequestId(9), 10, 0, m),
        Err(CacheError::Unknown(_))
    ));
    on.admit(RequestId(1), &chain(1, 1), None, 0, m)
        .expect("admit");
    // Four slots in all: the fifth block finds no room; what was taken stays held.
    assert!(matches!(
        on.grow(RequestId(1), 80, 0, m),
        Err(CacheError::OutOfBlocks { need: 5 })
    ));
    assert_eq!(on.pool().empty_slots(), 0);
    on.release(RequestId(1)).expect("release");
    on.check().expect("invariants");
    // Released before its prompt was computed: nothing was written, every slot empty.
    assert_eq!(on.pool().empty_slots(), 4);
}

#[test]
fn a_forgotten_retention_leaves_both_tiers_and_its_blocks_become_evictable() {
    let mut c = RetentionCache::try_new(cfg(16, 8)).expect("cfg");
    let mut m = VecMover::new(16, 0);
    let t1 = chain(1, 4);
    turn(&mut c, &mut m, 1, &t1, Some(marker(1, TurnKind::Tool)), 0);
    assert!(c.device_record(&key(1)).is_some());
    assert_eq!(c.pool().evictable(), 0);
    assert!(c.forget(&key(1)));
    c.check().expect("invariants");
    assert!(c.device_record(&key(1)).is_none() && c.host().record(&key(1)).is_none());
    assert_eq!(c.pool().evictable(), 4, "still cached, no longer pinned");
    assert_eq!(c.retained().count(), 0);
    assert!(!c.forget(&key(1)), "nothing left to forget");
    // A host-only record is forgotten too: another retention's pressure offloaded it.
    let mut c = RetentionCache::try_new(cfg(8, 16)).expect("cfg");
    let mut m = VecMover::new(8, 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 5),
        Some(marker(2, TurnKind::Tool)),
        10,
    );
    turn(
        &mut c,
        &mut m,
        3,
        &chain(3, 6),
        Some(marker(3, TurnKind::Tool)),
        20,
    );
    assert!(c.device_record(&key(2)).is_none(), "pressure offloaded it");
    assert!(c.host().record(&key(2)).is_some());
    assert!(c.forget(&key(2)));
    assert!(c.host().record(&key(2)).is_none());
    c.check().expect("invariants");
}

mod hybrid_room;

/// A home whose copy of a state landed on a cooler rank moves its own to the
/// host tier: the device blocks join the free queue, and the host record
/// serves the key's return (`turn` checks every served block's bytes).
#[test]
fn demote_moves_a_retention_to_the_host_and_the_return_restores_it() {
    let mut c = RetentionCache::try_new(cfg(16, 16)).expect("cfg");
    let mut m = VecMover::new(16, 0);
    let s1 = chain(1, 5);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::Tool)), 0);
    assert!(!c.demote(&key(9), 10, &mut m), "no such retention");
    assert!(c.demote(&key(1), 10, &mut m));
    c.check().expect("invariants");
    assert!(c.device_record(&key(1)).is_none());
    assert!(c.host().record(&key(1)).is_some());
    assert_eq!(c.stats().offloaded, 1);
    assert!(!c.demote(&key(1), 11, &mut m), "already on the host");
    // Another session takes the freed device room; the return restores.
    turn(&mut c, &mut m, 2, &chain(2, 14), None, 20);
    assert!(c.peek_prefix(&s1) < 5, "the device gave the blocks away");
    let a = session_one_returns(&mut c, &mut m, &s1, 3, TurnKind::User, 30);
    assert_eq!((a.cached_blocks, a.miss), (5, None));
    assert!(a.restored_blocks > 0);
}

/// Without a host tier, or once the retention expired, the state stays where
/// it is.
#[test]
fn demote_keeps_what_the_host_cannot_take_or_what_expired() {
    let mut c = RetentionCache::try_new(cfg(16, 0)).expect("cfg");
    let mut m = VecMover::new(16, 0);
    turn(
        &mut c,
        &mut m,
        1,
        &chain(1, 5),
        Some(marker(1, TurnKind::Tool)),
        0,
    );
    assert!(!c.demote(&key(1), 10, &mut m));
    assert!(c.device_record(&key(1)).is_some(), "no host tier: kept");
    let mut c = RetentionCache::try_new(cfg(16, 16)).expect("cfg");
    turn(
        &mut c,
        &mut m,
        1,
        &chain(1, 5),
        Some(marker(1, TurnKind::Tool)),
        0,
    );
    let expired = c.device_record(&key(1)).expect("held").meta.expires_ms;
    assert!(!c.demote(&key(1), expired, &mut m));
    assert!(c.host().record(&key(1)).is_none());
    c.check().expect("invariants");
}
