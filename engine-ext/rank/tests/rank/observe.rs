//! `/metrics` and `/load` parse and agree with what requests were told.

use crate::harness::{Server, chat, has, total, words};
use tether_rank::load::LoadReport;

#[tokio::test]
async fn metrics_use_vllm_names_and_match_usage() {
    let s = Server::start(&[]).await;
    let sys = words("obs", 500);
    let mut cached = 0;
    let mut prompt = 0;
    let mut e2e_ms = 0.0;
    for t in 0..4 {
        let turns: Vec<String> = (0..=t).map(|i| format!("turn {i}")).collect();
        let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
        let v = s
            .post("/v1/chat/completions", &[], &chat(&sys, &turns, 3))
            .await
            .json();
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap();
        e2e_ms += v["usage"]["tether"]["sim_e2e_ms"].as_f64().unwrap();
    }
    let m = s.metrics().await;
    // One request at a time: the engine is busy exactly while each runs.
    let busy = total(&m, "tether_rank_busy_seconds_total", &[]) * 1000.0;
    assert!(
        (busy - e2e_ms).abs() <= 0.01 * e2e_ms + 0.01,
        "busy {busy} ms vs the requests' {e2e_ms} ms"
    );
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "tether_retained_total",
        "tether_offloaded_total",
        "tether_restored_blocks_total",
        "tether_restore_misses_total",
    ] {
        assert!(has(&m, name), "{name} missing");
    }
    assert_eq!(
        total(&m, "vllm:prefix_cache_hits_total", &[]),
        cached as f64
    );
    assert_eq!(
        total(&m, "vllm:prefix_cache_queries_total", &[]),
        prompt as f64
    );
    assert_eq!(
        total(&m, "vllm:prompt_tokens_cached_total", &[]),
        cached as f64
    );
    assert_eq!(total(&m, "vllm:generation_tokens_total", &[]), 12.0);
    assert_eq!(
        total(&m, "vllm:time_to_first_token_seconds_count", &[]),
        4.0
    );
    assert_eq!(
        total(
            &m,
            "vllm:request_success_total",
            &[("finished_reason", "stop")]
        ),
        4.0
    );
    let running = m
        .iter()
        .find(|s| s.name == "vllm:num_requests_running")
        .unwrap();
    assert_eq!(running.labels.get("engine").map(String::as_str), Some("0"));
    assert!(running.labels.contains_key("model_name"));
}

#[tokio::test]
async fn the_load_endpoint_reports_queues_under_load() {
    // Real time, one sequence at a time: concurrent requests queue (each runs ~0.5 s).
    let s = std::sync::Arc::new(
        Server::start(&[
            "--speedup",
            "1",
            "--max-num-seqs",
            "1",
            "--max-num-batched-tokens",
            "2048",
        ])
        .await,
    );
    let idle: LoadReport = serde_json::from_slice(&s.get("/load").await.body).unwrap();
    assert_eq!(idle.server_load, 0);
    assert_eq!(idle.ranks[0].running, 0);
    let mut tasks = Vec::new();
    for i in 0..4 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.post(
                "/v1/chat/completions",
                &[],
                &chat(&words(&format!("load{i}x"), 2000), &["go"], 150),
            )
            .await
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let busy = loop {
        let l: LoadReport = serde_json::from_slice(&s.get("/load").await.body).unwrap();
        if l.ranks[0].waiting >= 1 && l.ranks[0].running == 1 {
            break l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never saw a queue: {l:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    };
    assert!(busy.ranks[0].queued_prefill_tokens >= 2000);
    assert!(busy.ranks[0].kv_usage > 0.0);
    assert_eq!(
        busy.server_load,
        busy.ranks[0].running + busy.ranks[0].waiting
    );
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    let m = s.metrics().await;
    assert!(total(&m, "vllm:request_queue_time_seconds_sum", &[]) > 0.0);
}

#[tokio::test]
async fn tokens_are_not_released_before_their_simulated_time() {
    // At 10× a ~4,000-token prompt and 40 tokens take ~150 ms simulated, 15 ms of wall time.
    let s = Server::start(&["--speedup", "10"]).await;
    let body = chat(&words("wall", 4000), &["go"], 40);
    let t0 = std::time::Instant::now();
    let r = s.post("/v1/chat/completions", &[], &body).await;
    let wall_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let sim_e2e: f64 = r.header("x-tether-sim-e2e-ms").unwrap().parse().unwrap();
    assert!(sim_e2e > 100.0, "{sim_e2e}");
    assert!(
        wall_ms >= sim_e2e / 10.0 - 1.0,
        "answered after {wall_ms} ms wall, simulated {sim_e2e} ms at 10×"
    );
}
