//! The retention policy through the server: hits, retention vs LRU, the host tier.

use crate::harness::{Server, chat, has, total, words};
use serde_json::{Value, json};

fn marker_headers(session: &str) -> Vec<(&'static str, String)> {
    vec![
        ("x-tether-session", session.to_owned()),
        ("x-tether-prompt-end", "1".to_owned()),
        ("x-tether-turn-kind", "tool".to_owned()),
    ]
}

async fn turn(s: &Server, session: Option<&str>, body: &Value) -> Value {
    let h = session.map(marker_headers).unwrap_or_default();
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = s.post("/v1/chat/completions", &h, body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["usage"].clone()
}

#[tokio::test]
async fn a_returning_turn_is_cached_and_starts_sooner() {
    let s = Server::start(&[]).await;
    let sys = words("agent", 3000);
    let u1 = turn(&s, Some("a1"), &chat(&sys, &["read the file"], 4)).await;
    let u2 = turn(
        &s,
        Some("a1"),
        &chat(&sys, &["read the file", "done", "now run the tests"], 4),
    )
    .await;
    let (c1, c2) = (
        u1["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        u2["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    );
    assert_eq!(c1, 0);
    let p1 = u1["prompt_tokens"].as_u64().unwrap();
    assert!(
        c2 >= p1 / 16 * 16 - 16,
        "cached {c2} of the first turn's {p1}"
    );
    let (t1, t2) = (
        u1["tether"]["sim_ttft_ms"].as_f64().unwrap(),
        u2["tether"]["sim_ttft_ms"].as_f64().unwrap(),
    );
    assert!(t2 * 5.0 < t1, "ttft {t1} then {t2}");
    assert_eq!(u2["tether"]["device_cached_tokens"].as_u64(), Some(c2));
}

/// Adds the markers as body fields (`kv_transfer_params.tether`) instead of headers.
fn with_body_marker(mut body: Value, session: &str) -> Value {
    body["kv_transfer_params"] =
        json!({"tether": {"session": session, "prompt_end": "1", "turn_kind": "user"}});
    body
}

async fn returning_hit_after_flood(cache: &str, in_body: bool) -> u64 {
    let s = Server::start(&["--cache", cache, "--kv-tokens", "8192"]).await;
    let sys = words("keep", 3000);
    let (first, back) = (
        chat(&sys, &["start"], 2),
        chat(&sys, &["start", "ok", "continue"], 2),
    );
    if in_body {
        turn(&s, None, &with_body_marker(first, "b7")).await;
    } else {
        turn(&s, Some("b7"), &first).await;
    }
    // 20 unrelated prompts of ~1000 tokens: 2.5× the device, no markers.
    for i in 0..20 {
        let flood = chat(&words(&format!("flood{i}x"), 1000), &["go"], 2);
        turn(&s, None, &flood).await;
    }
    let u = if in_body {
        turn(&s, None, &with_body_marker(back, "b7")).await
    } else {
        turn(&s, Some("b7"), &back).await
    };
    u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn retention_keeps_a_session_through_a_flood_that_lru_loses() {
    let lru = returning_hit_after_flood("lru", false).await;
    let kept = returning_hit_after_flood("retention", false).await;
    assert_eq!(lru, 0);
    assert!(kept >= 2992, "retention served {kept} cached tokens");
    // The same through body markers (engines that see no custom headers).
    let kept = returning_hit_after_flood("retention", true).await;
    assert!(
        kept >= 2992,
        "retention (body markers) served {kept} cached tokens"
    );
}

#[tokio::test]
async fn cache_salt_separates_tenants() {
    let s = Server::start(&[]).await;
    let sys = words("salted", 600);
    let salted = |salt: &str| {
        let mut b = chat(&sys, &["q"], 1);
        b["cache_salt"] = json!(salt);
        b
    };
    turn(&s, None, &salted("tenant-a")).await;
    let other = turn(&s, None, &salted("tenant-b")).await;
    assert_eq!(other["prompt_tokens_details"]["cached_tokens"], 0);
    let unsalted = turn(&s, None, &chat(&sys, &["q"], 1)).await;
    assert_eq!(unsalted["prompt_tokens_details"]["cached_tokens"], 0);
    let same = turn(&s, None, &salted("tenant-a")).await;
    assert!(
        same["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 592
    );
}

/// A rank with 4096 device tokens and a 2 GiB host tier.
async fn host_tier_server(extra: &[&str]) -> Server {
    let base = [
        "--cache",
        "retention-host",
        "--kv-tokens",
        "4096",
        "--host-gib",
        "2",
    ];
    Server::start(&[&base[..], extra].concat()).await
}

#[tokio::test]
async fn host_tier_restores_show_in_usage_and_metrics() {
    // 4096 device tokens; each session retains ~1280; the fourth pushes the first out.
    let s = host_tier_server(&[]).await;
    let first = words("first", 1270);
    turn(&s, Some("c1"), &chat(&first, &["a"], 1)).await;
    for i in 2..6 {
        turn(
            &s,
            Some(&format!("c{i}")),
            &chat(&words(&format!("other{i}x"), 1270), &["a"], 1),
        )
        .await;
    }
    let m = s.metrics().await;
    assert!(total(&m, "tether_offloaded_total", &[]) >= 1.0);
    let u = turn(&s, Some("c1"), &chat(&first, &["a", "b", "c"], 1)).await;
    let restored = u["tether"]["restored_tokens"].as_u64().unwrap();
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(restored >= 1264, "{u}");
    assert_eq!(
        cached,
        restored + u["tether"]["device_cached_tokens"].as_u64().unwrap()
    );
    assert!(u["tether"]["sim_restore_ms"].as_f64().unwrap() > 0.0);
    let m = s.metrics().await;
    assert_eq!(
        total(&m, "tether_restored_blocks_total", &[]),
        (restored / 16) as f64
    );
    assert_eq!(
        total(&m, "vllm:external_prefix_cache_hits_total", &[]),
        restored as f64
    );
    assert_eq!(
        total(
            &m,
            "vllm:prompt_tokens_by_source_total",
            &[("source", "external_kv_transfer")]
        ),
        restored as f64
    );
    assert!(total(&m, "tether_restore_seconds_total", &[]) > 0.0);
    assert!(has(&m, "tether_host_bytes_used"));
}

#[tokio::test]
async fn a_prefetched_tool_turn_returns_to_its_state_on_the_device() {
    // 4096 device tokens: a 2,900-token request without a marker pushes session e1's
    // ~1,300 retained tokens to the host tier; when it finishes, its blocks are free
    // room, and e1's tool turn (its gap learned from e1's first return) comes back.
    let s = host_tier_server(&["--prefetch"]).await;
    let c = s.get("/tether/config").await.json();
    assert_eq!(c["serving"]["prefetch"], true);
    let first = words("first", 1270);
    turn(&s, Some("e1"), &chat(&first, &["a"], 1)).await;
    // A tool gap of ~1 s: the rank learns it (one sample: overdue after ~3 s).
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    turn(&s, Some("e1"), &chat(&first, &["a", "b", "c"], 1)).await;
    turn(&s, None, &chat(&words("flood", 2900), &["x"], 1)).await;
    let m = s.metrics().await;
    assert!(total(&m, "tether_offloaded_total", &[]) >= 1.0);
    assert_eq!(total(&m, "tether_prefetched_total", &[]), 1.0);
    let u = turn(&s, Some("e1"), &chat(&first, &["a", "b", "c", "d", "e"], 1)).await;
    assert_eq!(u["tether"]["restored_tokens"], 0, "{u}");
    assert!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 1264,
        "{u}"
    );
    let m = s.metrics().await;
    assert_eq!(total(&m, "tether_prefetch_used_total", &[]), 1.0);
    assert_eq!(total(&m, "tether_prefetch_wasted_total", &[]), 0.0);
}
