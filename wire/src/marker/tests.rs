use super::*;
use proptest::prelude::*;

#[test]
fn parses_a_full_marker_case_insensitively() {
    let h = [
        ("X-Tether-Prompt-End", "1"),
        ("x-tether-turn-kind", "TOOL"),
        ("X-TETHER-TURN", "7"),
        ("x-tether-retention-ms", "45000"),
        ("x-tether-tenant", "ab"),
        ("x-tether-session", "00ff"),
        ("x-tether-subagent", "10"),
        ("content-type", "application/json"),
    ];
    let m = TurnMarker::from_headers(h)
        .expect("valid")
        .expect("present");
    assert!(m.prompt_end);
    assert_eq!(m.kind, TurnKind::Tool);
    assert_eq!(m.turn, Some(7));
    assert_eq!(m.retention_ms, Some(45_000));
    assert_eq!(
        m.key,
        RetentionKey {
            tenant: HexId(0xab),
            session: HexId(0xff),
            subagent: HexId(0x10)
        }
    );
}

#[test]
fn no_session_means_no_marker() {
    assert_eq!(
        TurnMarker::from_headers([("x-tether-prompt-end", "1")]),
        Ok(None)
    );
}

#[test]
fn bad_values_are_typed_errors() {
    let base = |k: &'static str, v: &'static str| {
        TurnMarker::from_headers([
            ("x-tether-session", "1"),
            ("x-tether-prompt-end", "1"),
            ("x-tether-turn-kind", "user"),
            (k, v),
        ])
    };
    assert!(matches!(
        base("x-tether-turn", "-3"),
        Err(MarkerError::BadValue { header: TURN, .. })
    ));
    assert!(matches!(
        base("x-tether-turn", "99999999999"),
        Err(MarkerError::BadValue { .. })
    ));
    assert!(matches!(
        base("x-tether-retention-ms", "1e3"),
        Err(MarkerError::BadValue { .. })
    ));
    assert!(matches!(
        base("x-tether-tenant", "xyz"),
        Err(MarkerError::BadValue { header: TENANT, .. })
    ));
    assert!(matches!(
        base("x-tether-turn-kind", "tool"),
        Err(MarkerError::Conflict(TURN_KIND))
    ));
    assert!(matches!(
        TurnMarker::from_headers([("x-tether-session", "1"), ("x-tether-prompt-end", "yes")]),
        Err(MarkerError::BadValue {
            header: PROMPT_END,
            ..
        })
    ));
    // The gateway's header path sends a prompt end without a kind: user-reply interval.
    let fast_path =
        TurnMarker::from_headers([("x-tether-session", "1"), ("x-tether-prompt-end", "1")])
            .expect("valid")
            .expect("a session");
    assert!(fast_path.prompt_end);
    assert_eq!(fast_path.kind, TurnKind::User);
}

#[test]
fn long_hashes_fold_and_short_ones_are_numbers() {
    let long = "a".repeat(64);
    let a = HexId::parse(SESSION, &long).expect("64 digits");
    let b = HexId::parse(SESSION, &long.to_uppercase()).expect("64 digits");
    assert_eq!(a, b);
    assert!(HexId::parse(SESSION, &"a".repeat(65)).is_err());
    assert_eq!(HexId::parse(SESSION, "FF").expect("hex"), HexId(255));
}

/// A valid value of marker header `i` (index into [`MARKERS`]), padded with whitespace.
fn valid_value(i: usize) -> BoxedStrategy<String> {
    let core = match i {
        0 => prop::sample::select(vec!["0", "1"])
            .prop_map(str::to_owned)
            .boxed(),
        1 => (prop::sample::select(TurnKind::ALL.to_vec()), any::<bool>())
            .prop_map(|(k, up)| {
                if up {
                    k.name().to_uppercase()
                } else {
                    k.name().to_owned()
                }
            })
            .boxed(),
        2 => any::<u32>().prop_map(|n| n.to_string()).boxed(),
        3 => any::<u64>().prop_map(|n| n.to_string()).boxed(),
        _ => "[0-9a-fA-F]{1,64}".boxed(),
    };
    let ws = || prop::sample::select(vec!["", " ", "\t"]);
    (ws(), core, ws())
        .prop_map(|(a, c, b)| format!("{a}{c}{b}"))
        .boxed()
}

