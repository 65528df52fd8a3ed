//! Every kind of bad input is still answered (by a rank, with a fallback key,
//! or by Envoy with a 4xx), and the filter keeps working afterwards.

use crate::support::*;
use serde_json::json;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::{Request, bootstrap};

const MAX_BODY: usize = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_answered_with_a_fallback_and_counted() {
    let f = Fleet::pick(
        bootstrap::DEMO,
        4,
        &[],
        json!({"max_body_bytes": MAX_BODY}),
        &[],
    );
    let path = Api::Chat.path();
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}],"prompt_cache_key":"k"}}"#,
        "x".repeat(MAX_BODY * 3)
    );
    // (what, request, the key source it must get)
    let cases: Vec<(&str, Request, &str)> = vec![
        (
            "malformed JSON",
            Request::post_bytes(
                path,
                "application/json",
                r#"{"model": "m", "messages": [}}"#,
            ),
            "fallback:malformed_json",
        ),
        (
            "truncated JSON",
            Request::post_bytes(
                path,
                "application/json",
                r#"{"model":"m","messages":[{"role":"user","content":"hel"#,
            ),
            "fallback:truncated",
        ),
        (
            "not JSON at all",
            Request::post_bytes(path, "application/json", "hello there"),
            "fallback:malformed_json",
        ),
        (
            "body over max_body_bytes",
            Request::post_bytes(path, "application/json", big.clone()),
            "fallback:too_large",
        ),
        (
            "chunked body over max_body_bytes",
            Request::post_bytes(path, "application/json", big).chunked(16 * 1024),
            "fallback:too_large",
        ),
        (
            "gzip body",
            Request::post_bytes(
                path,
                "application/json",
                vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3],
            )
            .header("content-encoding", "gzip"),
            "fallback:compressed_corrupt",
        ),
        (
            "non-JSON content type",
            Request::post_bytes(path, "text/plain", "just text"),
            "fallback:not_json",
        ),
        (
            "empty body",
            Request::post_bytes(path, "application/json", ""),
            "fallback:no_body",
        ),
    ];
    for (what, req, source) in cases {
        let e = f.echo(req).await;
        assert_eq!(e.header("x-tether-key-source"), Some(source), "{what}");
        assert!(
            e.header("x-tether-key").is_some_and(|k| k.len() == 16),
            "{what}: still keyed"
        );
    }

    // Unusable identity headers are skipped (the body's key is used instead).
    let conv = Conversation::new(Api::Chat, "sys", &[], "hi");
    let body = conv.body(&[("prompt_cache_key", json!("pck-bad-headers"))]);
    let header_cases: Vec<(&str, Request)> = vec![
        (
            "2 KiB x-session-id",
            Request::post_bytes(path, "application/json", body.clone())
                .header("x-session-id", "s".repeat(2048)),
        ),
        (
            "repeated x-session-id",
            Request::post_bytes(path, "application/json", body.clone())
                .header("x-session-id", "a")
                .header("x-session-id", "b"),
        ),
        (
            "non-UTF-8 x-session-id",
            Request::post_bytes(path, "application/json", body.clone())
                .header("x-session-id", [0xff, 0xfe, b'a']),
        ),
        (
            "empty x-session-id",
            Request::post_bytes(path, "application/json", body.clone()).header("x-session-id", ""),
        ),
    ];
    for (what, req) in header_cases {
        let e = f.echo(req).await;
        assert_eq!(
            e.header("x-tether-key-source"),
            Some("body:prompt_cache_key"),
            "{what}"
        );
    }

    // Headers beyond Envoy's limit: Envoy answers 431 itself.
    let huge = Request::post_bytes(path, "application/json", body.clone())
        .header("x-pad", "p".repeat(100 * 1024));
    let resp = f.raw(huge).await;
    assert_eq!(resp.status, 431, "huge headers");
    let repeated = |n: usize| {
        (0..n).fold(
            Request::post_bytes(path, "application/json", body.clone()),
            |r, i| r.header("x-rep", format!("v{i}")),
        )
    };
    let e = f.echo(repeated(60)).await;
    assert_eq!(
        e.header("x-tether-key-source"),
        Some("body:prompt_cache_key"),
        "60 repeated headers"
    );
    assert_eq!(
        f.raw(repeated(200)).await.status,
        431,
        "more headers than Envoy's max_request_headers_count"
    );

    // The VM survived all of it.
    let e = f.echo(header_turn(&conv, "still-alive", None)).await;
    assert_eq!(
        e.header("x-tether-key-source"),
        Some("header:x-claude-code-session-id")
    );

    let m = f.metrics();
    // Each bad request counted once, under its own reason.
    for (reason, n) in [
        ("malformed_json", 2.0),
        ("truncated", 1.0),
        ("too_large", 2.0),
        ("compressed_corrupt", 1.0),
        ("not_json", 1.0),
        ("no_body", 1.0),
    ] {
        assert_eq!(
            counter(&m, &format!("tether_fallback_{reason}")),
            n,
            "fallback counter {reason}; names: {:?}",
            m.names()
        );
    }
    // The four unusable x-session-id headers, one count each.
    assert_eq!(counter(&m, "tether_bad_header"), 4.0);
}
