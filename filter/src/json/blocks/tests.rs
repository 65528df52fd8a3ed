use super::*;
use proptest::prelude::*;

/// Escaped bytes the slow way: walk the bytes, a backslash escapes the next one.
fn escaped_scalar(bytes: &[u8]) -> Vec<bool> {
    let mut out = vec![false; bytes.len()];
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if let Some(e) = out.get_mut(i + 1) {
                *e = true;
            }
            i += 2;
        } else {
            i += 1;
        }
    }
    out
}

fn bytes_with_runs() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            4 => Just(b'\\'),
            2 => Just(b'"'),
            1 => Just(b'{'), 1 => Just(b'}'), 1 => Just(b'['), 1 => Just(b']'),
            3 => any::<u8>(),
        ],
        0..400,
    )
}

#[test]
fn every_byte_value_is_classified_like_the_reference() {
    for start in (0..256).step_by(64) {
        let block: [u8; BLOCK] = std::array::from_fn(|k| (start + k) as u8);
        assert_eq!(classify(&block), classify_scalar(&block));
        for lane in block.chunks_exact(LANE) {
            let lane: &[u8; LANE] = lane.try_into().unwrap();
            assert_eq!(classify_lane(lane), classify_lane_scalar(lane));
        }
    }
}

proptest! {
    #[test]
    fn classification_matches_the_reference(bytes in proptest::collection::vec(any::<u8>(), BLOCK)) {
        let block: [u8; BLOCK] = bytes.try_into().unwrap();
        let m = classify(&block);
        prop_assert_eq!(m, classify_scalar(&block));
        let lane: &[u8; LANE] = block[..LANE].try_into().unwrap();
        let (q, b) = classify_lane(lane);
        prop_assert_eq!((q, b), (m.quote & 0xffff, m.backslash & 0xffff));
    }

    #[test]
    fn escapes_carry_across_blocks(bytes in bytes_with_runs()) {
        let want = escaped_scalar(&bytes);
        let mut esc = Escapes::default();
        let mut got = Vec::new();
        for start in (0..bytes.len().max(1)).step_by(BLOCK) {
            let (block, n) = load(&bytes, start);
            let e = esc.next(classify_scalar(&block).backslash & first(n));
            got.extend((0..n).map(|k| e >> k & 1 == 1));
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn escapes_carry_across_lanes(bytes in bytes_with_runs()) {
        let want = escaped_scalar(&bytes);
        let mut esc = Escapes::default();
        let mut got = Vec::new();
        for start in (0..bytes.len().max(1)).step_by(LANE) {
            let (_, b, n) = classify_lane_at(&bytes, start);
            let e = esc.next_of::<16>(b & first(n));
            got.extend((0..n).map(|k| e >> k & 1 == 1));
        }
        prop_assert_eq!(got, want);
    }

    #[test]
    fn prefix_xor_is_a_running_parity(x in any::<u64>()) {
        let mut parity = false;
        for k in 0..64 {
            parity ^= x >> k & 1 == 1;
            prop_assert_eq!(prefix_xor(x) >> k & 1 == 1, parity);
        }
    }

    #[test]
    fn load_pads_with_spaces(bytes in proptest::collection::vec(any::<u8>(), 0..200), start in 0usize..250) {
        let (block, n) = load(&bytes, start);
        let real = bytes.get(start..).unwrap_or_default();
        prop_assert_eq!(n, real.len().min(BLOCK));
        prop_assert_eq!(&block[..n], &real[..n]);
        prop_assert!(block[n..].iter().all(|&b| b == b' '));
    }
}
