//! Rebalancing in tool gaps through a real Envoy (`envoy/demo.yaml`, pick
//! mode, body path, load + residency) in front of three real `tether-rank
//! --rebalance --peers …` processes (docs/rank.md "Rebalancing in tool
//! gaps"): a session whose home is KV-heavy ends a tool turn; during the gap
//! the home's state is adopted by a cooler candidate, both list it; with the
//! home now busier, the gateway's rule 1 sends the next turn to the new
//! holder, which serves it from its device (a hit, not a transfer), and the
//! old holder forgets its copy.

use crate::pd::{chat, words};
use crate::support::*;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::{Envoy, HttpClient, Request, Response, SimRank, bootstrap};

/// A rebalancing rank at `me` among `all`: a small device (a few sessions
/// make it KV-heavy), 20× time (a tool retention lasts 6 s of wall time),
/// answers of 2 tokens unless asked, peers polled every 50 ms.
fn start(me: SocketAddr, all: &[SocketAddr]) -> SimRank {
    let profile = tether_e2e::paths::workspace_root()
        .join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json");
    let peers: Vec<String> = all.iter().map(|a| a.to_string()).collect();
    let args: Vec<String> = [
        "--profile",
        &profile.display().to_string(),
        "--listen",
        &me.to_string(),
        "--speedup",
        "20",
        "--kv-tokens",
        "16384",
        "--default-max-tokens",
        "2",
        "--max-num-seqs",
        "64",
        "--rebalance",
        "--peers",
        &peers.join(" "),
        "--resident-floor",
        "4",
        "--peer-poll-ms",
        "50",
    ]
    .map(str::to_owned)
    .to_vec();
    SimRank::start(&args).expect("tether-rank --rebalance starts")
}

fn event(r: &SimRank, e: &str) -> f64 {
    r.metrics()
        .expect("rank metrics")
        .get("tether_rank_rebalance_total", &[("event", e)])
        .unwrap_or(0.0)
}

/// Waits (10 s at most) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what} never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Entries of a rank's residency summary.
fn entries(r: &SimRank) -> usize {
    let l = r.load().expect("a load report");
    l["residency"]["tiers"].as_str().map_or(0, str::len)
}

