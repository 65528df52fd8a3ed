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

proptest! {
    #[test]
    fn arbitrary_headers_never_panic(h in proptest::collection::vec(("(?i)x-tether-(prompt-end|turn-kind|turn|retention-ms|tenant|session|subagent)", "\\PC{0,80}"), 0..8)) {
        let _ = TurnMarker::from_headers(h.iter().map(|(a, b)| (a.as_str(), b.as_str())));
    }
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
