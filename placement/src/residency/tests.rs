use super::*;

fn h(tokens: u32, device: bool) -> Held {
    Held { tokens, device }
}

#[test]
fn a_summary_round_trips_sorted_and_keeps_the_largest_of_duplicates() {
    let (r, omitted) = Resident::from_entries(
        [
            (9, h(100, true)),
            (3, h(7, false)),
            (9, h(500, true)),
            (u64::MAX, h(1, true)),
        ],
        10,
    );
    assert_eq!(omitted, 0);
    let s = r.encode(0);
    assert_eq!(s.keys.len(), 3 * 16);
    assert_eq!(&s.keys[..16], "0000000000000003");
    let back = Resident::decode(&s).unwrap();
    assert_eq!(back, r);
    assert_eq!(back.get(9), Some(h(500, true)));
    assert_eq!(back.get(3), Some(h(7, false)));
    assert_eq!(back.get(4), None);
    assert_eq!(back.tokens(), 508);
}

#[test]
fn over_the_limit_the_smallest_states_are_left_out_and_counted() {
    let (r, omitted) = Resident::from_entries((0..10u64).map(|k| (k, h(k as u32 * 10, true))), 4);
    assert_eq!(omitted, 6);
    assert_eq!(r.iter().map(|e| e.0).collect::<Vec<_>>(), vec![6, 7, 8, 9]);
}

#[test]
fn malformed_summaries_are_refused_never_a_panic() {
    let good = Resident::from_entries([(1, h(5, true)), (2, h(6, false))], 10)
        .0
        .encode(0);
    let mut v = good.clone();
    v.version = 2;
    assert_eq!(Resident::decode(&v), Err(BadSummary::Version(2)));
    let mut v = good.clone();
    v.tokens.pop();
    assert_eq!(Resident::decode(&v), Err(BadSummary::Shape));
    let mut v = good.clone();
    v.keys.replace_range(0..1, "g");
    assert_eq!(Resident::decode(&v), Err(BadSummary::Shape));
    let mut v = good.clone();
    v.keys.replace_range(0..1, "é");
    assert!(Resident::decode(&v).is_err());
    let mut v = good.clone();
    v.keys = format!("{}{}", &good.keys[16..], &good.keys[..16]);
    assert_eq!(Resident::decode(&v), Err(BadSummary::Unsorted));
    let v = Summary {
        version: VERSION,
        keys: "0".repeat(16 * (MAX_ENTRIES + 1)),
        tokens: "0".repeat(8 * (MAX_ENTRIES + 1)),
        tiers: "1".repeat(MAX_ENTRIES + 1),
        omitted: 0,
    };
    assert_eq!(
        Resident::decode(&v),
        Err(BadSummary::TooMany(MAX_ENTRIES + 1))
    );
    assert_eq!(
        Resident::decode(&Summary {
            version: VERSION,
            ..Summary::default()
        }),
        Ok(Resident::EMPTY)
    );
}

#[test]
fn the_resident_key_depends_on_every_part() {
    let k = resident_key(1, 2, 0);
    assert_ne!(k, resident_key(1, 2, 3));
    assert_ne!(k, resident_key(2, 2, 0));
    assert_ne!(k, resident_key(1, 3, 0));
    assert_eq!(k, resident_key(1, 2, 0));
}

proptest::proptest! {
    #[test]
    fn any_strings_decode_or_refuse(keys in ".{0,64}", tokens in ".{0,40}", tiers in ".{0,5}") {
        let _ = Resident::decode(&Summary { version: VERSION, keys, tokens, tiers, omitted: 0 });
    }
}
