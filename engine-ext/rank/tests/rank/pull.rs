//! State pull over real HTTP (docs/rank.md "State pull"): a migrated key's new
//! home leases the retained state from the old holder named by
//! `x-tether-pull-from` and decodes with it as transferred KV, while the
//! holder's engine schedules nothing; every failure (dead holder, nothing
//! held, another model, a hung holder, a lease too short for the transfer)
//! computes the prompt here and is counted, never an error; bad values are
//! refused; the lease endpoints answer as the connector's do.

use crate::harness::{Sample, Server, chat, total, words};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const PULL_FROM: &str = "x-tether-pull-from";
const MARKERS: [(&str, &str); 3] = [
    ("x-tether-session", "9b"),
    ("x-tether-prompt-end", "1"),
    ("x-tether-turn-kind", "tool"),
];

/// The session's first turn on `home` (retained there): its prompt tokens.
async fn first_turn(home: &Server, sys: &str) -> u64 {
    let r = home
        .post("/v1/chat/completions", &MARKERS, &chat(sys, &["read"], 2))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
}

/// The session's next turn on `new`, told to pull from `from`.
async fn next_turn(new: &Server, sys: &str, from: &str) -> crate::harness::Reply {
    let mut h = MARKERS.to_vec();
    h.push((PULL_FROM, from));
    let r = new
        .post(
            "/v1/chat/completions",
            &h,
            &chat(sys, &["read", "ok", "next"], 2),
        )
        .await;
    assert_eq!(r.status, 200, "never an error to the client: {}", r.text());
    r
}

fn pulls(m: &[Sample], outcome: &str) -> f64 {
    total(m, "tether_rank_pulls_total", &[("outcome", outcome)])
}

fn leases(m: &[Sample], event: &str) -> f64 {
    total(m, "tether_rank_pull_leases_total", &[("event", event)])
}

