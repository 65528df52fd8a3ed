use super::*;

#[test]
fn round_trips_through_the_pair_format() {
    let map = HeaderMap::from_pairs([(":path", "/v1"), ("X-A", "1"), ("x-a", "2"), ("empty", "")]);
    let wire = map.serialize();
    assert_eq!(&wire[..4], &4u32.to_le_bytes());
    assert_eq!(HeaderMap::deserialize(&wire).unwrap(), map);
    assert_eq!(map.get(b"X-a"), Some(&b"1"[..]));
}

#[test]
fn matches_the_sdk_layout_byte_for_byte() {
    let wire = HeaderMap::from_pairs([("ab", "c")]).serialize();
    assert_eq!(
        wire,
        [1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, b'a', b'b', 0, b'c', 0]
    );
}

#[test]
fn rejects_malformed_input_without_panicking() {
    assert!(decode_pairs(&[1, 0, 0]).is_err());
    assert!(decode_pairs(&[255, 255, 255, 255]).is_err());
    // Claims a 5-byte key in a 1-byte remainder.
    assert!(decode_pairs(&[1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, b'a']).is_err());
    // Missing NUL terminator.
    assert!(decode_pairs(&[1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, b'a', b'x', 0]).is_err());
    assert_eq!(decode_pairs(&[]).unwrap(), vec![]);
}

#[test]
fn replace_keeps_position_and_drops_repeats() {
    let mut map = HeaderMap::from_pairs([("a", "1"), ("b", "2"), ("a", "3")]);
    map.replace(b"A", b"9");
    let got: Vec<_> = map
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_vec()))
        .collect();
    assert_eq!(
        got,
        vec![("a".into(), b"9".to_vec()), ("b".into(), b"2".to_vec())]
    );
    map.remove(b"a");
    assert_eq!(map.len(), 1);
    map.replace(b"c", b"4");
    assert_eq!(map.get(b"c"), Some(&b"4"[..]));
}