async fn send(client: &HttpClient, to: SocketAddr, body: String) -> Response {
    let req = Request::post_bytes("/v1/chat/completions", "application/json", body);
    let r = client
        .send(to, req)
        .await
        .unwrap_or_else(|e| panic!("no answer: {e}"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r
}

fn usage(r: &Response) -> Value {
    r.json::<Value>().expect("a JSON answer")["usage"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalanced_session_is_served_from_its_new_holder_and_the_old_one_forgets_it() {
    need_envoy_and_filter();
    // Three ranks; the bootstrap's fourth upstream is a closed port the
    // filter never names.
    let addrs = tether_e2e::stack::free_ports(4).expect("free ports");
    let fleet = &addrs[..3];
    let ranks: Vec<SimRank> = fleet.iter().map(|a| start(*a, fleet)).collect();
    let eps: Vec<Value> = fleet
        .iter()
        .map(|a| json!({"address": a.to_string()}))
        .collect();
    // The ranks' --peers list these endpoints, in this order.
    let cfg = json!({"mode": "pick", "endpoints": eps, "outputs": ["pick", "retain", "key"],
                     "load": {"poll_ms": 50, "factor": 1.5, "floor": 4},
                     "residency": {"candidates": 3, "floor": 4}});
    let mut b = Envoy::builder().plugin_config(&cfg).concurrency(2);
    for (i, a) in addrs.iter().enumerate() {
        b = b
            .var(format!("RANK_{i}_IP"), a.ip().to_string())
            .var(format!("RANK_{i}_PORT"), a.port().to_string());
    }
    let envoy = b
        .start(bootstrap::DEMO)
        .unwrap_or_else(|e| panic!("envoy starts: {e}"));
    let stat = |name: &str| counter(&envoy.prometheus().expect("stats"), name);
    until("the load view", || stat("tether_load_poll_ok") >= 6.0).await;
    for r in &ranks {
        until("every rank polled its peers", || {
            r.metrics()
                .expect("metrics")
                .get("tether_rank_rebalance_peers_known", &[])
                == Some(2.0)
        })
        .await;
    }
    let client = HttpClient::new().timeout(Duration::from_secs(60));
    let gw = envoy.listen_addr();
    let at = |r: &Response| -> usize {
        let id = r.header("x-tether-rank").expect("rank id").to_owned();
        fleet
            .iter()
            .position(|a| a.to_string() == id)
            .unwrap_or_else(|| panic!("served by {id}"))
    };
    let identity = [("metadata", json!({"session_id": "rebalanced-1"}))];
    let mut conv = Conversation::new(Api::Chat, &words("rb", 2000), &["bash"], "fix the build");

    // Turn 1 (the session's first): on the idle fleet, its first candidate.
    let r = send(&client, gw, conv.body(&identity)).await;
    let home = at(&r);
    // The home fills with two other sessions' retained states (~6,000 of
    // its 16,384 tokens), sent to it directly.
    for f in ["f1", "f2"] {
        let req = Request::post_json("/v1/chat/completions", &chat(&words(f, 3000), &["go"], 2))
            .header("x-tether-session", f)
            .header("x-tether-prompt-end", "1");
        let r = client.send(fleet[home], req).await.expect("an answer");
        assert_eq!(r.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // Turn 2 ends in a tool call's result: a tool turn, held by the home.
    conv.tool_round("c1", "bash", json!({"cmd": "make"}), "error: x");
    let r = send(&client, gw, conv.body(&identity)).await;
    assert_eq!(at(&r), home, "the holder keeps the key");
    let held = usage(&r)["prompt_tokens"].as_u64().unwrap() / 16 * 16;

    // In the gap the home's state is adopted by a cooler candidate.
    let home_rank = &ranks[home];
    until("the copy", || event(home_rank, "copied") == 1.0).await;
    let to = (0..3)
        .find(|&i| event(&ranks[i], "adopted") == 1.0)
        .expect("one rank adopted it");
    assert_ne!(to, home);
    assert_eq!(entries(&ranks[to]), 1, "the new holder lists the session");
    assert_eq!(entries(home_rank), 3, "the home still does (and f1, f2)");
    assert_eq!(
        ranks[to]
            .metrics()
            .expect("metrics")
            .sum("vllm:request_success_total"),
        0.0,
        "the copy is no client request"
    );

    // The home gets busier than the new holder, within its bound (floor 4).
    let busy: Vec<_> = (0..2)
        .map(|n| {
            let (c, addr) = (client.clone(), fleet[home]);
            let body = chat(&words(&format!("busy{n}-"), 50), &["write a novel"], 20_000);
            tokio::spawn(async move {
                let _ = c
                    .send(addr, Request::post_json("/v1/chat/completions", &body))
                    .await;
            })
        })
        .collect();
    until("the home busy", || {
        home_rank.load().expect("load")["server_load"].as_u64() >= Some(2)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Turn 3: two holders with as many tokens; rule 1 takes the less loaded.
    let stays = stat("tether_residency_stay");
    conv.tool_round("c2", "bash", json!({"cmd": "make test"}), "ok");
    let r = send(&client, gw, conv.body(&identity)).await;
    assert_eq!(at(&r), to, "served by the new holder");
    assert_eq!(r.header("x-tether-pulled-from"), None, "no pull");
    let u = usage(&r);
    assert_eq!(
        u["tether"]["device_cached_tokens"].as_u64(),
        Some(held),
        "{u}"
    );
    assert_eq!(u["tether"]["transferred_tokens"], 0, "a device hit: {u}");
    until("the filter counted the stay", || {
        stat("tether_residency_stay") > stays
    })
    .await;
    // The old holder forgot its copy.
    until("the home forgot", || event(home_rank, "released") == 1.0).await;
    assert_eq!(entries(home_rank), 2, "only f1 and f2 remain");
    assert_eq!(event(&ranks[to], "used"), 1.0);
    for h in busy {
        h.abort();
    }
}
