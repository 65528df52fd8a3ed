//! Residency-aware placement through a real Envoy (`envoy/demo.yaml`, pick
//! mode, header path) in front of four real `tether-rank --role decode`
//! processes that publish what they retain in `/load`: a new session lands
//! on the less loaded of its two candidates; a session whose holder is over
//! the load bound migrates, its next turn served from KV transferred from the
//! old holder (no recompute) — pulled under a lease while the holder
//! schedules nothing (`migrate: "pull"`, the default), or by a prefill leg
//! there (`"leg"`); a dead holder's pull is computed and counted; a restarted
//! rank is known to hold nothing; and two Envoys with the same polled view
//! place requests identically.

use crate::pd::{chat, words};
use crate::support::*;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tether_e2e::{Envoy, HttpClient, Request, Response, SimRank, bootstrap};
use tether_filter::config::Config;
use tether_filter::decide::{HeaderOutcome, on_headers};
use tether_filter::place::{Pools, Snapshot};

fn rank_args(speedup: &str, listen: Option<SocketAddr>) -> Vec<String> {
    let profile = tether_e2e::paths::workspace_root()
        .join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json");
    let mut a: Vec<String> = [
        "--profile",
        &profile.display().to_string(),
        "--role",
        "decode",
        "--speedup",
        speedup,
        "--max-num-seqs",
        "64",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(l) = listen {
        a.extend(["--listen".to_owned(), l.to_string()]);
    }
    a
}

struct Fleet {
    ranks: Vec<SimRank>,
    speedup: &'static str,
    client: HttpClient,
}

impl Fleet {
    fn start(speedup: &'static str) -> Fleet {
        need_envoy_and_filter();
        let ranks = (0..4)
            .map(|_| SimRank::start(&rank_args(speedup, None)).expect("tether-rank starts"))
            .collect();
        Fleet {
            ranks,
            speedup,
            client: HttpClient::new().timeout(Duration::from_secs(60)),
        }
    }

    fn addr(&self, i: usize) -> String {
        self.ranks[i].addr().to_string()
    }

    /// The filter's configuration: pick mode on the header path, markers for
    /// the ranks to retain by, residency with two candidates.
    fn config(&self, load: Value, outputs: Value) -> Value {
        self.config_with(load, outputs, json!({"candidates": 2}))
    }

    /// [`Fleet::config`] with this `residency` block.
    fn config_with(&self, load: Value, outputs: Value, residency: Value) -> Value {
        let eps: Vec<Value> = (0..4).map(|i| json!({"address": self.addr(i)})).collect();
        json!({"mode": "pick", "endpoints": eps, "outputs": outputs,
               "load": load, "residency": residency})
    }

    fn metrics(&self, i: usize) -> tether_e2e::prometheus::Metrics {
        self.ranks[i].metrics().expect("rank metrics")
    }

    /// Puts 6 long answers in flight on rank `i` (straight to it, not through
    /// Envoy) and waits until its `/load` shows them and the filter's view
    /// has had time to poll it (a period to poll, one more to reach every
    /// worker); the handles abort them.
    async fn make_hot(&self, i: usize) -> Vec<tokio::task::JoinHandle<()>> {
        let addr = self.ranks[i].addr();
        let load = (0..6)
            .map(|n| {
                let c = self.client.clone();
                let body = chat(
                    &words(&format!("busy{i}-{n}-"), 50),
                    &["write a novel"],
                    20_000,
                );
                tokio::spawn(async move {
                    let _ = c
                        .send(addr, Request::post_json("/v1/chat/completions", &body))
                        .await;
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.load(i)["server_load"].as_u64().unwrap_or(0) < 6 {
            assert!(Instant::now() < deadline, "the hot rank never got busy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        load
    }

    fn envoy(&self, cfg: &Value) -> Envoy {
        let mut b = Envoy::builder().plugin_config(cfg).concurrency(2);
        for (i, r) in self.ranks.iter().enumerate() {
            b = b
                .var(format!("RANK_{i}_IP"), r.addr().ip().to_string())
                .var(format!("RANK_{i}_PORT"), r.addr().port().to_string());
        }
        b.start(bootstrap::DEMO)
            .unwrap_or_else(|e| panic!("envoy starts with {cfg}: {e}"))
    }

    async fn send(&self, envoy: &Envoy, session: &str, body: &Value) -> Response {
        let req = Request::post_json("/v1/chat/completions", body).header("x-session-id", session);
        let r = self
            .client
            .send(envoy.listen_addr(), req)
            .await
            .unwrap_or_else(|e| panic!("no answer: {e}"));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r
    }

    fn load(&self, i: usize) -> Value {
        self.ranks[i].load().expect("a load report")
    }
}

/// The key's rendezvous order, from the filter's own (native) code.
fn order(cfg: &Value, session: &str) -> Vec<usize> {
    let c = Config::parse(cfg.to_string().as_bytes()).expect("config");
    let pools = Pools::new(&c);
    let h: Vec<(String, Vec<u8>)> = [(":path", "/v1/chat/completions"), ("x-session-id", session)]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect();
    match on_headers(&c, &pools, Snapshot::NONE, &h, false) {
        HeaderOutcome::Decided(d) => d.placed.pick.clone().expect("picked").order,
        _ => panic!("not decided on the header path"),
    }
}

fn counter(e: &Envoy, name: &str) -> f64 {
    crate::support::counter(&e.prometheus().expect("stats"), name)
}

/// Waits until `name` reaches `want` (counts reach Envoy on the filter's tick).
fn wait_counter(e: &Envoy, name: &str, want: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = counter(e, name);
        if v >= want || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn served_by(r: &Response) -> String {
    r.header("x-tether-rank").expect("rank id").to_owned()
}

/// The first `n` sessions named `prefix<i>` whose rendezvous order satisfies `want`.
fn sessions(
    cfg: &Value,
    prefix: &str,
    n: usize,
    want: impl Fn(&[usize]) -> bool,
) -> Vec<(String, Vec<usize>)> {
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .map(|s| {
            let o = order(cfg, &s);
            (s, o)
        })
        .filter(|(_, o)| want(o))
        .take(n)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_land_by_load_migrate_with_their_state_and_a_restarted_rank_holds_nothing() {
    let mut f = Fleet::start("20");
    let cfg = f.config_with(
        json!({"poll_ms": 50, "factor": 1.5, "floor": 2}),
        json!(["pick", "retain"]),
        json!({"candidates": 2, "migrate": "leg"}),
    );
    let envoy = f.envoy(&cfg);
    wait_counter(&envoy, "tether_load_poll_ok", 8.0);
    let (hot, rst_home) = (0, 1);
    let mig = sessions(&cfg, "mig-", 1, |o| o[0] == hot).remove(0);
    let rst = sessions(&cfg, "rst-", 1, |o| o[0] == rst_home && o[1] != hot).remove(0);
    let fresh = sessions(&cfg, "new-", 3, |o| o[0] == hot);
    // Each session its own prompt: no rank holds another's prefix.
    let (sys_mig, sys_rst) = (words("mig", 3000), words("rst", 3000));

    // Idle fleet: first turns land on their first candidate (ties by rendezvous order).
    let r = f
        .send(&envoy, &mig.0, &chat(&sys_mig, &["read the file"], 2))
        .await;
    assert_eq!(served_by(&r), f.addr(hot));
    let r = f
        .send(&envoy, &rst.0, &chat(&sys_rst, &["list the tests"], 2))
        .await;
    assert_eq!(served_by(&r), f.addr(rst_home));

    // Load the hot rank directly: 6 long answers in flight.
    let load = f.make_hot(hot).await;

    // (a) New sessions whose first candidate is the hot rank go to their second.
    let least = counter(&envoy, "tether_residency_least");
    for (s, o) in &fresh {
        let r = f
            .send(&envoy, s, &chat(&words(s, 200), &["hello"], 2))
            .await;
        assert_eq!(served_by(&r), f.addr(o[1]), "{s}: candidates {o:?}");
    }
    assert!(wait_counter(&envoy, "tether_residency_least", least + 3.0) >= least + 3.0);

    // (b) The hot rank holds `mig`: its next turn moves to the other candidate
    // and takes the state from the hot rank by a prefill leg there (`leg`).
    let t2 = chat(&sys_mig, &["read the file", "done", "now fix it"], 2);
    let r = f.send(&envoy, &mig.0, &t2).await;
    assert_eq!(
        served_by(&r),
        f.addr(mig.1[1]),
        "migrated to the other candidate"
    );
    assert_eq!(
        r.header("x-tether-prefilled-by"),
        Some(f.addr(hot).as_str())
    );
    assert_eq!(r.header("x-tether-pulled-from"), None);
    let u = r.json::<Value>().unwrap()["usage"].clone();
    let prompt = u["prompt_tokens"].as_u64().unwrap();
    let computed = u["tether"]["computed_tokens"].as_u64().unwrap();
    assert!(computed <= 16, "transferred, not recomputed: {u}");
    assert_eq!(
        u["tether"]["transferred_tokens"].as_u64().unwrap(),
        prompt - computed,
        "{u}"
    );
    assert!(wait_counter(&envoy, "tether_residency_migrate", 1.0) >= 1.0);
    for h in load {
        h.abort();
    }

    // (c) `rst`'s home restarts on the same address: it holds nothing, and
    // says so — the next turn is placed as a new key (least), not as unknown.
    let at = f.ranks[rst_home].addr();
    f.ranks[rst_home].kill();
    f.ranks[rst_home] = SimRank::start(&rank_args(f.speedup, Some(at))).expect("restarts");
    let res = f.load(rst_home)["residency"].clone();
    assert_eq!(
        (res["keys"].as_str(), res["omitted"].as_u64()),
        (Some(""), Some(0)),
        "{res}"
    );
    let polls = counter(&envoy, "tether_load_poll_ok");
    wait_counter(&envoy, "tether_load_poll_ok", polls + 8.0);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (least, bounded) = (
        counter(&envoy, "tether_residency_least"),
        counter(&envoy, "tether_residency_bounded"),
    );
    let r = f
        .send(
            &envoy,
            &rst.0,
            &chat(&sys_rst, &["list the tests", "3 tests", "run them"], 2),
        )
        .await;
    assert_eq!(served_by(&r), f.addr(rst_home));
    let u = r.json::<Value>().unwrap()["usage"].clone();
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0, "{u}");
    assert!(wait_counter(&envoy, "tether_residency_least", least + 1.0) >= least + 1.0);
    assert_eq!(counter(&envoy, "tether_residency_bounded"), bounded);
}

/// `migrate: "pull"` (the default): a session held by a rank over its bound
/// moves to its other candidate, which leases the state from the old holder
/// (granted, released) and decodes with it as transferred KV while the old
/// holder's engine takes no new work; then the holder dies with another of
/// its sessions still listed in the view: that session's moved turn finds no
/// one to pull from, is computed on its new home and counted, and the client
/// sees a normal answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_session_pulls_its_state_and_a_dead_holders_pull_is_computed() {
    let mut f = Fleet::start("20");
    let cfg = f.config(
        json!({"poll_ms": 50, "factor": 1.5, "floor": 2}),
        json!(["pick", "retain"]),
    );
    let envoy = f.envoy(&cfg);
    wait_counter(&envoy, "tether_load_poll_ok", 8.0);
    let hot = 2;
    let mut two = sessions(&cfg, "pull-", 2, |o| o[0] == hot);
    let (pl, dd) = (two.remove(0), two.remove(0));
    let (sys_pl, sys_dd) = (words("pl", 3000), words("dd", 2000));
    for (s, sys) in [(&pl, &sys_pl), (&dd, &sys_dd)] {
        let r = f
            .send(&envoy, &s.0, &chat(sys, &["read the file"], 2))
            .await;
        assert_eq!(served_by(&r), f.addr(hot), "{}: first turn at home", s.0);
    }
    let listed = f.load(hot)["residency"]["tiers"].as_str().map(str::len);
    assert_eq!(listed, Some(2), "the hot rank lists both sessions");
    let load = f.make_hot(hot).await;
    let before = f.metrics(hot);
    let migrations = counter(&envoy, "tether_residency_migrate");

    // (a) The pull: served by the other candidate, from the hot rank's state.
    let t2 = chat(&sys_pl, &["read the file", "done", "now fix it"], 2);
    let r = f.send(&envoy, &pl.0, &t2).await;
    let new = pl.1[1];
    assert_eq!(
        served_by(&r),
        f.addr(new),
        "migrated to the other candidate"
    );
    assert_eq!(r.header("x-tether-pulled-from"), Some(f.addr(hot).as_str()));
    assert_eq!(r.header("x-tether-prefilled-by"), None, "no prefill leg");
    let u = r.json::<Value>().unwrap()["usage"].clone();
    let (prompt, transferred, computed) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["tether"]["transferred_tokens"].as_u64().unwrap(),
        u["tether"]["computed_tokens"].as_u64().unwrap(),
    );
    // The first turn's whole blocks (its ~3,000 words) crossed the link; only
    // the new messages and the partial block are computed on the new home.
    assert!(transferred >= 2976 && transferred % 16 == 0, "{u}");
    assert_eq!(prompt, transferred + computed, "{u}");
    assert!(computed < 40, "{u}");
    assert!(wait_counter(&envoy, "tether_residency_migrate", migrations + 1.0) > migrations);
    let nm = f.metrics(new);
    assert_eq!(
        nm.get("tether_rank_pulls_total", &[("outcome", "ok")]),
        Some(1.0)
    );
    // The holder granted one lease and got it back; its engine admitted nothing.
    let deadline = Instant::now() + Duration::from_secs(5);
    let hm = loop {
        let m = f.metrics(hot);
        let released = m.get("tether_rank_pull_leases_total", &[("event", "released")]);
        if released == Some(1.0) || Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let lease = |e: &str| hm.get("tether_rank_pull_leases_total", &[("event", e)]);
    assert_eq!(
        (lease("granted"), lease("released")),
        (Some(1.0), Some(1.0))
    );
    for m in ["vllm:prompt_tokens_total", "vllm:request_success_total"] {
        assert_eq!(
            hm.sum(m),
            before.sum(m),
            "{m}: the holder scheduled nothing"
        );
    }

    // (b) The holder dies while the view still lists it holding `dd`, over
    // its bound (a dead endpoint keeps its last report up to max_age_ms):
    // `dd` moves, its pull fails, its prompt is computed on the new home.
    f.ranks[hot].kill();
    let t2 = chat(&sys_dd, &["read the file", "done", "run it"], 2);
    let r = f.send(&envoy, &dd.0, &t2).await;
    let new = dd.1[1];
    assert_eq!(served_by(&r), f.addr(new));
    assert_eq!(r.header("x-tether-pulled-from"), None);
    let u = r.json::<Value>().unwrap()["usage"].clone();
    assert_eq!(u["tether"]["transferred_tokens"], 0, "{u}");
    assert!(
        u["tether"]["computed_tokens"].as_u64().unwrap() >= 2000,
        "{u}"
    );
    let failed = f
        .metrics(new)
        .get("tether_rank_pulls_total", &[("outcome", "failed")]);
    assert_eq!(failed, Some(1.0), "counted");
    for h in load {
        h.abort();
    }
}

/// Two Envoys, the same ranks, the same polled view: the view is made
/// identical by polling once (`poll_ms` 60 s) while the ranks are idle with
/// fixed residency, seeded beforehand through a third Envoy; the same 1,000
/// requests through both must be placed alike (≥ 99.9 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_with_the_same_view_place_alike() {
    let f = Fleet::start("1000");
    let seed_cfg = f.config(json!({"poll_ms": 50}), json!(["pick", "retain"]));
    let seeder = f.envoy(&seed_cfg);
    for i in 0..40 {
        let s = format!("seed-{i}");
        f.send(&seeder, &s, &chat(&words(&s, 300), &["start"], 1))
            .await;
    }
    drop(seeder);
    let once = json!({"poll_ms": 60_000, "max_age_ms": 120_000, "timeout_ms": 2000});
    let cfg = f.config(once, json!(["pick"]));
    let (b, c) = (f.envoy(&cfg), f.envoy(&cfg));
    for e in [&b, &c] {
        assert!(
            wait_counter(e, "tether_load_poll_ok", 4.0) >= 4.0,
            "{}",
            e.log()
        );
    }
    let started = Instant::now();
    let (mut same, n) = (0, 1000);
    for i in 0..n {
        let s = if i % 3 == 0 {
            format!("fresh-{i}")
        } else {
            format!("seed-{}", i % 40)
        };
        let body = chat(&words(&s, 20), &["go"], 1);
        let (rb, rc) = (f.send(&b, &s, &body).await, f.send(&c, &s, &body).await);
        same += usize::from(served_by(&rb) == served_by(&rc));
    }
    assert!(
        started.elapsed() < Duration::from_secs(50),
        "the view must not be re-polled"
    );
    let share = same as f64 / n as f64;
    eprintln!(
        "determinism: {same} of {n} placed alike ({:.2} %)",
        share * 100.0
    );
    assert!(share >= 0.999, "{same} of {n} placed alike");
    // Both kinds of decision were made: returning keys stayed, new ones went least.
    for e in [&b, &c] {
        assert!(wait_counter(e, "tether_residency_stay", 600.0) >= 600.0);
        assert!(wait_counter(e, "tether_residency_least", 300.0) >= 300.0);
    }
}
