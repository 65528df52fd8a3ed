//! Hybrid retention (issue 28 part 2): where a retention's snapshot goes when returns
//! rewrite the prompt's tail, which unpinned snapshots go before a retention, and a
//! restored snapshot that finds no room.

use super::*;
use crate::rewrite::MIN_SAMPLES;

/// Session `s`'s two turns: a 6-block prompt, then one that keeps its first 4 blocks
/// (the last 2 rewritten) and adds 3. Returns the second turn's admission.
fn rewritten_pair(c: &mut RetentionCache, m: &mut VecMover, s: u32, now: Millis) -> Admission {
    let first = chain(s, 6);
    turn(
        c,
        m,
        u64::from(s) * 2,
        &first,
        Some(marker(u128::from(s), TurnKind::Tool)),
        now,
    );
    let mut next = first[..4].to_vec();
    next.extend(chain(s + 1000, 3));
    turn(
        c,
        m,
        u64::from(s) * 2 + 1,
        &next,
        Some(marker(u128::from(s), TurnKind::Tool)),
        now + 1,
    )
}

/// Returns that rewrite the last two blocks of the previous prompt leave its prompt-end
/// snapshot off their chain. Once the rank has seen enough of them, a retention puts its
/// snapshot two blocks before the prompt end, and the next such return resumes there
/// instead of recomputing everything; the prompt end's own snapshot is still cached
/// (unpinned), so an unchanged resend resumes at its end.
#[test]
fn a_retention_snapshots_below_the_tail_returns_are_seen_to_rewrite() {
    let (mut c, mut m) = hybrid(64, 0);
    for s in 1..=MIN_SAMPLES as u32 {
        let a = rewritten_pair(&mut c, &mut m, s, u64::from(s) * 10);
        assert_eq!(
            a.cached_blocks, 0,
            "the prompt end is off the rewritten chain"
        );
    }
    let a = rewritten_pair(&mut c, &mut m, 50, 1_000);
    assert_eq!(a.cached_blocks, 4, "resumed below the rewritten tail");
    let s = a.state.expect("a state to resume from");
    assert_eq!(
        m.states[s.0 as usize],
        VecMover::state_content(chain(50, 6)[3])
    );
    // An unchanged resend of a first prompt still resumes at its end.
    let first = chain(60, 6);
    turn(
        &mut c,
        &mut m,
        120,
        &first,
        Some(marker(60, TurnKind::Tool)),
        2_000,
    );
    let rec = c.device_record(&key(60)).expect("retained");
    assert_eq!(rec.hashes.len(), 4, "the retention ends at its snapshot");
    let a = turn(&mut c, &mut m, 121, &first, None, 2_001);
    assert_eq!(a.cached_blocks, 6);
}

/// A head snapshot many sessions resume from stays cached (unpinned) inside the
/// retained chains through it. When nothing is free any more, the least recently used
/// retention yields before it — as in plain LRU, where a snapshot lives as long as its
/// boundary block — rather than the snapshot going first because its block is pinned.
#[test]
fn a_snapshot_inside_retained_chains_outlives_a_colder_retention() {
    let (mut c, mut m) = hybrid(12, 0);
    let head = chain(1, 2);
    // The head's snapshot, cached unpinned by a request without a marker.
    turn(&mut c, &mut m, 1, &head, None, 0);
    // Session 2 (4 blocks through the head), then session 3 (3 blocks), each resuming
    // from the head's snapshot; session 3 uses it last.
    let mut s2 = head.clone();
    s2.extend(chain(2, 2));
    assert_eq!(
        turn(&mut c, &mut m, 2, &s2, Some(marker(2, TurnKind::Tool)), 1).cached_blocks,
        2
    );
    let mut s3 = head.clone();
    s3.extend(chain(3, 1));
    assert_eq!(
        turn(&mut c, &mut m, 3, &s3, Some(marker(3, TurnKind::Tool)), 2).cached_blocks,
        2
    );
    // 5 blocks + 3 snapshots held, every block retained: nothing in the free queue.
    // A running request needing 5 slots takes the 4 empty ones and one more.
    let other = chain(9, 5);
    c.admit(RequestId(9), &other, None, 3, &mut m)
        .expect("admit");
    assert!(
        c.device_record(&key(2)).is_none(),
        "the colder retention yielded"
    );
    assert!(c.device_record(&key(3)).is_some());
    assert!(
        c.states().get(head[1]).is_some(),
        "the head's snapshot stays"
    );
    c.check().expect("invariants");
}

/// Session 1 on the host tier, and a running request holding 7 of the 12 slots.
fn session_one_on_the_host_beside_a_running_request() -> (RetentionCache, VecMover, Vec<BlockHash>)
{
    let (mut c, mut m) = hybrid(12, 64);
    let s1 = chain(1, 4);
    turn(&mut c, &mut m, 1, &s1, Some(marker(1, TurnKind::Tool)), 0);
    turn(
        &mut c,
        &mut m,
        2,
        &chain(2, 10),
        Some(marker(2, TurnKind::Tool)),
        1,
    );
    assert!(c.host().record(&key(1)).is_some(), "session 1 offloaded");
    c.admit(RequestId(3), &chain(3, 7), None, 2, &mut m)
        .expect("admit");
    (c, m, s1)
}

/// A return whose restored snapshot finds no room beside its blocks (5 slots left for 5
/// blocks and a snapshot) waits, as vLLM waits for a hybrid request's state pages,
/// instead of being admitted with the restored prefix unusable; once the running request
/// ends it resumes at its prompt end from the host.
#[test]
fn a_restore_whose_snapshot_finds_no_room_waits_instead_of_recomputing() {
    let (mut c, mut m, s1) = session_one_on_the_host_beside_a_running_request();
    let mut next = s1.clone();
    next.extend(chain(7, 1));
    let r = c.admit(RequestId(4), &next, Some(key(1)), 3, &mut m);
    assert!(matches!(r, Err(CacheError::OutOfBlocks { .. })), "{r:?}");
    c.check().expect("nothing leaked by the refused admission");
    c.release(RequestId(3)).expect("release");
    let a = turn(&mut c, &mut m, 4, &next, Some(marker(1, TurnKind::Tool)), 4);
    assert_eq!(a.cached_blocks, 4);
    assert!(a.state_restored);
    assert!(a.miss.is_none());
}

/// A failed block copy after the snapshot's room was taken gives that room back: the
/// never-written snapshot is not left cached.
#[test]
fn a_failed_restore_gives_back_the_snapshot_room_it_took() {
    let (mut c, mut m, s1) = session_one_on_the_host_beside_a_running_request();
    c.release(RequestId(3)).expect("release");
    m.fail_scatter = true;
    let a = c
        .admit(RequestId(4), &s1, Some(key(1)), 3, &mut m)
        .expect("admit");
    assert!(a.miss.is_some());
    assert_eq!(a.cached_blocks, 0);
    assert!(
        c.states().get(s1[3]).is_none(),
        "no unwritten snapshot cached"
    );
    c.release(RequestId(4)).expect("release");
    c.check().expect("invariants");
}
