//! The other bootstraps: ORIGINAL_DST pick, hash mode (MAGLEV + bounded load),
//! one vLLM server with data parallelism.

use crate::support::*;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::bootstrap;
use tether_e2e::echo::DELAY_HEADER;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn original_dst_cluster_follows_the_pick_on_both_paths() {
    let f = Fleet::pick(
        bootstrap::ORIGINAL_DST,
        3,
        &[],
        json!({"fallbacks": 0}),
        &[],
    );
    let mut used = BTreeSet::new();
    for s in 0..12 {
        let conv = Conversation::new(Api::Chat, "sys", &[], &format!("task {s}"));
        for req in [
            header_turn(&conv, &format!("od-{s}"), None),
            body_turn(&conv, &[("session_id", json!(format!("od-{s}")))]),
        ] {
            let e = f.echo(req).await;
            let dst = e
                .header("x-gateway-destination-endpoint")
                .unwrap_or_default()
                .to_owned();
            assert_eq!(
                dst,
                f.rank(&e.rank).addr().to_string(),
                "upstream is the picked ip:port"
            );
            used.insert(e.rank.clone());
        }
    }
    assert!(used.len() >= 2, "picks spread: {used:?}");

    // Filter state alone: with the header source switched off, only
    // envoy.network.transport_socket.original_dst_address can name the upstream
    // (body path only; the header path has no filter state to offer).
    let state_only = bootstrap::ORIGINAL_DST
        .replace("use_http_header: true", "use_http_header: false")
        .replace("http_header_name: x-gateway-destination-endpoint", "");
    assert_ne!(state_only, bootstrap::ORIGINAL_DST);
    let Fleet { ranks, envoy, .. } = f;
    drop(envoy);
    // The cluster reads the filter state only: output `original_dst` must be on.
    let cfg = json!({"mode": "pick", "fallbacks": 0, "endpoints": endpoints(&ranks, &[]),
        "outputs": ["all", "original_dst"]});
    let f = Fleet::start(ranks, &state_only, &cfg, &[]);
    let mut used = BTreeSet::new();
    for s in 0..12 {
        let conv = Conversation::new(Api::Responses, "sys", &[], &format!("task {s}"));
        let e = f
            .echo(body_turn(
                &conv,
                &[("prompt_cache_key", json!(format!("fs-{s}")))],
            ))
            .await;
        let dst = e
            .header("x-gateway-destination-endpoint")
            .unwrap_or_default()
            .to_owned();
        assert_eq!(
            dst,
            f.rank(&e.rank).addr().to_string(),
            "filter state picked the upstream"
        );
        used.insert(e.rank.clone());
    }
    assert!(used.len() >= 2, "filter-state picks spread: {used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_mode_maglev_sticks_spreads_and_bounds_load() {
    let f = Fleet::hash(4, json!({}));
    let mut by_session: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in 0..30 {
        let mut conv = Conversation::new(Api::Messages, "sys", &["Read"], &format!("task {s}"));
        for t in 0..3 {
            if t > 0 {
                conv.tool_round(&format!("t{t}"), "Read", json!({}), "ok");
            }
            let req = if s % 2 == 0 {
                header_turn(&conv, &format!("h-{s}"), None)
            } else {
                body_turn(
                    &conv,
                    &[("metadata", json!({"user_id": format!("user_session_{s}")}))],
                )
            };
            let e = f.echo(req).await;
            assert!(
                e.header("x-tether-key").is_some(),
                "hash mode emits the key"
            );
            assert!(
                e.header("x-gateway-destination-endpoint").is_none(),
                "hash mode does not pick"
            );
            by_session
                .entry(format!("s{s}"))
                .or_default()
                .insert(e.rank);
        }
    }
    for (s, ranks) in &by_session {
        assert_eq!(ranks.len(), 1, "{s} moved: {ranks:?}");
    }
    let used: BTreeSet<&String> = by_session.values().flatten().collect();
    assert!(
        used.len() >= 3,
        "30 sessions over 4 ranks use ≥ 3: {used:?}"
    );

    let spread = hot_key_spread(&f).await;
    println!("one hot key, 16 in flight, hash_balance_factor 150: {spread:?}");
    assert!(
        spread.len() >= 2,
        "bounded load spread a hot key: {spread:?}"
    );

    // Side by side: the same bootstrap without hash_balance_factor keeps the hot key on one rank.
    let unbounded = bootstrap::HASH.replace(
        "            consistent_hashing_lb_config:\n              hash_balance_factor: ${HASH_BALANCE_FACTOR:-150}\n",
        "",
    );
    assert_ne!(unbounded, bootstrap::HASH);
    let Fleet { ranks, envoy, .. } = f;
    drop(envoy);
    let plain = Fleet::start(ranks, &unbounded, &json!({"mode": "hash"}), &[]);
    let spread = hot_key_spread(&plain).await;
    println!("one hot key, 16 in flight, no bound: {spread:?}");
    assert_eq!(
        spread.len(),
        1,
        "plain MAGLEV keeps one key on one rank: {spread:?}"
    );
}

/// Sends 16 requests of ONE key, each held 800 ms by the rank, started 25 ms
/// apart (so the earlier ones are active upstream when the later ones are
/// placed); returns how many landed on each rank.
async fn hot_key_spread(f: &Fleet) -> BTreeMap<String, usize> {
    let conv = Conversation::new(Api::Chat, "sys", &[], "hot");
    let addr = f.envoy.listen_addr();
    let mut handles = Vec::new();
    for _ in 0..16 {
        let req = header_turn(&conv, "hot-session", None).header(DELAY_HEADER, "800");
        let client = f.client.clone();
        handles.push(tokio::spawn(async move { client.send(addr, req).await }));
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let mut out = BTreeMap::new();
    for h in handles {
        *out.entry(echo_of(h.await.expect("task").expect("answered")).rank)
            .or_insert(0) += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_data_parallel_rank_is_sticky_and_spread() {
    let f = Fleet::pick(bootstrap::VLLM_DP, 1, &[4], json!({}), &[]);
    let mut dp_used = BTreeSet::new();
    for s in 0..24 {
        let mut conv = Conversation::new(Api::Chat, "sys", &["bash"], &format!("job {s}"));
        let mut seen = BTreeSet::new();
        for t in 0..3 {
            if t > 0 {
                conv.tool_round(&format!("c{t}"), "bash", json!({}), "ok");
            }
            let req =
                header_turn(&conv, &format!("dp-{s}"), None).header("X-data-parallel-rank", "3");
            let e = f.echo(req).await;
            let dp: u32 = e
                .header("x-data-parallel-rank")
                .and_then(|d| d.parse().ok())
                .expect("x-data-parallel-rank set");
            assert!(dp < 4);
            seen.insert(dp);
        }
        assert_eq!(seen.len(), 1, "dp-{s} moved between DP ranks: {seen:?}");
        dp_used.extend(seen);
    }
    assert!(
        dp_used.len() >= 3,
        "24 sessions over 4 DP ranks: {dp_used:?}"
    );
}
