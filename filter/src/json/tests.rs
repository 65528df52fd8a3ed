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
