//! P/D roles over real HTTP: a decode rank sends the prefill leg to the
//! prefiller named by `x-prefiller-host-port`, on the same DP rank, and decodes
//! with the transferred KV; a failed leg falls back to a local prefill.

use crate::harness::{Server, chat, total, words};

const PREFILLER: &str = "x-prefiller-host-port";

#[tokio::test]
async fn a_decode_rank_prefills_on_the_named_prefiller_and_decodes_with_its_kv() {
    let prefill = Server::start(&["--role", "prefill", "--dp-size", "2"]).await;
    let decode = Server::start(&["--role", "decode", "--dp-size", "2"]).await;
    let body = chat(&words("pd", 800), &["go"], 6);
    let to = prefill.addr.to_string();
    let r = decode
        .post(
            "/v1/chat/completions",
            &[(PREFILLER, &to), ("x-data-parallel-rank", "1")],
            &body,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tether-prefilled-by"), Some(to.as_str()));
    let v = r.json();
    let u = &v["usage"];
    let prompt = u["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        u["completion_tokens"], 6,
        "the decode rank makes every token"
    );
    let t = &u["tether"];
    assert_eq!(t["dp_rank"], 1);
    // KV moves in full blocks (16 tokens); the partial last block is computed here.
    let computed = t["computed_tokens"].as_u64().unwrap();
    assert!((1..=16).contains(&computed), "computed {computed}");
    assert_eq!(t["transferred_tokens"].as_u64().unwrap(), prompt - computed);
    assert!(t["sim_transfer_ms"].as_f64().unwrap() > 0.0);
    // The prefiller served one token of the same prompt, on the same DP rank.
    let pm = prefill.metrics().await;
    let on = |dp: &str, name: &str| total(&pm, name, &[("engine", dp)]);
    assert_eq!(on("1", "vllm:prompt_tokens_total"), prompt as f64);
    assert_eq!(on("1", "vllm:generation_tokens_total"), 1.0);
    assert_eq!(on("0", "vllm:prompt_tokens_total"), 0.0);
    let dm = decode.metrics().await;
    let legs = |o: &str| total(&dm, "tether_rank_prefill_legs_total", &[("outcome", o)]);
    assert_eq!((legs("ok"), legs("failed")), (1.0, 0.0));
}

#[tokio::test]
async fn the_prefill_leg_counts_in_the_reported_ttft() {
    // At --speedup 1 the leg's wall time is the prefiller's simulated prefill.
    let prefill = Server::start(&["--role", "prefill", "--speedup", "1"]).await;
    let decode = Server::start(&["--role", "decode", "--speedup", "1"]).await;
    let body = chat(&words("ttft", 3000), &["go"], 2);
    let alone = prefill
        .post("/v1/chat/completions", &[], &body)
        .await
        .json();
    let leg_ttft = alone["usage"]["tether"]["sim_ttft_ms"].as_f64().unwrap();
    let to = prefill.addr.to_string();
    let r = decode
        .post(
            "/v1/chat/completions",
            &[(PREFILLER, &to)],
            &chat(&words("ttft2", 3000), &["go"], 2),
        )
        .await
        .json();
    let ttft = r["usage"]["tether"]["sim_ttft_ms"].as_f64().unwrap();
    assert!(
        ttft >= leg_ttft * 0.9,
        "P/D TTFT {ttft} ms should include the prefill leg (~{leg_ttft} ms)"
    );
}

#[tokio::test]
async fn a_prefill_rank_answers_one_token() {
    let prefill = Server::start(&["--role", "prefill"]).await;
    let r = prefill
        .post("/v1/chat/completions", &[], &chat("a b c", &["d"], 50))
        .await
        .json();
    assert_eq!(r["usage"]["completion_tokens"], 1);
}

#[tokio::test]
async fn a_failed_leg_prefills_locally_and_is_counted() {
    // A port nothing listens on: bind one, then drop it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let to = dead.local_addr().unwrap().to_string();
    drop(dead);
    let decode = Server::start(&["--role", "decode"]).await;
    let r = decode
        .post(
            "/v1/chat/completions",
            &[(PREFILLER, &to)],
            &chat(&words("dead", 200), &["go"], 2),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tether-prefilled-by"), None);
    let v = r.json();
    assert_eq!(v["usage"]["tether"]["transferred_tokens"], 0);
    let dm = decode.metrics().await;
    assert_eq!(
        total(
            &dm,
            "tether_rank_prefill_legs_total",
            &[("outcome", "failed")]
        ),
        1.0
    );
}

#[tokio::test]
async fn a_bad_prefiller_header_is_refused_and_other_roles_ignore_it() {
    let decode = Server::start(&["--role", "decode"]).await;
    let body = chat("a b c", &["d"], 2);
    for bad in ["nowhere", "10.0.0.1", "10.0.0.1:99999"] {
        let r = decode
            .post("/v1/chat/completions", &[(PREFILLER, bad)], &body)
            .await;
        assert_eq!(r.status, 400, "{bad}");
        assert!(r.text().contains(PREFILLER), "{}", r.text());
    }
    let m = decode.metrics().await;
    assert_eq!(
        total(
            &m,
            "tether_rank_bad_requests_total",
            &[("reason", "bad_prefiller")]
        ),
        3.0
    );
    // A plain engine (role both) ignores the header, as vLLM does.
    let both = Server::start(&[]).await;
    let r = both
        .post("/v1/chat/completions", &[(PREFILLER, "nowhere")], &body)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["usage"]["tether"]["transferred_tokens"], 0);
}
