use super::*;

#[test]
fn unescape_handles_every_escape() {
    assert_eq!(
        unescape(br#"a\"b\\c\/d\b\f\n\r\t"#).as_deref(),
        Some("a\"b\\c/d\u{8}\u{c}\n\r\t")
    );
    assert_eq!(unescape(br"\u00e9\ud83d\ude00").as_deref(), Some("é😀"));
    assert_eq!(unescape(br"\ud83d").as_deref(), None, "lone surrogate");
    assert_eq!(unescape(br"\u+123").as_deref(), None);
    assert_eq!(unescape(br"\x").as_deref(), None);
    assert_eq!(unescape(b"\\").as_deref(), None);
    assert!(matches!(unescape(b"plain"), Some(Cow::Borrowed("plain"))));
}

#[test]
fn backward_strings_respect_backslash_runs() {
    for s in [r#""a\\""#, r#""\"""#, r#""x\\\"y""#, r#""""#] {
        let b = format!("[{s}]");
        let end = b.len() - 1;
        assert_eq!(skip_value_back(b.as_bytes(), end), Ok(1), "{s}");
        assert_eq!(skip_value(b.as_bytes(), 1), Ok(end), "{s}");
    }
    // A run of backslashes reaching the start of the bytes at hand cannot be decided.
    assert_eq!(skip_string_back(br#"\\""#, 3), Err(Stop::Incomplete));
    // Nor can a quote at the very start: a backslash may sit just before it.
    assert_eq!(skip_string_back(br#""ab""#, 4), Err(Stop::Incomplete));
    assert_eq!(skip_string_back(br#" "ab""#, 5), Ok(1));
    // Runs crossing a 64-byte block boundary, both ways.
    for pad in 55..75 {
        for run in 0..5 {
            let text = format!("{}{}\\\"x", "a".repeat(pad), "\\\\".repeat(run));
            let b = format!(" [\"{text}\"]");
            let end = b.len() - 1;
            assert_eq!(skip_value_back(b.as_bytes(), end), Ok(2), "{b}");
            assert_eq!(skip_value(b.as_bytes(), 2), Ok(end), "{b}");
            assert_eq!(skip_value_back(b.as_bytes(), b.len()), Ok(1), "{b}");
            assert_eq!(skip_value(b.as_bytes(), 1), Ok(b.len()), "{b}");
        }
    }
}

#[test]
fn backslashes_outside_strings_are_malformed() {
    assert_eq!(skip_value(br#"[\"a"]"#, 0), Err(Stop::Malformed));
    // Backward, the same bytes read as a string opened further back.
    assert!(skip_value_back(br#"[\"a"]"#, 6).is_err());
    assert_eq!(skip_value(br#"["\\"]"#, 0), Ok(6));
}

#[test]
fn mismatched_brackets_and_deep_nesting_are_malformed() {
    assert_eq!(skip_value(b"[1}", 0), Err(Stop::Malformed));
    assert_eq!(skip_value_back(b"{1]", 3), Err(Stop::Malformed));
    let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
    assert_eq!(skip_value(deep.as_bytes(), 0), Err(Stop::Malformed));
    let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
    assert_eq!(skip_value(ok.as_bytes(), 0), Ok(ok.len()));
    assert_eq!(skip_value(b"[1,2", 0), Err(Stop::Incomplete));
    assert_eq!(
        skip_value(b"12", 0),
        Err(Stop::Incomplete),
        "a number may continue"
    );
}

#[test]
fn first_plain_string_member() {
    assert_eq!(
        Value(br#"{"role":"user","x":1}"#).first_plain_str("role"),
        Some(&b"user"[..])
    );
    assert_eq!(
        Value(br#"{ "role" : "tool" }"#).first_plain_str("role"),
        Some(&b"tool"[..])
    );
    // Anything else is left to the member walk.
    for v in [
        &br#"{"x":1,"role":"user"}"#[..],
        br#"{"role":"us\u0065r"}"#,
        br#"{"ro\u006ce":"user"}"#,
        br#"{"role":1}"#,
        br#"{"roles":"user"}"#,
        br#"{"role":"user"#,
        br#"["role"]"#,
    ] {
        assert_eq!(
            Value(v).first_plain_str("role"),
            None,
            "{}",
            String::from_utf8_lossy(v)
        );
    }
}

#[test]
fn lazy_walks() {
    let v = Value(br#"{"a":1,"b":{"c":[1,"x",{"d":null}]},"a":2}"#);
    assert_eq!(
        v.get("a").map(|x| x.bytes()),
        Some(&b"1"[..]),
        "first match"
    );
    assert!(v.get_near("b", 1).is_none());
    assert!(v.get_near("b", 2).is_some());
    let head = v.get_head("b").unwrap();
    assert!(head.bytes().starts_with(b"{\"c\":[1,") && head.bytes().ends_with(b"\"a\":2}"));
    let arr = Value(br#"{"content":[{"type":"tool_result","content":"big"},{"type":"text"}]}"#);
    let first = arr
        .get_head("content")
        .and_then(|c| c.first_element_head())
        .unwrap();
    assert!(
        first
            .get_near("type", 1)
            .is_some_and(|t| t.str_is("tool_result"))
    );
    assert!(Value(b"[1]").first_element_head().is_none());
    let c = v.get("b").and_then(|b| b.get("c")).unwrap();
    assert_eq!(c.elements().count(), 3);
    assert!(c.elements().nth(1).unwrap().str_is("x"));
    assert_eq!(Value(b"[]").elements().count(), 0);
    assert_eq!(Value(b"{}").members().count(), 0);
    assert_eq!(Value(b"\"s\"").members().count(), 0);
}

/// The in-place string comparison agrees with unescaping then comparing.
#[cfg(not(target_arch = "wasm32"))]
mod raw_comparison {
    use super::*;
    use proptest::prelude::*;

    fn json_inner(s: &str) -> String {
        let quoted = serde_json::to_string(s).unwrap();
        quoted[1..quoted.len() - 1].to_owned()
    }

    proptest! {
        #[test]
        fn str_is_matches_unescape(a in "[a-z\"\\\\\u{e9}]{0,6}", b in "[a-z\"\\\\\u{e9}]{0,6}", escape_all in any::<bool>()) {
            let inner = if escape_all {
                a.chars().map(|c| format!("\\u{:04x}", c as u32)).collect::<String>()
            } else {
                json_inner(&a)
            };
            let value = format!("\"{inner}\"");
            prop_assert_eq!(Value(value.as_bytes()).str_is(&b), a == b);
            prop_assert_eq!(Value(value.as_bytes()).str_is(&a), true);
            prop_assert_eq!(key_eq(inner.as_bytes(), &b), a == b);
        }
    }
}
