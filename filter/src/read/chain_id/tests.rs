use super::*;
use proptest::prelude::*;

const ENGINE: &[u8] = b"resp_0f3a9c2e5b7d4e1f8a6c3b2d9e0f1a2b";

#[test]
fn a_sealed_id_opens_to_its_session_and_engine_id() {
    let key = mac_key(Some(b"s3cret"));
    let session = 0x1234_5678_9abc_def0u64.to_le_bytes();
    let id = seal(&key, b"tenant-a", &session, ENGINE).expect("carried");
    assert!(id.starts_with(PREFIX));
    assert!(id.ends_with(ENGINE), "the engine id is readable at the end");
    assert!(id_safe(&id), "a client echoes it in a body or a URL");
    assert_eq!(
        open(&key, b"tenant-a", &id),
        Previous::Carried {
            session: session.to_vec(),
            engine: ENGINE
        }
    );
}

#[test]
fn another_tenant_another_secret_or_any_edit_is_forged() {
    let key = mac_key(Some(b"s3cret"));
    let id = seal(&key, b"tenant-a", b"session", ENGINE).expect("carried");
    assert_eq!(open(&key, b"tenant-b", &id), Previous::Forged);
    assert_eq!(
        open(&mac_key(Some(b"other")), b"tenant-a", &id),
        Previous::Forged
    );
    assert_eq!(open(&mac_key(None), b"tenant-a", &id), Previous::Forged);
    // Every single-byte change after the prefix is caught.
    for i in PREFIX.len()..id.len() {
        let mut bad = id.clone();
        if let Some(b) = bad.get_mut(i) {
            *b = if *b == b'a' { b'b' } else { b'a' };
        }
        assert_eq!(open(&key, b"tenant-a", &bad), Previous::Forged, "byte {i}");
    }
    // Malformed after the prefix: too short, not hex, length over the bound, no engine id.
    for bad in [
        b"resp_tt1".as_slice(),
        b"resp_tt1zz",
        b"resp_tt1ff00",
        b"resp_tt10100",
        b"resp_tt101000123456789abcdef0",
    ] {
        assert_eq!(open(&key, b"tenant-a", bad), Previous::Forged, "{bad:?}");
    }
    assert_eq!(open(&key, b"tenant-a", ENGINE), Previous::Plain);
}

#[test]
fn what_cannot_be_carried_is_not_sealed() {
    let key = mac_key(None);
    assert!(seal(&key, b"", &[7; MAX_SESSION], ENGINE).is_some());
    assert_eq!(seal(&key, b"", &[7; MAX_SESSION + 1], ENGINE), None);
    assert_eq!(
        seal(&key, b"", b"s", b"resp_\"x"),
        None,
        "needs a JSON escape"
    );
    assert_eq!(seal(&key, b"", b"s", b"resp/x"), None, "needs a URL escape");
    assert_eq!(seal(&key, b"", b"s", b""), None);
    assert_eq!(
        seal(&key, b"", b"s", &[b'a'; MAX_ID]),
        None,
        "over the id bound"
    );
}

proptest! {
    #[test]
    fn seal_then_open_round_trips(
        tenant in proptest::collection::vec(any::<u8>(), 0..40),
        session in proptest::collection::vec(any::<u8>(), 0..=MAX_SESSION),
        engine in "[A-Za-z0-9_.-]{1,64}",
    ) {
        let key = mac_key(Some(b"k"));
        let id = seal(&key, &tenant, &session, engine.as_bytes()).expect("carried");
        prop_assert_eq!(
            open(&key, &tenant, &id),
            Previous::Carried { session, engine: engine.as_bytes() }
        );
    }

    #[test]
    fn any_bytes_open_without_panic(id in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut with_prefix = PREFIX.to_vec();
        with_prefix.extend_from_slice(&id);
        let key = mac_key(None);
        let _ = open(&key, b"", &id);
        prop_assert_eq!(open(&key, b"", &with_prefix), Previous::Forged);
    }
}
