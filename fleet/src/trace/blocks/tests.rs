use super::*;
use proptest::prelude::*;

fn naive_lcp(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn consecutive_turns_share_nodes() {
    let mut s = BlockStore::new();
    let t1: Vec<u64> = (0..14).collect();
    let t2: Vec<u64> = (0..13).chain([100, 101, 102]).collect();
    let t3: Vec<u64> = (0..13).chain([100, 101, 200]).collect();
    let (a, b, c) = (s.insert(&t1), s.insert(&t2), s.insert(&t3));
    assert_eq!(s.ids(a), t1);
    assert_eq!(s.ids(b), t2);
    assert_eq!(s.ids(c), t3);
    assert_eq!(s.common_prefix(a, b), 13);
    assert_eq!(s.common_prefix(b, c), 15);
    assert_eq!(s.runs(c), vec![(0, 13), (100, 2), (200, 1)]);
    // Root, [0..13), [13], [100,101], [102], [200].
    assert_eq!(s.node_count(), 6);
    assert_eq!(s.insert(&t2), b, "an equal sequence ends at the same node");
    let empty = s.insert(&[]);
    assert!(s.is_empty(empty));
}

#[test]
fn a_request_ending_inside_a_run_splits_it_without_moving_the_longer_one() {
    let mut s = BlockStore::new();
    let long = s.insert(&[7, 8, 9, 10]);
    let short = s.insert(&[7, 8]);
    assert_eq!(s.ids(long), vec![7, 8, 9, 10]);
    assert_eq!(s.ids(short), vec![7, 8]);
    assert_eq!(s.len(short), 2);
    assert_eq!(s.parent(long), short);
    assert_eq!(
        s.runs(long),
        vec![(7, 4)],
        "split nodes merge back into one run"
    );
}

proptest! {
    #[test]
    fn round_trip_and_prefixes(seqs in prop::collection::vec(
        prop::collection::vec(0u64..6, 0..12), 1..12)) {
        let mut s = BlockStore::new();
        let refs: Vec<BlockRef> = seqs.iter().map(|q| s.insert(q)).collect();
        for (q, r) in seqs.iter().zip(&refs) {
            prop_assert_eq!(&s.ids(*r), q);
            prop_assert_eq!(s.len(*r), q.len());
            let flat: Vec<u64> = s.runs(*r).iter()
                .flat_map(|&(f, n)| (0..u64::from(n)).map(move |t| f + t)).collect();
            prop_assert_eq!(&flat, q);
        }
        for (i, a) in seqs.iter().enumerate() {
            for (j, b) in seqs.iter().enumerate() {
                prop_assert_eq!(s.common_prefix(refs[i], refs[j]), naive_lcp(a, b));
            }
        }
    }
}
