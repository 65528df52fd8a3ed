use super::*;
use tether_placement::Held;

fn resident(keys: &[(u64, u32)]) -> Resident {
    let held = keys.iter().map(|&(k, t)| {
        (
            k,
            Held {
                tokens: t,
                device: true,
            },
        )
    });
    Resident::from_entries(held, usize::MAX).0
}

#[test]
fn a_blob_round_trips_and_garbage_is_refused() {
    let r = resident(&[(3, 100), (1, 50), (u64::MAX, 7)]);
    let b = blob(&r);
    assert_eq!(b.len(), 3 * 25);
    assert_eq!(from_blob(&b), Some(r));
    assert_eq!(from_blob(&[]), Some(Resident::EMPTY));
    for bad in [&b[..b.len() - 1], &[b'z'; 25][..], &[0xff; 50][..]] {
        assert_eq!(from_blob(bad), None);
    }
    // Unsorted keys are refused as a rank's reply would be.
    let mut swapped = blob(&resident(&[(1, 1), (2, 1)]));
    swapped[..32].rotate_left(16);
    assert_eq!(from_blob(&swapped), None);
    assert_ne!(content_hash(&[]), 0);
}

#[test]
fn a_worker_rereads_a_blob_only_when_its_hash_changes() {
    let r = resident(&[(9, 300)]);
    let b = blob(&r);
    let h = content_hash(&b);
    let mut v = ResidencyView::new(2);
    let mut loads = 0;
    v.sync(0, h, 1000, || {
        loads += 1;
        Some(b.clone())
    });
    assert_eq!(
        v.knows(0, 9, 1000, 500),
        Knows::Holds(Held {
            tokens: 300,
            device: true
        })
    );
    assert_eq!(v.knows(0, 8, 1000, 500), Knows::Nothing);
    assert_eq!(v.knows(1, 9, 1000, 500), Knows::Unknown);
    // Same content, later time: only the time moves.
    v.sync(0, h, 1400, || {
        loads += 1;
        None
    });
    assert_eq!(loads, 1);
    assert_eq!(
        v.knows(0, 9, 1900, 500),
        Knows::Holds(Held {
            tokens: 300,
            device: true
        })
    );
    // Stale: unknown.
    assert_eq!(v.knows(0, 9, 1901, 500), Knows::Unknown);
    // A blob that does not hash as the index says (a torn write) forgets it.
    v.sync(0, h ^ 2, 2000, || Some(b.clone()));
    assert_eq!(v.knows(0, 9, 2000, 500), Knows::Unknown);
    // Hash 0: the endpoint's last summary was bad; unknown.
    v.record(1, h, 2000, r.clone());
    v.sync(1, 0, 2100, || Some(b.clone()));
    assert_eq!(v.knows(1, 9, 2100, 500), Knows::Unknown);
    // An endpoint outside the view is ignored.
    v.sync(7, h, 2000, || Some(b.clone()));
    v.record(7, h, 2000, r);
    assert_eq!(v.knows(7, 9, 2000, 500), Knows::Unknown);
}

#[test]
fn the_index_round_trips_and_another_configurations_is_ignored() {
    let mut v = ResidencyView::new(3);
    v.record(1, 77, 500, Resident::EMPTY);
    let idx = v.index();
    assert_eq!(parse_index(&idx, 3), Some(vec![(0, 0), (77, 500), (0, 0)]));
    assert_eq!(parse_index(&idx, 2), None);
    let set = set_index(Some(&idx), 3, 2, 5, 600);
    assert_eq!(
        parse_index(&set, 3),
        Some(vec![(0, 0), (77, 500), (5, 600)])
    );
    // An older report does not replace a newer one; a bad one (hash 0) always does.
    let older = set_index(Some(&set), 3, 2, 6, 100);
    assert_eq!(parse_index(&older, 3).unwrap()[2], (5, 600));
    let bad = set_index(Some(&set), 3, 2, 0, 100);
    assert_eq!(parse_index(&bad, 3).unwrap()[2], (0, 100));
    let fresh = set_index(Some(b"short"), 2, 0, 9, 1);
    assert_eq!(parse_index(&fresh, 2), Some(vec![(9, 1), (0, 0)]));
}