/// Waits (the release is sent once the answer is made) until `event` reaches `want`.
async fn wait_leases(s: &Server, event: &str, want: f64) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = s.metrics().await;
        if leases(&m, event) >= want || Instant::now() > deadline {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_migrated_turn_pulls_the_state_and_the_old_home_schedules_nothing() {
    let (old, new) = (Server::start(&[]).await, Server::start(&[]).await);
    let sys = words("pull", 3000);
    let p1 = first_turn(&old, &sys).await;
    let before = old.metrics().await;
    let from = old.addr.to_string();
    let r = next_turn(&new, &sys, &from).await;
    assert_eq!(r.header("x-tether-pulled-from"), Some(from.as_str()));
    let u = &r.json()["usage"];
    let t = &u["tether"];
    // The first turn's full blocks crossed the link; the rest is computed here.
    let held = p1 / 16 * 16;
    assert_eq!(t["transferred_tokens"].as_u64(), Some(held), "{u}");
    assert_eq!(
        t["computed_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() - held
    );
    let transfer = t["sim_transfer_ms"].as_f64().unwrap();
    // 3,000 tokens × 128 KiB at 50 GB/s ≈ 7.9 ms of link time, in the TTFT.
    assert!(transfer > 5.0, "{t}");
    assert!(t["sim_ttft_ms"].as_f64().unwrap() > transfer, "{t}");
    let nm = new.metrics().await;
    assert_eq!(pulls(&nm, "ok"), 1.0);
    // The holder granted one lease, which the new home released; its engine
    // scheduled nothing for the pull.
    let om = wait_leases(&old, "released", 1.0).await;
    assert_eq!(
        (leases(&om, "granted"), leases(&om, "released")),
        (1.0, 1.0)
    );
    assert_eq!(total(&om, "tether_rank_pull_leases_active", &[]), 0.0);
    for m in [
        "vllm:prompt_tokens_total",
        "tether_rank_steps_total",
        "vllm:request_success_total",
    ] {
        assert_eq!(total(&om, m, &[]), total(&before, m, &[]), "{m}");
    }
    // The new home retains the turn as its own.
    let l: tether_rank::load::LoadReport =
        serde_json::from_slice(&new.get("/load").await.body).unwrap();
    let res = tether_placement::Resident::decode(&l.residency.unwrap()).unwrap();
    assert!(
        res.get(tether_placement::resident_key(0, 0x9b, 0))
            .is_some()
    );
    // Its next turn there is a plain hit: nothing to pull (held here).
    let again = next_turn(&new, &sys, &from).await;
    assert_eq!(again.header("x-tether-pulled-from"), None);
    assert_eq!(pulls(&new.metrics().await, "held_here"), 1.0);
}

/// The new home holds an older state of the key (its turn 1; turn 2 was
/// served and retained on the old holder): it pulls only the blocks past
/// what it has, and serves the rest from its own cache.
#[tokio::test]
async fn an_older_state_here_pulls_only_the_newer_blocks() {
    let (old, new) = (Server::start(&[]).await, Server::start(&[]).await);
    let sys = words("older", 1000);
    let p1 = first_turn(&new, &sys).await;
    let long = words("t2-", 400);
    let r2 = old
        .post(
            "/v1/chat/completions",
            &MARKERS,
            &chat(&sys, &["read", "ok", &long], 2),
        )
        .await;
    let p2 = r2.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let from = old.addr.to_string();
    let mut h = MARKERS.to_vec();
    h.push((PULL_FROM, &from));
    let r3 = new
        .post(
            "/v1/chat/completions",
            &h,
            &chat(&sys, &["read", "ok", &long, "done", "go on"], 2),
        )
        .await;
    assert_eq!(r3.header("x-tether-pulled-from"), Some(from.as_str()));
    let t = &r3.json()["usage"]["tether"];
    assert_eq!(
        t["device_cached_tokens"].as_u64(),
        Some(p1 / 16 * 16),
        "{t}"
    );
    assert_eq!(
        t["transferred_tokens"].as_u64(),
        Some(p2 / 16 * 16 - p1 / 16 * 16),
        "{t}"
    );
}

#[tokio::test]
async fn a_streamed_pull_reports_the_same_transfer() {
    let (old, new) = (Server::start(&[]).await, Server::start(&[]).await);
    let sys = words("stream", 1000);
    let p1 = first_turn(&old, &sys).await;
    let mut body = chat(&sys, &["read", "ok", "next"], 3);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let from = old.addr.to_string();
    let mut h = MARKERS.to_vec();
    h.push((PULL_FROM, &from));
    let r = new.post("/v1/chat/completions", &h, &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-tether-pulled-from"), Some(from.as_str()));
    let usage = crate::harness::sse(&r.body)
        .into_iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(&d).ok())
        .find(|v| v["usage"].is_object())
        .expect("a usage chunk");
    assert_eq!(
        usage["usage"]["tether"]["transferred_tokens"].as_u64(),
        Some(p1 / 16 * 16)
    );
}

#[tokio::test]
async fn a_failed_pull_computes_the_prompt_here_and_is_counted() {
    let sys = words("fail", 600);
    let recomputed = |r: &crate::harness::Reply| {
        assert_eq!(r.header("x-tether-pulled-from"), None);
        let t = &r.json()["usage"]["tether"];
        assert_eq!(t["transferred_tokens"], 0, "{t}");
        assert!(t["computed_tokens"].as_u64().unwrap() > 600, "{t}");
    };
    // A dead holder: a port nothing listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let to = dead.local_addr().unwrap().to_string();
    drop(dead);
    let new = Server::start(&[]).await;
    recomputed(&next_turn(&new, &sys, &to).await);
    assert_eq!(pulls(&new.metrics().await, "failed"), 1.0);
    // A holder that holds nothing of it: an empty grant, no lease.
    let idle = Server::start(&[]).await;
    let new = Server::start(&[]).await;
    recomputed(&next_turn(&new, &sys, &idle.addr.to_string()).await);
    assert_eq!(pulls(&new.metrics().await, "not_held"), 1.0);
    let im = idle.metrics().await;
    assert_eq!((leases(&im, "empty"), leases(&im, "granted")), (1.0, 0.0));
    // Another KV shape (block size): the holder refuses (409).
    let old = Server::start(&[]).await;
    first_turn(&old, &sys).await;
    let other = Server::start(&["--block-size", "32"]).await;
    recomputed(&next_turn(&other, &sys, &old.addr.to_string()).await);
    assert_eq!(pulls(&other.metrics().await, "failed"), 1.0);
    assert_eq!(leases(&old.metrics().await, "refused"), 1.0);
    // A lease shorter than the transfer would take on a slow link: released
    // unread, computed here.
    let short = Server::start(&["--pull-lease-ms", "1"]).await;
    first_turn(&short, &sys).await;
    let slow = Server::start(&["--kv-link-gbps", "0.01"]).await;
    recomputed(&next_turn(&slow, &sys, &short.addr.to_string()).await);
    assert_eq!(pulls(&slow.metrics().await, "expired"), 1.0);
    assert_eq!(leases(&short.metrics().await, "granted"), 1.0);
}

#[tokio::test]
async fn a_hung_holder_times_out_and_the_prompt_is_computed() {
    // Accepts, reads, never answers.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let to = hung.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = hung.accept().await {
            held.push(c);
        }
    });
    let new = Server::start(&["--pull-timeout-ms", "200"]).await;
    let started = Instant::now();
    let r = next_turn(&new, &words("hung", 100), &to).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r.json()["usage"]["tether"]["transferred_tokens"], 0);
    let nm = new.metrics().await;
    assert_eq!(pulls(&nm, "timeout"), 1.0);
    // The wait counts in the reported latency (200 ms of wall time at 1000×).
    assert!(r.json()["usage"]["tether"]["sim_ttft_ms"].as_f64().unwrap() > 150_000.0);
}