/// Marker headers as a request might carry them: each present with a valid value
/// most of the time (so whole markers parse), sometimes with junk, in any name
/// case, sometimes one repeated (with its own value or another), in any order.
fn marker_headers() -> impl Strategy<Value = Vec<(String, String)>> {
    let one = |i: usize| {
        proptest::option::weighted(
            0.7,
            (
                any::<bool>(),
                prop_oneof![15 => valid_value(i), 1 => "\\PC{0,80}".boxed()],
            ),
        )
        .prop_map(move |v| {
            v.map(|(upper, value)| {
                let name = if upper {
                    MARKERS[i].to_uppercase()
                } else {
                    MARKERS[i].to_owned()
                };
                (name, value)
            })
        })
    };
    let each: Vec<_> = (0..MARKERS.len()).map(one).collect();
    (
        each,
        proptest::option::weighted(
            0.25,
            (any::<prop::sample::Index>(), any::<bool>(), valid_value(5)),
        ),
    )
        .prop_map(|(each, dup)| {
            let mut h: Vec<(String, String)> = each.into_iter().flatten().collect();
            if let (Some((at, same, other)), false) = (dup, h.is_empty()) {
                let (name, value) = h[at.index(h.len())].clone();
                h.push((
                    format!(" {name}"),
                    if same { format!("{value} ") } else { other },
                ));
            }
            h
        })
        .prop_shuffle()
}

/// A marker's fields as the oracle sees them: prompt end, kind, turn, retention,
/// and the tenant/session/subagent ids (`u128::MAX` = a folded long hash).
type Fields = (bool, TurnKind, Option<u32>, Option<u64>, [Option<u128>; 3]);

/// The outcome the header grammar in `docs/wire.md` prescribes, computed
/// independently of the parser: first conflict in header order, then no session,
/// then the first bad value in field order, else the marker.
fn expected(h: &[(String, String)]) -> Result<Option<Fields>, MarkerError> {
    let mut vals: [Option<&str>; 7] = [None; 7];
    for (name, value) in h {
        let i = MARKERS
            .iter()
            .position(|m| m.eq_ignore_ascii_case(name.trim()))
            .expect("a marker name");
        match vals[i] {
            Some(prev) if prev.trim() != value.trim() => {
                return Err(MarkerError::Conflict(MARKERS[i]));
            }
            _ => vals[i] = Some(value),
        }
    }
    if vals[5].is_none() {
        return Ok(None);
    }
    let bad = |i: usize| MarkerError::BadValue {
        header: MARKERS[i],
        value: vals[i]
            .unwrap_or_default()
            .trim()
            .chars()
            .take(80)
            .collect(),
    };
    let prompt_end = match vals[0].map(str::trim) {
        None | Some("0") => false,
        Some("1") => true,
        Some(_) => return Err(bad(0)),
    };
    let kind = match vals[1] {
        None => TurnKind::User,
        Some(v) => *TurnKind::ALL
            .iter()
            .find(|k| k.name() == v.trim().to_ascii_lowercase())
            .ok_or_else(|| bad(1))?,
    };
    let turn = vals[2]
        .map(|v| v.trim().parse::<u32>().map_err(|_| bad(2)))
        .transpose()?;
    let retention = vals[3]
        .map(|v| v.trim().parse::<u64>().map_err(|_| bad(3)))
        .transpose()?;
    let mut ids = [None; 3];
    for (slot, i) in ids.iter_mut().zip(4..7) {
        if let Some(v) = vals[i].map(str::trim) {
            if v.is_empty() || v.len() > 64 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(i));
            }
            // Short ids are their number; long ones fold to some id (checked for case below).
            *slot = Some(if v.len() <= 32 {
                u128::from_str_radix(v, 16).expect("hex")
            } else {
                u128::MAX
            });
        }
    }
    Ok(Some((prompt_end, kind, turn, retention, ids)))
}

