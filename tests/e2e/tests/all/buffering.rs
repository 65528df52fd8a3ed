//! The header path never buffers (the route matching `x-tether-key` disables
//! the buffer filter); the body path does, within explicit limits, and carries
//! multi-megabyte prompts.

use crate::support::*;
use serde_json::json;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::{Request, bootstrap};

/// A Responses body of about `bytes` with the identity at the end, as SDKs send it.
fn big_body(bytes: usize, identity: &[(&str, serde_json::Value)]) -> String {
    let mut conv = Conversation::new(
        Api::Responses,
        "You are a coding agent.",
        &["bash"],
        "start",
    );
    let chunk = "lorem ipsum dolor sit amet ".repeat(2000);
    let mut t = 0;
    while conv.body(&[]).len() < bytes {
        conv.tool_round(
            &format!("fc_{t}"),
            "bash",
            json!({"arg": "cat big.log"}),
            &chunk,
        );
        t += 1;
    }
    conv.body(identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_path_streams_past_the_buffer_limit_body_path_does_not() {
    let limit = 256 * 1024;
    let f = Fleet::pick(
        bootstrap::DEMO,
        4,
        &[],
        json!({}),
        &[("BUFFER_LIMIT", &limit.to_string())],
    );
    let body = big_body(4 * limit, &[("prompt_cache_key", json!("pck-big"))]);
    let n = body.len();

    let header = Request::post_bytes("/v1/responses", "application/json", body.clone())
        .header("x-session-id", "hdr-session");
    let e = f.echo(header).await;
    assert_eq!(e.body_bytes, n, "header path delivered the whole body");
    assert_eq!(e.header("x-tether-key-source"), Some("header:x-session-id"));

    let chunked = Request::post_bytes("/v1/responses", "application/json", body.clone())
        .header("x-session-id", "hdr-2")
        .chunked(64 * 1024);
    assert_eq!(f.echo(chunked).await.body_bytes, n, "chunked header path");

    let resp = f
        .raw(Request::post_bytes(
            "/v1/responses",
            "application/json",
            body.clone(),
        ))
        .await;
    assert_eq!(resp.status, 413, "body path buffers and enforces the limit");

    // A client-sent x-tether-key must not switch buffering off (the filter strips it first).
    let spoof = Request::post_bytes("/v1/responses", "application/json", body)
        .header("x-tether-key", "0123456789abcdef");
    assert_eq!(
        f.raw(spoof).await.status,
        413,
        "spoofed x-tether-key skipped the buffer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_megabyte_prompts_route_on_both_paths() {
    let t0 = std::time::Instant::now();
    let f = Fleet::pick(bootstrap::DEMO, 4, &[], json!({}), &[]);
    println!("T fleet {:?}", t0.elapsed());
    let body = big_body(6 << 20, &[("prompt_cache_key", json!("pck-6mb"))]);
    println!("T body {:?}", t0.elapsed());
    let n = body.len();
    let mut places = std::collections::BTreeSet::new();
    for chunked in [false, true] {
        let req = Request::post_bytes("/v1/responses", "application/json", body.clone());
        let req = if chunked {
            req.chunked(256 * 1024)
        } else {
            req
        };
        let e = f.echo(req).await;
        assert_eq!(e.body_bytes, n, "body path, chunked={chunked}");
        assert_eq!(
            e.header("x-tether-key-source"),
            Some("body:prompt_cache_key"),
            "chunked={chunked}"
        );
        places.insert(place(&e));
        println!("T sent chunked={chunked} {:?}", t0.elapsed());
    }
    assert_eq!(places.len(), 1, "same key, same rank: {places:?}");
    let e = f
        .echo(
            Request::post_bytes("/v1/responses", "application/json", body)
                .header("x-session-id", "mb"),
        )
        .await;
    assert_eq!(e.body_bytes, n, "header path");
}
