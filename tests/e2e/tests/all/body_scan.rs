//! The body scanner inside Envoy's V8: its 64-byte block classification uses
//! wasm SIMD (`simd128`), so a body whose identity sits truly in the middle —
//! read whole by the full structural scan — must route with exactly the
//! markers the filter's native build computes for the same bytes.

use crate::support::{Fleet, echo_of};
use serde_json::json;
use tether_e2e::Request;
use tether_filter::api::Api;
use tether_filter::config::Config;
use tether_filter::decide;
use tether_filter::place::Pools;

/// ~2.4 MB: 8,000 short messages (escapes, non-ASCII), then `session_id`,
/// then 8,000 small tool objects — structure-dense JSON on both sides.
fn body_with_identity_in_the_middle() -> Vec<u8> {
    let messages: Vec<_> = (0..8_000)
        .map(|i| {
            let role = ["user", "assistant", "tool"][i % 3];
            json!({"role": role, "content": format!("turn {i}: \"why\" \\ é {{[,]}}"), "tool_call_id": format!("c{i}")})
        })
        .collect();
    let tools: Vec<_> = (0..8_000)
        .map(|i| json!({"type": "function", "function": {"name": format!("t{i}"), "parameters": {"type": "object"}}}))
        .collect();
    format!(
        r#"{{"model":"m","messages":{},"session_id":"mid-session","tools":{}}}"#,
        json!(messages),
        json!(tools)
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread")]
async fn identity_in_the_middle_routes_like_the_native_build() {
    let fleet = Fleet::hash(4, json!({}));
    let body = body_with_identity_in_the_middle();
    let echo = echo_of(
        fleet
            .raw(Request::post_bytes(
                "/v1/chat/completions",
                "application/json",
                body.clone(),
            ))
            .await,
    );

    // The fleet's configuration: hash mode, every output (tests/all/support.rs).
    let cfg = Config::parse(br#"{"mode":"hash","outputs":"all"}"#).expect("config");
    let pools = Pools::new(&cfg);
    let d = decide::on_whole_body(&cfg, &pools, Api::Chat, &body);
    assert!(d.read.stats.full, "the native build read the body whole");
    let want = d.request_headers(&cfg, &pools);
    assert!(want.iter().any(|(k, _)| *k == "x-tether-turn"), "{want:?}");
    for (name, value) in &want {
        assert_eq!(echo.header(name), Some(value.as_str()), "{name}");
    }
    assert_eq!(echo.header("x-tether-key-source"), Some("body:session_id"));
}