proptest! {
    /// Arbitrary and valid marker headers alike: never a panic, and exactly the
    /// outcome the grammar prescribes (marker fields, `None`, or the typed error
    /// naming the header).
    #[test]
    fn marker_headers_parse_to_the_prescribed_outcome(h in marker_headers()) {
        let got = TurnMarker::from_headers(h.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        match (got, expected(&h)) {
            (Ok(Some(m)), Ok(Some((prompt_end, kind, turn, retention, ids)))) => {
                prop_assert_eq!((m.prompt_end, m.kind, m.turn, m.retention_ms), (prompt_end, kind, turn, retention));
                let key = [m.key.tenant, m.key.session, m.key.subagent];
                for ((got, want), i) in key.iter().zip(ids).zip(4..7) {
                    match want {
                        None => prop_assert_eq!(got.0, 0, "absent {} is zero", MARKERS[i]),
                        Some(u128::MAX) => {
                            let v = h.iter().rev().find(|(n, _)| n.trim().eq_ignore_ascii_case(MARKERS[i])).map(|(_, v)| v.trim()).unwrap_or_default();
                            prop_assert_eq!(HexId::parse(MARKERS[i], &v.to_ascii_uppercase()), Ok(*got));
                        }
                        Some(n) => prop_assert_eq!(got.0, n, "{}", MARKERS[i]),
                    }
                }
            }
            (got, want) => {
                // Error text is not API: compare the outcome and the header it names.
                let outcome = |r: Result<Option<()>, MarkerError>| match r {
                    Ok(m) => Ok(m),
                    Err(MarkerError::BadValue { header, .. }) => Err(("bad", header)),
                    Err(MarkerError::Conflict(header)) => Err(("conflict", header)),
                };
                let got = outcome(got.map(|m| m.map(|_| ())));
                let want = outcome(want.map(|m| m.map(|_| ())));
                prop_assert_eq!(got, want, "{:?}", h);
            }
        }
    }

    /// Names outside the marker set are ignored, however they look.
    #[test]
    fn other_headers_are_ignored(h in marker_headers(), noise in proptest::collection::vec(("[a-z-]{1,20}", "\\PC{0,40}"), 0..6)) {
        let noise: Vec<(String, String)> = noise.into_iter().filter(|(n, _)| !MARKERS.contains(&n.as_str())).collect();
        let with_noise: Vec<(&str, &str)> = noise.iter().chain(&h).map(|(a, b)| (a.as_str(), b.as_str())).collect();
        prop_assert_eq!(
            TurnMarker::from_headers(with_noise),
            TurnMarker::from_headers(h.iter().map(|(a, b)| (a.as_str(), b.as_str())))
        );
    }
}

/// The generator above reaches every outcome often: most cases are whole
/// markers (the success path), and bad values, conflicts and "no session" all occur.
#[test]
fn the_marker_generator_reaches_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = marker_headers();
    let (mut ok, mut none, mut bad, mut conflict) = (0, 0, 0, 0);
    for _ in 0..1000 {
        let h = strategy.new_tree(&mut runner).expect("a value").current();
        match TurnMarker::from_headers(h.iter().map(|(a, b)| (a.as_str(), b.as_str()))) {
            Ok(Some(_)) => ok += 1,
            Ok(None) => none += 1,
            Err(MarkerError::BadValue { .. }) => bad += 1,
            Err(MarkerError::Conflict(_)) => conflict += 1,
        }
    }
    assert!(
        ok >= 300,
        "ok {ok} none {none} bad {bad} conflict {conflict}"
    );
    assert!(
        none >= 50 && bad >= 50 && conflict >= 50,
        "ok {ok} none {none} bad {bad} conflict {conflict}"
    );
}

#[test]
fn body_fields_read_like_headers() {
    let m = TurnMarker::from_fields([
        ("session", "ff"),
        ("prompt_end", "1"),
        ("turn_kind", "handoff"),
        ("retention_ms", "9"),
        ("unknown", "x"),
    ])
    .expect("valid")
    .expect("present");
    assert_eq!(m.key.session, HexId(0xff));
    assert_eq!((m.kind, m.retention_ms), (TurnKind::Handoff, Some(9)));
    assert!(matches!(
        TurnMarker::from_fields([("session", "zz")]),
        Err(MarkerError::BadValue {
            header: SESSION,
            ..
        })
    ));
}

/// Hashes longer than 32 digits fold with FNV-1a-128 over their lower-case digits
/// (value computed outside this crate), and errors name the header in their text.
#[test]
fn long_hashes_fold_with_fnv1a_and_errors_read_as_sentences() {
    let v = format!("{}A", "0123456789ABCDEF".repeat(2));
    assert_eq!(
        HexId::parse(SESSION, &v),
        Ok(HexId(0xe405_f0a9_c990_ea81_b67a_572d_f2f1_21c4))
    );
    let e = HexId::parse(SESSION, "xyz").expect_err("not hex");
    assert_eq!(
        e.to_string(),
        "header x-tether-session has a bad value \"xyz\""
    );
    assert_eq!(
        MarkerError::Conflict(TURN).to_string(),
        "header x-tether-turn is repeated with different values"
    );
}

/// The retention table per kind, read and written by kind; kinds print as their wire names.
#[test]
fn retention_table_and_kind_names_by_kind() {
    use crate::RetentionMs;
    let mut r = RetentionMs::DEFAULT;
    let want = [
        (TurnKind::First, 300_000),
        (TurnKind::User, 300_000),
        (TurnKind::Tool, 120_000),
        (TurnKind::Handoff, 300_000),
    ];
    for (k, ms) in want {
        assert_eq!(r.get(k), ms, "{k}");
    }
    for (i, k) in TurnKind::ALL.into_iter().enumerate() {
        *r.get_mut(k) = 7 + i as u64;
    }
    assert_eq!((r.first, r.user, r.tool, r.handoff), (7, 8, 9, 10));
    assert_eq!(
        TurnKind::ALL.map(|k| k.to_string()),
        ["first", "user", "tool", "handoff"].map(String::from)
    );
}
