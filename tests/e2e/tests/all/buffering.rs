//! The header path never buffers (the route matching `x-tether-key` disables
//! the buffer filter); the body path does, within explicit limits, and carries
//! multi-megabyte prompts.

use crate::support::*;
use serde_json::json;
use tether_e2e::{Request, bootstrap};

/// A Responses body of at least `bytes`: a long tool-call history with the
/// identity at the end, as SDKs send it. Items are serialized once and
/// repeated (serializing megabytes through `serde_json::Value` in a debug
/// build takes tens of seconds).
fn big_body(bytes: usize, identity: &[(&str, serde_json::Value)]) -> String {
    let output = "lorem ipsum dolor sit amet ".repeat(2000);
    let call = json!({"type": "function_call", "call_id": "fc", "name": "bash", "arguments": "{\"arg\":\"cat big.log\"}"});
    let result = json!({"type": "function_call_output", "call_id": "fc", "output": output});
    let pair = format!("{call},{result}");
    let first = json!({"role": "user", "content": "start"}).to_string();
    let mut items = String::with_capacity(bytes + pair.len() * 2);
    items.push_str(&first);
    while items.len() < bytes {
        items.push(',');
        items.push_str(&pair);
    }
    let mut fields =
        format!(r#"{{"model":"gpt-5","input":[{items}],"instructions":"You are a coding agent.""#);
    for (k, v) in identity {
        fields.push_str(&format!(",{}:{v}", json!(k)));
    }
    fields.push('}');
    debug_assert!(serde_json::from_str::<serde_json::Value>(&fields).is_ok());
    fields
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
    let f = Fleet::pick(bootstrap::DEMO, 4, &[], json!({}), &[]);
    let body = big_body(6 << 20, &[("prompt_cache_key", json!("pck-6mb"))]);
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
