use super::*;
use crate::testkit::{ALL_APIS, ALL_ORDERS, Convo, SliceFetch, Step};
use proptest::prelude::*;
use serde_json::{Map, Value as J, json};

/// Random JSON values: strings with escapes, unicode and quotes, nested containers.
fn arb_json() -> impl Strategy<Value = J> {
    let leaf = prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1_000_000i32..1_000_000).prop_map(|f| json!(f64::from(f) / 8.0)),
        "(\\PC|[\"\\\\/\\n\\t\\u{1}])*".prop_map(J::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(J::Array),
            prop::collection::vec(("[a-z_\"\\\\]{0,8}", inner), 0..8)
                .prop_map(|kv| J::Object(kv.into_iter().collect())),
        ]
    })
}

fn arb_object() -> impl Strategy<Value = Map<String, J>> {
    prop::collection::vec(("[a-z_]{1,10}", arb_json()), 0..10)
        .prop_map(|kv| kv.into_iter().collect())
}

fn members_of(doc: &Doc, view: &View) -> Vec<(String, J)> {
    doc.members
        .iter()
        .map(|m| {
            let k = json::unescape(view.bytes(m.key).unwrap_or_default())
                .unwrap_or_default()
                .into_owned();
            let v: J = serde_json::from_slice(view.bytes(m.value).unwrap_or_default())
                .unwrap_or(J::from("<bad>"));
            (k, v)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The full scan finds exactly serde_json's top-level members, compact or pretty.
    #[test]
    fn full_scan_matches_serde(obj in arb_object(), pretty in any::<bool>()) {
        let v = J::Object(obj.clone());
        let body = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
        let doc = scan_full(&body, Api::Chat).unwrap();
        let view = View { head: body.clone(), tail: Vec::new(), tail_base: body.len(), size: body.len() };
        let want: Vec<(String, J)> = obj.into_iter().collect();
        prop_assert_eq!(members_of(&doc, &view), want);
    }

    /// Every value skips to the same boundary forward and backward.
    #[test]
    fn skip_forward_and_backward_agree(v in arb_json(), pad in 0usize..3) {
        let text = serde_json::to_vec(&v).unwrap();
        let mut buf = b"[".to_vec();
        buf.extend(std::iter::repeat_n(b' ', pad));
        let start = buf.len();
        buf.extend_from_slice(&text);
        let end = buf.len();
        buf.push(b']');
        prop_assert_eq!(json::skip_value(&buf, start), Ok(end));
        prop_assert_eq!(json::skip_value_back(&buf, end), Ok(start));
    }

    /// The conversation array's elements, seen from the head and from the tail
    /// with small read limits, are serde_json's first and last elements, and the
    /// other members are all found.
    #[test]
    fn head_and_tail_find_members_and_ends(
        before in arb_object(), after in arb_object(), msgs in prop::collection::vec(arb_json(), 1..40),
        head in 1usize..600, tail in 1usize..600,
    ) {
        let mut obj: Vec<(String, J)> = before.into_iter().filter(|(k, _)| k != "messages").collect();
        let msgs: Vec<J> = msgs.into_iter().map(|c| json!({"role": "user", "content": c})).collect();
        obj.push(("messages".into(), J::Array(msgs.clone())));
        for (k, v) in after {
            if !obj.iter().any(|(n, _)| *n == k) { obj.push((k, v)); }
        }
        let body = serde_json::to_vec(&J::Object(obj.iter().cloned().collect())).unwrap();
        let mut f = SliceFetch::new(&body);
        let limits = ReadLimits { full_max: 0, head, tail };
        let (view, doc, _) = read_doc(Api::Chat, body.len(), limits, &mut |s, l| f.fetch(s, l)).unwrap();
        let found = members_of(&doc, &view);
        for (k, v) in &obj {
            if k == "messages" { continue; }
            prop_assert!(found.contains(&(k.clone(), v.clone())), "member {} missing", k);
        }
        let Some(Conv::Array { first, last, all, .. }) = &doc.conv else { panic!("no conversation: {:?}", doc.conv) };
        let parse = |s: &Span| -> J { serde_json::from_slice(view.bytes(*s).unwrap()).unwrap() };
        let firsts: Vec<J> = first.iter().map(parse).collect();
        prop_assert_eq!(&firsts[..], &msgs[..firsts.len()]);
        let lasts: Vec<J> = (if *all { first } else { last }).iter().map(parse).collect();
        prop_assert!(!lasts.is_empty());
        prop_assert_eq!(&lasts[..], &msgs[msgs.len() - lasts.len()..]);
    }

    /// Any strict prefix of a body is an error (never a panic, never "complete").
    #[test]
    fn truncation_is_an_error(obj in arb_object(), cut in 0.0f64..1.0) {
        let body = serde_json::to_vec(&J::Object(obj)).unwrap();
        let n = ((body.len() - 1) as f64 * cut) as usize;
        let cut_body = &body[..n];
        prop_assert!(scan_full(cut_body, Api::Chat).is_err());
        let mut f = SliceFetch::new(cut_body);
        let limits = ReadLimits { full_max: 0, head: 16, tail: 16 };
        prop_assert!(read_doc(Api::Chat, cut_body.len(), limits, &mut |s, l| f.fetch(s, l)).is_err());
    }

    /// Corrupted bodies never panic, whatever the read limits.
    #[test]
    fn corruption_never_panics(obj in arb_object(), flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), head in 1usize..64, tail in 1usize..64) {
        let mut body = serde_json::to_vec(&J::Object(obj)).unwrap();
        for (i, b) in flips {
            let i = i.index(body.len());
            body[i] = b;
        }
        for api in ALL_APIS {
            let _ = scan_full(&body, api);
            let mut f = SliceFetch::new(&body);
            let _ = read_doc(api, body.len(), ReadLimits { full_max: 0, head, tail }, &mut |s, l| f.fetch(s, l));
        }
    }
}

#[test]
fn long_conversations_read_only_the_ends() {
    let mut c = Convo::new("sys", "task");
    for i in 0..400 {
        c = c.with(Step::User(format!("reply {i} {}", "x".repeat(1000))));
    }
    for api in ALL_APIS {
        for order in ALL_ORDERS {
            let body = c
                .clone()
                .extra("prompt_cache_key", json!("pck"))
                .body(api, order);
            if api == Api::Completions {
                continue;
            }
            assert!(body.len() > 400_000, "{api:?}: {}", body.len());
            let mut f = SliceFetch::new(&body);
            let (view, doc, stats) =
                read_doc(api, body.len(), ReadLimits::default(), &mut |s, l| {
                    f.fetch(s, l)
                })
                .unwrap();
            assert!(
                f.fetched < 70_000,
                "{api:?} {order:?} fetched {} of {}",
                f.fetched,
                body.len()
            );
            assert!(!stats.full);
            assert!(
                doc.member(&view, "prompt_cache_key")
                    .is_some_and(|v| v.str_is("pck")),
                "{api:?} {order:?}"
            );
            assert!(
                doc.member(&view, "model").is_some_and(|v| v.str_is("m")),
                "{api:?} {order:?}"
            );
        }
    }
}

#[test]
fn a_big_value_after_the_conversation_grows_the_tail() {
    // tools (a big array that is not a conversation) after messages: the tail grows past it.
    let tools: Vec<J> = (0..500).map(|i| json!({"type": "function", "function": {"name": format!("t{i}"), "description": "d".repeat(100)}})).collect();
    // Long enough that the grown ends stay under half of it (else it is read whole).
    let msgs: Vec<J> = (0..2000)
        .map(|i| json!({"role": "user", "content": format!("m{i} {}", "y".repeat(500))}))
        .collect();
    let body = testkit_object(&[
        ("messages", J::Array(msgs)),
        ("tools", J::Array(tools)),
        ("user", json!("u")),
    ]);
    let mut f = SliceFetch::new(&body);
    let (view, doc, stats) = read_doc(Api::Chat, body.len(), ReadLimits::default(), &mut |s, l| {
        f.fetch(s, l)
    })
    .unwrap();
    assert!(stats.regrows >= 1);
    assert!(doc.member(&view, "tools").is_some());
    assert!(doc.member(&view, "user").is_some_and(|v| v.str_is("u")));
    let Some(Conv::Array { last, .. }) = &doc.conv else {
        panic!()
    };
    let v: J = serde_json::from_slice(view.bytes(*last.last().unwrap()).unwrap()).unwrap();
    assert!(v["content"].as_str().unwrap().starts_with("m1999 "));
    assert!(!stats.full);
}

fn testkit_object(m: &[(&str, J)]) -> Vec<u8> {
    let names: Vec<&str> = m.iter().map(|(k, _)| *k).collect();
    crate::testkit::object(m, &names)
}

#[test]
fn escaped_keys_are_recognised() {
    let body = br#"{"cache\u005fsalt":"x","messages":[]}"#;
    let doc = scan_full(body, Api::Chat).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    assert!(
        doc.member(&view, "cache_salt")
            .is_some_and(|v| v.str_is("x"))
    );
}

#[test]
fn trailing_garbage_is_malformed() {
    assert_eq!(
        scan_full(br#"{"a":1} x"#, Api::Chat),
        Err(ScanError::Malformed)
    );
    assert_eq!(scan_full(br#"[1]"#, Api::Chat), Err(ScanError::Malformed));
    assert_eq!(
        scan_full(br#"{"a":tru}"#, Api::Chat),
        Err(ScanError::Malformed)
    );
    assert!(scan_full(b"{\"a\":1}\n", Api::Chat).is_ok());
}

/// An object written member by member, so keys may repeat (a map cannot hold
/// duplicates); a conversation array sits between `before` and `after`.
fn object_with_duplicates(before: &[(String, J)], after: &[(String, J)], msgs: usize) -> Vec<u8> {
    let member = |(k, v): &(String, J)| format!("{}:{}", J::from(k.as_str()), v);
    let conv: Vec<J> = (0..msgs)
        .map(|i| json!({"role": "user", "content": format!("m{i}")}))
        .collect();
    let mut parts: Vec<String> = before.iter().map(member).collect();
    parts.push(format!("\"messages\":{}", J::Array(conv)));
    parts.extend(after.iter().map(member));
    format!("{{{}}}", parts.join(",")).into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Repeated top-level keys resolve like serde_json (the last one wins), whether
    /// the body is walked whole or read from its ends, and wherever the copies sit.
    #[test]
    fn duplicate_keys_resolve_to_the_last_like_serde(
        before in prop::collection::vec(("(a|b|session_id)", arb_json()), 0..6),
        after in prop::collection::vec(("(a|b|session_id)", arb_json()), 0..6),
        msgs in 1usize..60, head in 1usize..300, tail in 1usize..300,
    ) {
        let body = object_with_duplicates(&before, &after, msgs);
        let want: J = serde_json::from_slice(&body).unwrap();
        let whole = scan_full(&body, Api::Chat).unwrap();
        let whole_view = View { head: body.clone(), tail: Vec::new(), tail_base: body.len(), size: body.len() };
        let mut f = SliceFetch::new(&body);
        let limits = ReadLimits { full_max: 0, head, tail };
        let (view, doc, _) = read_doc(Api::Chat, body.len(), limits, &mut |s, l| f.fetch(s, l)).unwrap();
        for key in ["a", "b", "session_id"] {
            for (d, v) in [(&whole, &whole_view), (&doc, &view)] {
                let got: Option<J> = d
                    .member(v, key)
                    .map(|m| serde_json::from_slice(m.bytes()).unwrap());
                prop_assert_eq!(got.as_ref(), want.get(key), "key {}", key);
            }
        }
    }
}

#[test]
fn a_repeated_key_takes_its_last_value() {
    let body = br#"{"session_id":"first","messages":[{"role":"user","content":"hi"}],"session_id":"last"}"#;
    let doc = scan_full(body, Api::Chat).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    assert!(
        doc.member(&view, "session_id")
            .is_some_and(|v| v.str_is("last"))
    );
    assert_eq!(doc.members_named(&view, "session_id").count(), 2);
}

/// The backward scan's edge cases, at a non-zero base so every offset is checked
/// as an absolute one: an all-blank tail, a tail that reaches the opening brace,
/// a value cut at the start of the bytes, and a value whose key was cut off.
#[test]
fn tail_scan_edges_give_absolute_offsets() {
    let base = 1000;
    let tail = |buf: &[u8]| scan_tail(buf, base, None).unwrap();
    // Nothing but blanks: cut before any value, at the start of the bytes.
    assert_eq!(
        tail(b"   ").end,
        TailEnd::InValue {
            end: base,
            is_array: false,
            elems: Vec::new(),
            walked: Walked::default(),
        }
    );
    // The whole (empty) object is in the bytes: its brace's absolute offset.
    assert_eq!(tail(b"{}").end, TailEnd::Complete { start: base });
    assert_eq!(tail(b"  { } ").end, TailEnd::Complete { start: base + 2 });
    // A member, then the brace.
    let t = tail(br#" {"a":1}"#);
    assert_eq!(t.end, TailEnd::Complete { start: base + 1 });
    assert_eq!(
        t.members,
        vec![Member {
            key: Span::new(base + 3, base + 4),
            value: Span::new(base + 6, base + 7)
        }]
    );
    // The bytes start inside the last member's value: keyless, cut in an array.
    let t = tail(b"[1,2]}");
    assert!(t.members.is_empty());
    assert_eq!(
        t.end,
        TailEnd::InValue {
            end: base + 5,
            is_array: true,
            elems: vec![Span::new(base + 1, base + 2), Span::new(base + 3, base + 4)],
            walked: Walked::default(),
        }
    );
    // Only the colon of the key survived: still keyless, never read before the bytes.
    let t = tail(b" : [7] }");
    assert!(t.members.is_empty());
    assert_eq!(
        t.end,
        TailEnd::InValue {
            end: base + 6,
            is_array: true,
            elems: vec![Span::new(base + 4, base + 5)],
            walked: Walked::default(),
        }
    );
    // A complete member before the cut one.
    let t = tail(br#"xx","k":"v"}"#);
    assert_eq!(
        t.members,
        vec![Member {
            key: Span::new(base + 5, base + 6),
            value: Span::new(base + 8, base + 11)
        }]
    );
    assert!(matches!(t.end, TailEnd::InValue { end, is_array: false, .. } if end == base + 3));
    // The bytes start just before a key: that member is complete, the cut is before it.
    let t = tail(br#" "k":1}"#);
    assert_eq!(
        t.members,
        vec![Member {
            key: Span::new(base + 2, base + 3),
            value: Span::new(base + 5, base + 6)
        }]
    );
    assert_eq!(
        t.end,
        TailEnd::InValue {
            end: base,
            is_array: false,
            elems: Vec::new(),
            walked: Walked::default(),
        }
    );
    // Exactly at a key's quote, the bytes cannot tell whether a backslash just
    // before them escapes it (`{"a\"k":1}` has the key `a"k`, not `k`): the
    // key is left for more bytes.
    let t = tail(br#""k":1}"#);
    assert!(t.members.is_empty());
    assert_eq!(
        t.end,
        TailEnd::InValue {
            end: base + 5,
            is_array: false,
            elems: Vec::new(),
            walked: Walked::default(),
        }
    );
    // A value must follow `"key":` exactly: a stray byte for the colon, or a bare key, is malformed.
    for bad in [&br#"{"k"x1}"#[..], br#"{k:1}"#, br#"{"a":1,"k"x1}"#] {
        assert_eq!(
            scan_tail(bad, base, None),
            Err(ScanError::Malformed),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

/// A body the first two ends cover is read from its ends, not walked entry
/// by entry: what the filter derives from it — head hash, turn, the P/D
/// estimate's new bytes, every top-level member — is what the whole walk
/// gives, for every API, member order and conversation shape.
#[test]
fn a_small_body_read_from_its_ends_reads_as_the_whole_walk() {
    use crate::read::{head::head_hash, turn};
    let tools = vec!["Task".to_owned()];
    let long = "x".repeat(3000);
    let shapes = [
        Convo::new("sys", "task"),
        Convo::new("", "task"),
        Convo::new("sys", "task").with(Step::User("more".into())),
        Convo::new("sys", &long).with(Step::User(long.clone())),
        Convo::new("sys", "task").with(Step::Tool {
            id: "t1".into(),
            tool: "Read".into(),
            result: long.clone(),
        }),
        Convo::new("sys", "task")
            .with(Step::Parallel(vec![
                ("t1".into(), "Read".into()),
                ("t2".into(), "Task".into()),
            ]))
            .with(Step::User("thanks".into())),
        Convo::new("sys", "task")
            .with(Step::User("a".into()))
            .with(Step::Tool {
                id: "t9".into(),
                tool: "Task".into(),
                result: "done".into(),
            })
            .extra("prompt_cache_key", json!("k")),
        // A client copy of an owned field: the rewrite's cut crosses the conversation.
        Convo::new("sys", "task")
            .with(Step::User("a".into()))
            .extra("kv_transfer_params", json!({"do_remote_prefill": true})),
    ];
    let mut ends_read = 0;
    for api in ALL_APIS {
        for order in ALL_ORDERS {
            for c in &shapes {
                let body = c.body(api, order);
                let read = |full_max: usize| {
                    let mut f = SliceFetch::new(&body);
                    let limits = ReadLimits {
                        full_max,
                        ..ReadLimits::default()
                    };
                    read_doc(api, body.len(), limits, &mut |s, l| f.fetch(s, l)).unwrap()
                };
                let (wv, whole, _) = read(usize::MAX);
                let (ev, ends, stats) = read(0);
                assert!(stats.full && !stats.middle);
                let at = format!("{api:?} {order:?} {c:?}");
                ends_read += usize::from(matches!(ends.conv, Some(Conv::Array { all: false, .. })));
                assert_eq!(
                    head_hash(api, &ends, &ev),
                    head_hash(api, &whole, &wv),
                    "{at}"
                );
                let t =
                    |d: &Doc, v: &View| turn::classify_counting(api, d, v, &tools, false, false);
                assert_eq!(t(&ends, &ev), t(&whole, &wv), "{at}");
                assert_eq!(
                    turn::new_turn_bytes(api, &ends, &ev),
                    turn::new_turn_bytes(api, &whole, &wv),
                    "{at}"
                );
                // Every member, the conversation included, in body order
                // (the rewrite rebuilds a prefix of the body from them).
                assert_eq!(members_of(&ends, &ev), members_of(&whole, &wv), "{at}");
                let owned = [
                    ("session_id", b"\"x\"".to_vec()),
                    ("kv_transfer_params", b"{}".to_vec()),
                ];
                assert_eq!(
                    crate::emit::rewrite::plan(&ends, &ev, &owned),
                    crate::emit::rewrite::plan(&whole, &wv, &owned),
                    "{at}"
                );
            }
        }
    }
    // Completions prompts are text: the rest were read from their ends.
    assert!(
        ends_read >= 3 * ALL_ORDERS.len() * shapes.len(),
        "{ends_read}"
    );
}