#[tokio::test]
async fn a_bad_pull_from_is_refused_and_a_prefill_rank_ignores_it() {
    let r = Server::start(&[]).await;
    let body = chat("a b c", &["d"], 2);
    for bad in ["nowhere", "10.0.0.1", "10.0.0.1:0", "10.0.0.1:1,10.0.0.2:1"] {
        let resp = r
            .post("/v1/chat/completions", &[(PULL_FROM, bad)], &body)
            .await;
        assert_eq!(resp.status, 400, "{bad}");
        assert!(resp.text().contains(PULL_FROM), "{}", resp.text());
    }
    let mut b = body.clone();
    b["kv_transfer_params"] = json!({"tether": {"session": "1", "pull_from": "nowhere"}});
    assert_eq!(r.post("/v1/chat/completions", &[], &b).await.status, 400);
    b["kv_transfer_params"] = json!({"tether": {"session": "1", "pull_from": 7}});
    assert_eq!(r.post("/v1/chat/completions", &[], &b).await.status, 400);
    let m = r.metrics().await;
    let bad = total(
        &m,
        "tether_rank_bad_requests_total",
        &[("reason", "bad_pull_from")],
    );
    assert_eq!(bad, 6.0);
    // A prefill rank answers its leg and never pulls.
    let p = Server::start(&["--role", "prefill"]).await;
    let resp = p
        .post("/v1/chat/completions", &[(PULL_FROM, "nowhere")], &body)
        .await;
    assert_eq!(resp.status, 200);
}

#[tokio::test]
async fn the_lease_endpoints_answer_as_the_connectors_do() {
    let old = Server::start(&[]).await;
    let sys = words("lease", 100);
    first_turn(&old, &sys).await;
    let post = |path: &'static str, v: Value| {
        let old = &old;
        async move { old.post(path, &[], &v).await }
    };
    // The fingerprint a puller of the same profile and block size sends.
    let cfg = old.get("/tether/config").await.json();
    let fp = format!(
        "tether-rank/{}/16/{}",
        cfg["profile"]["hash"].as_str().unwrap(),
        cfg["profile"]["kv_bytes_per_token"]
    );
    let key = format!("{:016x}", tether_placement::resident_key(0, 0x9b, 0));
    // Hashes that match nothing: an empty grant.
    let r = post(
        "/pull/lease",
        json!({"key": key, "hashes": ["0".repeat(32)], "start": 0, "fingerprint": fp}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["lease"], Value::Null);
    assert_eq!(r.json()["blocks"], json!([]));
    // Bad calls.
    assert_eq!(post("/pull/lease", json!({"key": "zz"})).await.status, 400);
    assert_eq!(
        post(
            "/pull/lease",
            json!({"key": key, "hashes": [], "fingerprint": "x"})
        )
        .await
        .status,
        409
    );
    assert_eq!(old.get("/pull/lease").await.status, 405);
    assert_eq!(post("/pull/nope", json!({})).await.status, 404);
    let r = post("/pull/release", json!({"lease": "00"})).await;
    assert_eq!(
        (r.status.as_u16(), r.json()["error"].clone()),
        (404, json!("unknown lease"))
    );
    assert_eq!(post("/pull/renew", json!({})).await.status, 400);
    let m = old.metrics().await;
    assert_eq!(leases(&m, "refused"), 5.0);
    assert_eq!(leases(&m, "empty"), 1.0);
}
