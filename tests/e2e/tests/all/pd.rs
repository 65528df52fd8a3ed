//! P/D and load-aware pick through a real Envoy (`envoy/demo.yaml`, pick mode)
//! in front of real `tether-rank` processes: two decode ranks (`--role
//! decode`) and two prefill ranks (`--role prefill`), DP size 2 each. The
//! filter polls every rank's `/load` from its root contexts (two workers plus
//! the main thread), disaggregates long uncached prompts onto the least
//! loaded prefiller, and spills a hot session off its primary once the polled
//! view shows that rank over the bound.

use crate::support::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use tether_e2e::{Envoy, HttpClient, Request, Response, SimRank, bootstrap};

/// Two decode ranks, two prefill ranks, Envoy in front.
struct PdFleet {
    decode: Vec<SimRank>,
    prefill: Vec<SimRank>,
    envoy: Envoy,
    client: HttpClient,
}

fn rank_args(role: &str, speedup: &str) -> Vec<String> {
    let profile = tether_e2e::paths::workspace_root()
        .join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json");
    [
        "--profile",
        &profile.display().to_string(),
        "--role",
        role,
        "--dp-size",
        "2",
        "--speedup",
        speedup,
        "--max-num-seqs",
        "64",
    ]
    .map(str::to_owned)
    .to_vec()
}

impl PdFleet {
    fn start(speedup: &str, extra: Value) -> PdFleet {
        need_envoy_and_filter();
        let start = |role: &str| {
            (0..2)
                .map(|_| SimRank::start(&rank_args(role, speedup)).expect("tether-rank starts"))
                .collect::<Vec<_>>()
        };
        let (decode, prefill) = (start("decode"), start("prefill"));
        let eps = |rs: &[SimRank]| {
            rs.iter()
                .map(|r| json!({"address": r.addr().to_string(), "dp_size": 2}))
                .collect::<Vec<_>>()
        };
        let mut cfg = json!({
            "mode": "pick",
            "endpoints": eps(&decode),
            "header_fast_path": false,
            "pd": {"prefill_endpoints": eps(&prefill), "threshold_tokens": 1000},
            "load": {"poll_ms": 50, "factor": 1.5, "floor": 2},
        });
        merge(&mut cfg, extra);
        if let Some(o) = cfg.as_object_mut() {
            o.retain(|_, v| !v.is_null());
        }
        // The demo's `ranks` cluster holds all four: routing goes to decode
        // ranks, polls go to every rank through it.
        let mut b = Envoy::builder().plugin_config(&cfg).concurrency(2);
        for (i, r) in decode.iter().chain(&prefill).enumerate() {
            b = b
                .var(format!("RANK_{i}_IP"), r.addr().ip().to_string())
                .var(format!("RANK_{i}_PORT"), r.addr().port().to_string());
        }
        let envoy = b
            .start(bootstrap::DEMO)
            .unwrap_or_else(|e| panic!("envoy starts with {cfg}: {e}"));
        PdFleet {
            decode,
            prefill,
            envoy,
            client: HttpClient::new().timeout(Duration::from_secs(60)),
        }
    }

    async fn send(&self, body: &Value, session: &str) -> Response {
        let req = Request::post_json("/v1/chat/completions", body).header("x-session-id", session);
        let r = self
            .client
            .send(self.envoy.listen_addr(), req)
            .await
            .unwrap_or_else(|e| panic!("no answer: {e}"));
        assert_eq!(
            r.status,
            200,
            "{}",
            String::from_utf8_lossy(&r.body[..r.body.len().min(400)])
        );
        r
    }

    fn counter(&self, name: &str) -> f64 {
        counter(&self.envoy.prometheus().expect("stats"), name)
    }

    /// Waits for a counter to reach `want` (the filter hands its counts to
    /// Envoy on its tick, so a count lags its request by up to a tick).
    fn wait_counter(&self, name: &str, want: f64) -> f64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let v = self.counter(name);
            if v >= want || std::time::Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every rank has been polled successfully at least `n` times.
    fn wait_polls(&self, n: f64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.counter("tether_load_poll_ok") < n {
            assert!(
                std::time::Instant::now() < deadline,
                "no /load polls: {}",
                self.envoy.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub(crate) fn words(seed: &str, n: usize) -> String {
    (0..n).map(|i| format!("{seed}{i} ")).collect()
}

pub(crate) fn chat(system: &str, turns: &[&str], max_tokens: u64) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system})];
    for (i, t) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": t}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": max_tokens})
}

