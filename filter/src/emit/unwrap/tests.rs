use super::*;
use crate::api::Api;
use crate::emit::rewrite::apply;
use crate::read::scan::{ReadLimits, View, read_doc, scan_full};
use serde_json::{Value, json};

fn body_of(bytes: &[u8]) -> Body {
    let doc = scan_full(bytes, Api::Responses).expect("scans");
    let view = View {
        head: bytes.to_vec(),
        tail: Vec::new(),
        tail_base: bytes.len(),
        size: bytes.len(),
    };
    Body { doc, view }
}

#[test]
fn the_engine_id_goes_back_at_the_same_length() {
    let raw = json!({"model": "m", "previous_response_id": "resp_tt1aa_long_wrapped_id_resp_1", "input": []})
        .to_string()
        .into_bytes();
    let e = edit(&body_of(&raw), b"resp_1", &mut |_, _| None).expect("edit");
    let out = apply(&raw, &e);
    assert_eq!(out.len(), raw.len(), "content-length stays true");
    let v: Value = serde_json::from_slice(&out).expect("still JSON");
    assert_eq!(v["previous_response_id"], "resp_1");
    assert_eq!(v["input"], json!([]));
}

#[test]
fn the_last_copy_is_unwrapped_and_a_far_one_is_fetched() {
    // A long conversation before the member: only the ends were scanned.
    let items: Vec<String> = (0..2000)
        .map(|i| {
            format!(r#"{{"type":"message","role":"user","content":"turn {i} of a long run"}}"#)
        })
        .collect();
    let raw = format!(
        r#"{{"input":[{}],"previous_response_id":"resp_a","previous_response_id":"resp_tt1_wrapped_resp_b"}}"#,
        items.join(",")
    )
    .into_bytes();
    let mut fetch = |s: usize, l: usize| raw.get(s..s.checked_add(l)?).map(<[u8]>::to_vec);
    let (view, doc, _) =
        read_doc(Api::Responses, raw.len(), ReadLimits::default(), &mut fetch).expect("reads");
    assert!(!view.is_full(), "read from its two ends");
    let body = Body { doc, view };
    let e = edit(&body, b"resp_b", &mut fetch).expect("edit");
    let out = apply(&raw, &e);
    assert_eq!(out.len(), raw.len());
    let v: Value = serde_json::from_slice(&out).expect("still JSON");
    assert_eq!(
        v["previous_response_id"], "resp_b",
        "parsers keep the last copy"
    );
}

#[test]
fn a_longer_engine_id_or_no_member_is_no_edit() {
    let raw = br#"{"previous_response_id":"short","input":[]}"#;
    assert_eq!(
        edit(&body_of(raw), b"much_longer_than_that", &mut |_, _| None),
        None
    );
    let raw = br#"{"input":[]}"#;
    assert_eq!(edit(&body_of(raw), b"x", &mut |_, _| None), None);
}
