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

#[tokio::test]
async fn a_leg_that_dies_midway_prefills_locally_and_is_counted() {
    // A prefiller that accepts, reads the request, starts a 200 answer and hangs up.
    let half = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to = half.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut c, _)) = half.accept().await {
            let mut buf = vec![0u8; 1 << 16];
            let _ = c.read(&mut buf).await;
            let _ = c
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 500\r\n\r\n{\"id\":")
                .await;
        }
    });
    let decode = Server::start(&["--role", "decode"]).await;
    let r = decode
        .post(
            "/v1/chat/completions",
            &[(PREFILLER, &to)],
            &chat(&words("midway", 300), &["go"], 2),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tether-prefilled-by"), None);
    let t = &r.json()["usage"]["tether"];
    assert_eq!(t["transferred_tokens"], 0);
    assert!(
        t["computed_tokens"].as_u64().unwrap() > 300,
        "recomputed here"
    );
    let dm = decode.metrics().await;
    let legs = |o: &str| total(&dm, "tether_rank_prefill_legs_total", &[("outcome", o)]);
    assert_eq!((legs("ok"), legs("failed")), (0.0, 1.0));
}

#[tokio::test]
async fn a_migrated_turn_is_transferred_from_the_old_home_not_recomputed() {
    // The old home retained the session's turn; the next turn goes to another rank
    // with the old home as its prefiller (what the gateway's migration sends).
    let old = Server::start(&["--role", "decode"]).await;
    let new = Server::start(&["--role", "decode"]).await;
    let sys = words("migrate", 3000);
    let markers = [
        ("x-tether-session", "9a"),
        ("x-tether-prompt-end", "1"),
        ("x-tether-turn-kind", "tool"),
    ];
    let r1 = old
        .post("/v1/chat/completions", &markers, &chat(&sys, &["read"], 2))
        .await;
    assert_eq!(r1.status, 200);
    let p1 = r1.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let to = old.addr.to_string();
    let mut h = markers.to_vec();
    h.push((PREFILLER, &to));
    let r2 = new
        .post(
            "/v1/chat/completions",
            &h,
            &chat(&sys, &["read", "ok", "next"], 2),
        )
        .await;
    assert_eq!(r2.status, 200, "{}", r2.text());
    assert_eq!(r2.header("x-tether-prefilled-by"), Some(to.as_str()));
    let u = &r2.json()["usage"];
    let t = &u["tether"];
    let prompt = u["prompt_tokens"].as_u64().unwrap();
    let computed = t["computed_tokens"].as_u64().unwrap();
    assert!(
        computed <= 16,
        "only the partial last block is computed here: {computed}"
    );
    assert_eq!(t["transferred_tokens"].as_u64().unwrap(), prompt - computed);
    // The old home's leg hit its retained state: it computed only the new tokens.
    let om = old.metrics().await;
    let hits = total(&om, "vllm:prefix_cache_hits_total", &[]);
    assert!(
        hits >= (p1 / 16 * 16 - 16) as f64,
        "old home hit {hits} of {p1}"
    );
    // And the new home now retains the session itself.
    let l: tether_rank::load::LoadReport =
        serde_json::from_slice(&new.get("/load").await.body).unwrap();
    let res = tether_placement::Resident::decode(&l.residency.unwrap()).unwrap();
    assert!(
        res.get(tether_placement::resident_key(0, 0x9a, 0))
            .is_some()
    );
}