fn usage(r: &Response) -> Value {
    r.json::<Value>().expect("JSON answer")["usage"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_first_turn_is_prefilled_on_a_prefill_rank_and_its_return_in_place() {
    let f = PdFleet::start("100", json!({}));
    f.wait_polls(8.0);
    let prefillers: Vec<String> = f.prefill.iter().map(|r| r.addr().to_string()).collect();
    let decoders: Vec<String> = f.decode.iter().map(|r| r.addr().to_string()).collect();
    let system = words("sys", 3000);

    // Turn 1: ~3,000 words, nothing cached anywhere: disaggregated.
    let t1 = chat(&system, &["fix the build"], 8);
    let r1 = f.send(&t1, "pd-session-1").await;
    let by = r1
        .header("x-tether-prefilled-by")
        .expect("disaggregated")
        .to_owned();
    assert!(prefillers.contains(&by), "{by} is not a prefill rank");
    let decode = r1.header("x-tether-rank").expect("rank id").to_owned();
    assert!(decoders.contains(&decode), "{decode} is not a decode rank");
    let dp = r1.header("x-tether-rank-dp").expect("dp rank").to_owned();
    let u1 = usage(&r1);
    assert!(
        u1["tether"]["transferred_tokens"].as_u64().unwrap() > 2900,
        "{u1}"
    );
    assert_eq!(u1["completion_tokens"], 8);
    // The prefill leg ran on the same DP rank of the prefiller.
    let pr = &f.prefill[prefillers.iter().position(|p| *p == by).unwrap()];
    let (_, text) = tether_e2e::envoy::admin_get(pr.addr(), "/metrics").expect("prefiller metrics");
    let pm = tether_e2e::prometheus::Metrics::parse(&String::from_utf8_lossy(&text));
    let on = |e: &str| -> f64 {
        pm.matching("vllm:prompt_tokens_total")
            .filter(|s| s.labels.get("engine").map(String::as_str) == Some(e))
            .map(|s| s.value)
            .sum()
    };
    let other = if dp == "0" { "1" } else { "0" };
    assert!(
        on(&dp) > 2900.0 && on(other) == 0.0,
        "dp {dp}: {} / {}",
        on(&dp),
        on(other)
    );

    // Turn 2 of the same session: the rank holds turn 1 (transferred KV is
    // cached like computed KV), the new part is short: prefilled in place.
    let t2 = chat(
        &system,
        &["fix the build", "done: edited main.rs", "now run the tests"],
        8,
    );
    let r2 = f.send(&t2, "pd-session-1").await;
    assert_eq!(r2.header("x-tether-prefilled-by"), None);
    assert_eq!(
        r2.header("x-tether-rank"),
        Some(decode.as_str()),
        "same decode rank"
    );
    assert_eq!(r2.header("x-tether-rank-dp"), Some(dp.as_str()));
    let u2 = usage(&r2);
    assert!(
        u2["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 2900,
        "{u2}"
    );

    // A short first turn is not worth a prefill leg.
    let r3 = f.send(&chat("be brief", &["hi"], 4), "pd-session-2").await;
    assert_eq!(r3.header("x-tether-prefilled-by"), None);

    assert_eq!(f.wait_counter("tether_pd_disaggregated", 1.0), 1.0);
    assert_eq!(f.wait_counter("tether_pd_local", 2.0), 2.0);
    assert_eq!(f.counter("tether_load_poll_bad"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_sessions_burst_spreads_once_its_primary_reports_load_over_the_bound() {
    // Speedup 1: each answer of 1200 tokens decodes for seconds (about 4 s
    // for the 12 here), so the burst is still running when the next polls
    // come back, even on a loaded machine. This test is about the spill
    // rule, so a sample counts for 5 s here, not the default 1 s: on a loaded
    // 2-core CI machine the polls can fall behind by that much, and with no
    // fresh sample there is no view and the key goes home (the place unit
    // tests and the harness's `load` tests check staleness).
    let f = PdFleet::start(
        "1",
        json!({
            "pd": null,
            "load": {"poll_ms": 50, "max_age_ms": 5000, "factor": 1.5, "floor": 2},
        }),
    );
    f.wait_polls(8.0);
    let system = words("hot", 50);
    let body = |i: usize| chat(&system, &[&format!("request {i}")], 1200);
    // Where the session lives while its rank is idle.
    let home = f.send(&chat(&system, &["warm up"], 1), "hot-session").await;
    let home = home.header("x-tether-rank").unwrap().to_owned();
    // The burst: 12 requests at once. The view is at most a few polls old
    // and shows an idle fleet, so they go home.
    let mut burst = Vec::new();
    for i in 0..12 {
        let b = body(i);
        let client = f.client.clone();
        let addr = f.envoy.listen_addr();
        burst.push(tokio::spawn(async move {
            let req = Request::post_json("/v1/chat/completions", &b)
                .header("x-session-id", "hot-session");
            client.send(addr, req).await
        }));
    }
    // Once polls have seen the burst (12 in flight at home, 0 elsewhere:
    // over 1.5 × 13 / 2), the same session's next requests go to the other
    // decode rank, its next rendezvous choice.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(std::time::Instant::now() < deadline, "no spill");
        let r = f.send(&chat(&system, &["probe"], 1), "hot-session").await;
        if r.header("x-tether-rank") != Some(home.as_str()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // That probe's worker has seen the burst; Envoy's other worker reads the
    // shared view on its own tick and may still hold the idle one. Give it a
    // few poll periods (the burst decodes for seconds).
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Only requests sent while the burst still held the primary over the
    // bound say anything: on a loaded machine the burst may drain during
    // this loop, and then going home is right. Home's load only falls from
    // here (nothing new is sent there), so a reading over the bound taken
    // after a request's answer was over it when the request was routed, and
    // the filter's view, older still, was too.
    let home_rank = f
        .decode
        .iter()
        .find(|r| r.addr().to_string() == home)
        .expect("x-tether-rank names a decode rank");
    let home_load = || {
        home_rank.load().expect("home's load report")["server_load"]
            .as_f64()
            .expect("server_load")
    };
    let mut places: BTreeMap<String, usize> = BTreeMap::new();
    let mut sent = 0;
    for i in 0..6 {
        let r = f
            .send(&chat(&system, &[&format!("later {i}")], 1), "hot-session")
            .await;
        sent += 1;
        // Over 1.5 × the mean of (home, other) needs home > 3 × other; the
        // other rank holds at most the one probe in flight.
        if home_load() < 6.0 {
            break;
        }
        *places
            .entry(r.header("x-tether-rank").unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(
        places.values().sum::<usize>() >= 3,
        "the burst drained after {sent} later requests: too few sent while it ran ({places:?})"
    );
    assert_eq!(
        places.get(&home),
        None,
        "the hot primary still took keys: {places:?}"
    );
    assert_eq!(places.len(), 1, "spilled to one next choice: {places:?}");
    // The probe that first left home and every counted request spilled.
    let spilled = (places.values().sum::<usize>() + 1) as f64;
    assert!(f.wait_counter("tether_load_spilled", spilled) >= spilled);
    // The burst itself went home until polls showed it (how many before the
    // first poll saw them depends on timing); all of it was served.
    let mut burst_home = 0;
    for h in burst {
        let r = h.await.expect("task").expect("answer");
        assert_eq!(r.status, 200);
        burst_home += usize::from(r.header("x-tether-rank") == Some(home.as_str()));
    }
    assert!(burst_home >= 1, "the burst started at home");
    // Idle again: once polls see it, the session is back on its primary.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = f.send(&chat(&system, &["after"], 1), "hot-session").await;
        if r.header("x-tether-rank") == Some(home.as_str()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never came home");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_load_reply_is_counted_and_routing_goes_on() {
    // One "decode endpoint" is an echo rank: its /load answer is no load report.
    need_envoy_and_filter();
    let echo = ranks(3);
    let sim = SimRank::start(&rank_args("both", "100")).expect("tether-rank starts");
    let cfg = json!({
        "mode": "pick",
        "endpoints": [
            {"address": echo[0].addr().to_string()},
            {"address": sim.addr().to_string()},
        ],
        "load": {"poll_ms": 50},
    });
    let envoy = Envoy::builder()
        .plugin_config(&cfg)
        .var("RANK_0_IP", echo[0].addr().ip().to_string())
        .var("RANK_0_PORT", echo[0].addr().port().to_string())
        .var("RANK_1_IP", sim.addr().ip().to_string())
        .var("RANK_1_PORT", sim.addr().port().to_string())
        .var("RANK_2_PORT", echo[1].addr().port().to_string())
        .var("RANK_3_PORT", echo[2].addr().port().to_string())
        .start(bootstrap::DEMO)
        .expect("envoy starts");
    let m = || envoy.prometheus().expect("stats");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while counter(&m(), "tether_load_poll_bad") < 2.0 || counter(&m(), "tether_load_poll_ok") < 2.0
    {
        assert!(std::time::Instant::now() < deadline, "{}", envoy.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(envoy.log().contains("not used"), "logged");
    // Requests still route (both endpoints, no panic, no 5xx).
    let client = HttpClient::new();
    for i in 0..8 {
        let req = Request::post_json("/v1/chat/completions", &chat("s", &["hi"], 1))
            .header("x-session-id", format!("s{i}"));
        let r = client.send(envoy.listen_addr(), req).await.expect("answer");
        assert_eq!(r.status, 200);
    }
}
