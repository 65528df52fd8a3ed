//! The bootstraps' Envoy plumbing driven by the floor filter (independent of
//! the tether filter): header path, ORIGINAL_DST through filter state, buffer limits.

use crate::support::*;
use serde_json::json;
use tether_e2e::{HttpClient, Request, bootstrap, paths};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_header_mode_reaches_a_rank_with_its_header() {
    need_envoy_and_floor();
    let ranks = ranks(4);
    let envoy = builder_for(&ranks)
        .var("FILTER_WASM", paths::floor_wasm().display().to_string())
        .plugin_config(&json!({"mode": "header"}))
        .start(bootstrap::DEMO)
        .expect("envoy starts");
    let resp = HttpClient::new()
        .post_json(
            envoy.listen_addr(),
            "/v1/chat/completions",
            &[],
            &json!({"messages": []}),
        )
        .await
        .expect("answered");
    assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    let echo = resp.echo().expect("echo json");
    assert_eq!(echo.header("x-floor"), Some("1"));
    assert!(ranks.iter().any(|r| r.name() == echo.rank));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floor_body_mode_routes_through_original_dst_filter_state() {
    need_envoy_and_floor();
    let ranks = ranks(3);
    let target = &ranks[2];
    let envoy = builder_for(&ranks)
        .var("FILTER_WASM", paths::floor_wasm().display().to_string())
        .plugin_config(&json!({"mode": "body", "dst": target.addr().to_string()}))
        .start(bootstrap::ORIGINAL_DST)
        .expect("envoy starts");
    let client = HttpClient::new();
    for i in 0..5 {
        let body = json!({"i": i, "pad": "x".repeat(1000 * i)});
        let resp = client
            .send(
                envoy.listen_addr(),
                Request::post_json("/v1/responses", &body),
            )
            .await
            .expect("answered");
        assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
        assert_eq!(resp.echo().expect("echo").rank, target.name());
    }
}

/// The gateway benchmark's body floors (variants h, l, m) in tether's own
/// chain, through real Envoy: each hands its key to `header_mutation` through
/// filter state; `body-key` (m) keys by the hash of the body's
/// `prompt_cache_key`, also past the 32 KiB where only the tail is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_body_floors_hand_their_keys_through_tethers_chain() {
    need_envoy_and_floor();
    let ranks = ranks(4);
    let mut builder = tether_e2e::Envoy::builder();
    for (i, r) in ranks.iter().enumerate() {
        builder = builder.var(format!("UP_{i}_PORT"), r.addr().port().to_string());
    }
    let chain = include_str!("../../../../envoy/bench/body-floor-chain.yaml");
    let hashed = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(b"run-7"));
    let client = HttpClient::new();
    for (config, want) in [
        (json!({"mode": "body-state", "key": "k-h"}), "k-h"),
        (json!({"mode": "body-read", "key": "k-l"}), "k-l"),
        (
            json!({"mode": "body-key", "field": "prompt_cache_key"}),
            hashed.as_str(),
        ),
    ] {
        let envoy = builder
            .clone()
            .plugin_config(&config)
            .start(chain)
            .expect("envoy starts");
        for pad in [100, 100_000] {
            // A string that names the field earlier in the body: the last one counts.
            let body = json!({
                "messages": [{"role": "user", "content": format!("\"prompt_cache_key\":\"decoy\" {}", "x".repeat(pad))}],
                "prompt_cache_key": "run-7",
            });
            let resp = client
                .post_json(envoy.listen_addr(), "/v1/chat/completions", &[], &body)
                .await
                .expect("answered");
            assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
            let echo = resp.echo().expect("echo json");
            assert_eq!(
                echo.header("x-tether-key"),
                Some(want),
                "{config} pad {pad}"
            );
        }
    }
}
