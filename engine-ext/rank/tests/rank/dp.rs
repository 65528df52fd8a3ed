//! Data-parallel ranks in one process: independent caches, addressed by header.

use crate::harness::{Server, chat, total, words};

#[tokio::test]
async fn dp_ranks_have_their_own_caches() {
    let s = Server::start(&["--dp-size", "2"]).await;
    let sys = words("dp", 800);
    let b1 = chat(&sys, &["one"], 2);
    let b2 = chat(&sys, &["one", "ok", "two"], 2);
    let r = s
        .post(
            "/v1/chat/completions",
            &[("x-data-parallel-rank", "0")],
            &b1,
        )
        .await;
    assert_eq!(r.header("x-tether-rank-dp"), Some("0"));
    // Rank 1 never saw the prompt; rank 0 did.
    let other = s
        .post(
            "/v1/chat/completions",
            &[("x-data-parallel-rank", "1")],
            &b2,
        )
        .await
        .json();
    assert_eq!(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(other["usage"]["tether"]["dp_rank"], 1);
    let same = s
        .post(
            "/v1/chat/completions",
            &[("x-data-parallel-rank", "0")],
            &b2,
        )
        .await
        .json();
    assert!(
        same["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 784
    );
    let m = s.metrics().await;
    let hits = |e: &str| total(&m, "vllm:prefix_cache_hits_total", &[("engine", e)]);
    assert!(hits("0") >= 784.0);
    assert_eq!(hits("1"), 0.0);
    let load = s.get("/load").await.json();
    assert_eq!(load["ranks"].as_array().unwrap().len(), 2);
    // No header: the least loaded rank serves it.
    let r = s.post("/v1/chat/completions", &[], &b1).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn a_bad_dp_rank_is_refused_not_misrouted() {
    let s = Server::start(&["--dp-size", "2"]).await;
    let b = chat("hello", &["x"], 1);
    for bad in ["2", "-1", "x", "99999999999999999999999", ""] {
        let r = s
            .post("/v1/chat/completions", &[("x-data-parallel-rank", bad)], &b)
            .await;
        assert_eq!(r.status, 400, "{bad:?}");
        assert_eq!(r.json()["error"]["type"], "BadRequestError");
    }
    let r = s
        .post(
            "/v1/chat/completions",
            &[("x-data-parallel-rank", "0"), ("x-data-parallel-rank", "1")],
            &b,
        )
        .await;
    assert_eq!(r.status, 400);
    let m = s.metrics().await;
    assert_eq!(
        total(
            &m,
            "tether_rank_bad_requests_total",
            &[("reason", "bad_dp_rank")]
        ),
        6.0
    );
}
