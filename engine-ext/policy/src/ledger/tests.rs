use super::*;
use crate::marker::{HexId, TurnKind};

fn key(s: u128) -> RetentionKey {
    RetentionKey {
        tenant: HexId(0),
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

fn hashes(session: u128, n: usize) -> Vec<BlockHash> {
    (0..n)
        .map(|i| BlockHash(session << 32 | i as u128))
        .collect()
}

fn ledger(host_blocks: u64) -> Ledger {
    Ledger::try_new(PolicyConfig {
        block_bytes: 100,
        host_bytes: host_blocks * 100,
        device_blocks: 64,
        ..PolicyConfig::default()
    })
    .expect("valid config")
}

#[test]
fn a_prompt_end_holds_its_blocks_and_writes_the_missing_ones_through() {
    let mut l = ledger(100);
    let h = hashes(1, 4);
    let plan = l.retain(&marker(1, TurnKind::Tool), &h, &[10, 11, 12, 13], 0);
    assert_eq!(plan.hold, vec![10, 11, 12, 13]);
    assert!(plan.release.is_empty());
    assert_eq!(plan.store, vec![0, 1, 2, 3]);
    assert!(plan.on_host);
    // The next turn extends the chain: only the two new blocks are copied, and the
    // superseded retention's ids are released after the new ones are held.
    let mut h2 = h.clone();
    h2.extend(hashes(9, 2));
    let plan = l.retain(
        &marker(1, TurnKind::User),
        &h2,
        &[10, 11, 12, 13, 20, 21],
        5,
    );
    assert_eq!(plan.release, vec![10, 11, 12, 13]);
    assert_eq!(plan.store, vec![4, 5]);
    assert_eq!(l.held_blocks(), 6);
    assert_eq!(l.host_prefix(&h2), 6);
    assert_eq!(l.stats().superseded, 2, "device and host record superseded");
    assert!(
        l.take_freed().is_empty(),
        "shared prefix payloads were never freed"
    );
    l.check().expect("consistent");
}

#[test]
fn pressure_releases_expired_then_least_recently_used_never_the_spare() {
    let mut l = ledger(100);
    l.retain(&marker(1, TurnKind::Tool), &hashes(1, 2), &[1, 2], 0); // expires at 120 s
    l.retain(&marker(2, TurnKind::User), &hashes(2, 2), &[3, 4], 10);
    l.retain(&marker(3, TurnKind::User), &hashes(3, 2), &[5, 6], 20);
    l.touch(&key(2), 30_000); // session 2 returned: most recently used now
    // At 130 s session 1 has expired: it goes first even though 3 is older than 2.
    assert_eq!(l.yield_blocks(1, 130_000, None), vec![1, 2]);
    // Then least recently used (3), never the spare (2).
    assert_eq!(l.yield_blocks(1, 130_000, Some(key(2))), vec![5, 6]);
    assert!(l.yield_blocks(1, 130_000, Some(key(2))).is_empty());
    let s = l.stats();
    assert_eq!((s.expired, s.yielded_to_host, s.dropped), (1, 1, 0));
    // Every yielded turn is still on the host tier.
    assert_eq!(l.host_prefix(&hashes(1, 2)), 2);
    assert_eq!(l.host_prefix(&hashes(3, 2)), 2);
    l.check().expect("consistent");
}

#[test]
fn expiry_releases_device_holds_but_keeps_host_copies() {
    let mut l = ledger(100);
    l.retain(&marker(1, TurnKind::Tool), &hashes(1, 3), &[7, 8, 9], 0);
    assert!(l.release_expired(119_999).is_empty());
    assert_eq!(l.release_expired(120_000), vec![7, 8, 9]);
    assert_eq!(l.device_records(), 0);
    assert_eq!(l.host_prefix(&hashes(1, 3)), 3);
    l.check().expect("consistent");
}

#[test]
fn a_full_host_tier_evicts_older_records_and_reports_their_payloads() {
    let mut l = ledger(4);
    l.retain(&marker(1, TurnKind::User), &hashes(1, 3), &[1, 2, 3], 0);
    let plan = l.retain(&marker(2, TurnKind::User), &hashes(2, 3), &[4, 5, 6], 10);
    assert!(plan.on_host, "the older record made room");
    let mut freed = l.take_freed();
    freed.sort();
    assert_eq!(freed, hashes(1, 3));
    assert_eq!(l.host_prefix(&hashes(1, 3)), 0);
    // A record bigger than the whole tier stays device-only; pressure then drops it.
    let plan = l.retain(
        &marker(3, TurnKind::User),
        &hashes(3, 5),
        &[7, 8, 9, 10, 11],
        20,
    );
    assert!(!plan.on_host && plan.store.is_empty());
    // Least recently used first: session 1 (its host copy evicted), then session 3.
    assert_eq!(
        l.yield_blocks(5, 30, Some(key(2))),
        vec![1, 2, 3, 7, 8, 9, 10, 11]
    );
    assert_eq!(l.stats().dropped, 2);
    l.check().expect("consistent");
}

#[test]
fn a_corrupt_payload_is_forgotten_with_the_records_that_need_it() {
    let mut l = ledger(100);
    let h = hashes(1, 3);
    l.retain(&marker(1, TurnKind::User), &h, &[1, 2, 3], 0);
    l.host_payload_lost(h[1]);
    assert_eq!(l.host_prefix(&h), 0);
    let mut freed = l.take_freed();
    freed.sort();
    assert_eq!(freed, h, "the record went, so all its payloads were freed");
    l.check().expect("consistent");
}

#[test]
fn non_prompt_ends_and_mismatched_lists_change_nothing() {
    let mut l = ledger(100);
    let mut m = marker(1, TurnKind::User);
    m.prompt_end = false;
    assert_eq!(
        l.retain(&m, &hashes(1, 2), &[1, 2], 0),
        RetainPlan::default()
    );
    assert_eq!(
        l.retain(&marker(1, TurnKind::User), &hashes(1, 2), &[1], 0),
        RetainPlan::default()
    );
    assert_eq!(l.device_records(), 0);
    l.check().expect("consistent");
}

#[test]
fn resident_lists_each_key_once_with_its_tier() {
    let mut l = ledger(4);
    l.retain(&marker(1, TurnKind::Tool), &hashes(1, 2), &[1, 2], 0);
    l.retain(&marker(2, TurnKind::User), &hashes(2, 2), &[3, 4], 10);
    let tiers = |l: &Ledger| {
        let mut v: Vec<(u128, u64, bool)> =
            l.resident().map(|(k, t, d)| (k.session.0, t, d)).collect();
        v.sort();
        v
    };
    let bs = l.config().block_size as u64;
    assert_eq!(tiers(&l), vec![(1, 2 * bs, true), (2, 2 * bs, true)]);
    // Session 1 yields to the host tier; then a third turn evicts it from the host.
    l.yield_blocks(1, 20, Some(key(2)));
    assert_eq!(tiers(&l), vec![(1, 2 * bs, false), (2, 2 * bs, true)]);
    l.retain(&marker(3, TurnKind::User), &hashes(3, 2), &[5, 6], 30);
    assert_eq!(
        tiers(&l),
        vec![(2, 2 * bs, true), (3, 2 * bs, true)],
        "session 1 left the host tier to make room"
    );
}
