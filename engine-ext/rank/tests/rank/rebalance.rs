//! Rebalancing in tool gaps over real HTTP (docs/rank.md "Rebalancing in
//! tool gaps"): ranks started with `--rebalance --peers …` poll each other's
//! `/load`; a KV-heavy home that retains a tool turn has its state adopted by
//! the cooler candidate the shared rule names (leased from the home, retained
//! there outside the client metrics), both list the key; the rank that serves
//! the returning turn tells the other to forget it; a target that died after
//! its last poll costs the client nothing and is counted; bad calls and flags
//! are refused.

use crate::harness::{Reply, Sample, Server, chat, profile_path, total, words};
use clap::Parser;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tether_placement::{Endpoint, Placement, Resident, resident_key};
use tether_rank::config::{Args, RankConfig};
use tether_rank::load::LoadReport;

/// The session copied in every test, and its gateway routing key.
const SESSION: &str = "9c";
const ROUTE: &str = "00000000000000ab";

/// Free loopback ports (bound, then let go for the ranks to bind).
fn ports(n: usize) -> Vec<SocketAddr> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter().map(|l| l.local_addr().unwrap()).collect()
}

fn peers_flag(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The flags of a rebalancing rank at `me` among `all`: a small device (so
/// a few sessions make a rank KV-heavy), 20× time (a tool retention lasts 6 s).
fn flags(me: SocketAddr, all: &[SocketAddr], poll_ms: &str) -> Vec<String> {
    [
        "--listen",
        &me.to_string(),
        "--speedup",
        "20",
        "--kv-tokens",
        "16384",
        "--rebalance",
        "--peers",
        &peers_flag(all),
        "--peer-poll-ms",
        poll_ms,
    ]
    .map(str::to_owned)
    .to_vec()
}

async fn fleet(n: usize) -> (Vec<Server>, Vec<SocketAddr>) {
    fleet_with(n, &[]).await
}

/// [`fleet`] with `extra` flags on every rank.
async fn fleet_with(n: usize, extra: &[&str]) -> (Vec<Server>, Vec<SocketAddr>) {
    let addrs = ports(n);
    let mut ranks = Vec::new();
    for a in &addrs {
        let mut f = flags(*a, &addrs, "50");
        f.extend(extra.iter().map(|x| x.to_string()));
        ranks.push(Server::start(&f.iter().map(String::as_str).collect::<Vec<_>>()).await);
    }
    (ranks, addrs)
}

fn event(m: &[Sample], e: &str) -> f64 {
    total(m, "tether_rank_rebalance_total", &[("event", e)])
}

/// Waits until `f(metrics)` holds (5 s at most); the last metrics.
async fn until(s: &Server, what: &str, f: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let m = s.metrics().await;
        if f(&m) {
            return m;
        }
        let seen: Vec<String> = m
            .iter()
            .filter(|x| {
                x.name.starts_with("tether_rank_rebalance")
                    || x.name.starts_with("tether_rank_pull")
            })
            .map(|x| format!("{}{:?}={}", x.name, x.labels, x.value))
            .collect();
        assert!(Instant::now() < deadline, "{what} never happened: {seen:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fills `s` with two other sessions' retained states (~6,000 tokens of its
/// 16,384): its device KV in use is then far above the fleet's mean.
async fn make_kv_heavy(s: &Server) {
    for f in ["f1", "f2"] {
        let h = [
            ("x-tether-session", f),
            ("x-tether-prompt-end", "1"),
            ("x-tether-turn-kind", "user"),
        ];
        let r = s
            .post(
                "/v1/chat/completions",
                &h,
                &chat(&words(f, 3000), &["go"], 2),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// The session's turn `turns` on `s`, ending in `kind`, sent as the gateway
/// sends it (markers and `x-tether-key`).
async fn turn(s: &Server, turns: &[&str], kind: &str) -> Reply {
    let h = [
        ("x-tether-session", SESSION),
        ("x-tether-prompt-end", "1"),
        ("x-tether-turn-kind", kind),
        ("x-tether-key", ROUTE),
    ];
    let r = s
        .post(
            "/v1/chat/completions",
            &h,
            &chat(&words("sess", 2000), turns, 2),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r
}

/// Tokens `s` lists for the session in its residency summary.
async fn listed(s: &Server) -> Option<u32> {
    held_on(s).await.map(|(tokens, _)| tokens)
}

/// What `s` lists for the session: tokens, and whether some are on the device.
async fn held_on(s: &Server) -> Option<(u32, bool)> {
    let l: LoadReport = serde_json::from_slice(&s.get("/load").await.body).unwrap();
    let r = Resident::decode(&l.residency.expect("a summary")).unwrap();
    r.get(resident_key(0, 0x9c, 0))
        .map(|h| (h.tokens, h.device))
}

/// The first candidate after `home` the rule takes on an idle fleet (ties
/// go to the rendezvous order), from the placement code itself.
fn target(addrs: &[SocketAddr], home: usize) -> usize {
    let eps: Vec<Endpoint> = addrs
        .iter()
        .map(|a| Endpoint {
            address: a.to_string(),
            weight: 1.0,
            dp_size: 1,
            name: None,
        })
        .collect();
    let key = u64::from_str_radix(ROUTE, 16).unwrap();
    let order = Placement::new(&eps).pick(key, 2).unwrap().order;
    order.into_iter().find(|&i| i != home).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_turns_state_moves_to_a_cooler_candidate_and_the_home_forgets_it() {
    let (ranks, addrs) = fleet(3).await;
    let home = 0;
    let to = target(&addrs, home);
    for r in &ranks {
        until(r, "every peer polled", |m| {
            total(m, "tether_rank_rebalance_peers_known", &[]) == 2.0
        })
        .await;
    }
    make_kv_heavy(&ranks[home]).await;
    let t1 = turn(&ranks[home], &["read the file"], "tool").await;
    let p1 = t1.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let held = p1 / 16 * 16;

    // The target adopted the state: leased from the home, retained there.
    let hm = until(&ranks[home], "the copy", |m| event(m, "copied") == 1.0).await;
    let tm = until(&ranks[to], "the adoption", |m| event(m, "adopted") == 1.0).await;
    assert_eq!(
        total(
            &hm,
            "tether_rank_pull_leases_total",
            &[("event", "granted")]
        ),
        1.0
    );
    assert_eq!(listed(&ranks[home]).await, Some(held as u32));
    assert_eq!(listed(&ranks[to]).await, Some(held as u32), "both list it");
    // Nothing of it is a client request on the target.
    for m in [
        "vllm:prompt_tokens_total",
        "vllm:request_success_total",
        "vllm:prompt_tokens_by_source_total",
    ] {
        assert_eq!(total(&tm, m, &[]), 0.0, "{m}");
    }
    assert_eq!(total(&tm, "tether_rank_pulls_total", &[]), 0.0);
    assert_eq!(total(&tm, "tether_rank_rebalance_twins", &[]), 1.0);
    let other = 3 - home - to;
    let om = ranks[other].metrics().await;
    assert_eq!(event(&om, "adopted"), 0.0, "one target only");
    until(&ranks[home], "the lease released", |m| {
        total(m, "tether_rank_pull_leases_total", &[("event", "released")]) == 1.0
    })
    .await;

    // The returning turn on the target: its prompt is a device hit there.
    // (A user turn: a tool turn ending on a rank that holds more KV than
    // the polled mean would be copied on again, which is the rule's call.)
    let t2 = turn(&ranks[to], &["read the file", "ok", "now fix it"], "user").await;
    let u = &t2.json()["usage"];
    assert_eq!(
        u["tether"]["device_cached_tokens"].as_u64(),
        Some(held),
        "{u}"
    );
    assert_eq!(u["tether"]["transferred_tokens"], 0, "{u}");
    until(&ranks[home], "the home forgot", |m| {
        event(m, "released") == 1.0
    })
    .await;
    assert_eq!(listed(&ranks[home]).await, None, "the home let its copy go");
    let tm = ranks[to].metrics().await;
    assert_eq!(event(&tm, "used"), 1.0);
    assert_eq!(
        total(&tm, "vllm:request_success_total", &[]),
        1.0,
        "the client's turn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_back_at_the_home_has_the_targets_copy_forgotten() {
    let (ranks, _) = fleet(2).await;
    until(&ranks[0], "the peer polled", |m| {
        total(m, "tether_rank_rebalance_peers_known", &[]) == 1.0
    })
    .await;
    make_kv_heavy(&ranks[0]).await;
    turn(&ranks[0], &["read the file"], "tool").await;
    until(&ranks[1], "the adoption", |m| event(m, "adopted") == 1.0).await;
    until(&ranks[0], "the copy", |m| event(m, "copied") == 1.0).await;
    assert!(listed(&ranks[1]).await.is_some());
    // A forget naming another state of the key lets nothing go.
    let stale = serde_json::json!({"marker": {"session": SESSION}, "last": "0".repeat(32)});
    let r = ranks[1].post("/pull/forget", &[], &stale).await;
    assert_eq!(r.json()["forgotten"], false);
    // A user turn: the home, still KV-heavy, copies nothing more.
    let r = turn(&ranks[0], &["read the file", "ok", "go on"], "user").await;
    assert!(r.json()["usage"]["tether"]["device_cached_tokens"].as_u64() > Some(1900));
    until(&ranks[1], "the target forgot", |m| {
        event(m, "released") == 1.0
    })
    .await;
    assert_eq!(listed(&ranks[1]).await, None);
    assert_eq!(event(&ranks[0].metrics().await, "unused"), 1.0);
}

/// With a host tier, the home moves its own copy there once the target's copy
/// landed (its summary lists the key as host-only, the target's on the
/// device), and a turn that comes back to the home anyway is served from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_home_moves_its_own_copy_to_its_host_tier_when_the_copy_lands() {
    let (ranks, _) = fleet_with(2, &["--cache", "retention-host", "--host-gib", "1"]).await;
    until(&ranks[0], "the peer polled", |m| {
        total(m, "tether_rank_rebalance_peers_known", &[]) == 1.0
    })
    .await;
    make_kv_heavy(&ranks[0]).await;
    let t1 = turn(&ranks[0], &["read the file"], "tool").await;
    let held = t1.json()["usage"]["prompt_tokens"].as_u64().unwrap() / 16 * 16;
    until(&ranks[0], "the demotion", |m| event(m, "demoted") == 1.0).await;
    assert_eq!(
        held_on(&ranks[0]).await,
        Some((held as u32, false)),
        "home: host only"
    );
    assert_eq!(
        held_on(&ranks[1]).await,
        Some((held as u32, true)),
        "target: device"
    );
    // The turn comes back to the home anyway: its blocks, cold on the device
    // until another session needs the room, and the host copy serve it.
    let r = turn(&ranks[0], &["read the file", "ok", "go on"], "user").await;
    let u = &r.json()["usage"]["tether"];
    let served = |f: &str| u[f].as_u64().unwrap_or(0);
    assert_eq!(
        served("device_cached_tokens") + served("restored_tokens"),
        held,
        "{u}"
    );
    until(&ranks[1], "the target forgot", |m| {
        event(m, "released") == 1.0
    })
    .await;
}

/// A rank process (the real binary) at `me` among `all`; killed on drop.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn process(me: SocketAddr, all: &[SocketAddr]) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether-rank"))
        .args(["--profile", &profile_path().display().to_string()])
        .args(flags(me, all, "2000"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("READY"), "{line}");
    Process(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_dead_since_its_last_poll_costs_the_client_nothing_and_is_counted() {
    let addrs = ports(2);
    let mut peer = process(addrs[1], &addrs);
    // Polled every 2 s: the dead peer stays in the view for the next turn.
    let f = flags(addrs[0], &addrs, "2000");
    let home = Server::start(&f.iter().map(String::as_str).collect::<Vec<_>>()).await;
    until(&home, "the peer polled", |m| {
        total(m, "tether_rank_rebalance_peers_known", &[]) == 1.0
    })
    .await;
    peer.0.kill().unwrap();
    peer.0.wait().unwrap();
    make_kv_heavy(&home).await;
    turn(&home, &["read the file"], "tool").await;
    let m = until(&home, "the failed copy", |m| event(m, "copy_failed") == 1.0).await;
    assert_eq!(event(&m, "copied"), 0.0);
    assert_eq!(
        total(&m, "tether_rank_rebalance_twins", &[]),
        0.0,
        "nothing to settle"
    );
    assert!(listed(&home).await.is_some(), "the home keeps its state");
    let r = turn(&home, &["read the file", "ok", "go on"], "user").await;
    assert!(r.json()["usage"]["tether"]["device_cached_tokens"].as_u64() > Some(1900));
    assert_eq!(
        event(&home.metrics().await, "forget_failed"),
        0.0,
        "no twin to tell"
    );
    until(&home, "the dead peer unknown", |m| {
        total(m, "tether_rank_rebalance_peers_known", &[]) == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_are_refused_and_counted_and_a_turn_without_a_key_is_not_copied() {
    let (ranks, _) = fleet(2).await;
    let s = &ranks[0];
    for (body, status) in [
        ("{".to_owned(), 400),
        ("{\"from\": \"x\"}".to_owned(), 400),
        (
            serde_json::json!({"from": "127.0.0.1:9", "route_key": "1",
                "marker": {"session": "1", "prompt_end": "1"},
                "hashes": ["0".repeat(32)], "fingerprint": "another"})
            .to_string(),
            409,
        ),
    ] {
        let r = s.send("POST", "/pull/adopt", &[], body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(r.json()["error"].is_string());
    }
    let r = s.send("POST", "/pull/forget", &[], "{\"marker\": 1}").await;
    assert_eq!(r.status, 400);
    let r = s.get("/pull/adopt").await;
    assert_eq!(r.status, 405);
    // A forget of a key not held is answered, and nothing happens.
    let r = s
        .send(
            "POST",
            "/pull/forget",
            &[],
            format!(
                "{{\"marker\": {{\"session\": \"77\"}}, \"last\": \"{}\"}}",
                "1".repeat(32)
            ),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.json()["forgotten"].as_bool()),
        (200, Some(false))
    );
    assert_eq!(event(&s.metrics().await, "refused"), 5.0);
    // A rank without --rebalance adopts nothing.
    let off = Server::start(&[]).await;
    let r = off.send("POST", "/pull/forget", &[], "{}").await;
    assert_eq!(r.status, 409, "{}", r.text());
    // A tool turn the gateway sent no routing key for is counted, not copied.
    make_kv_heavy(s).await;
    let h = [
        ("x-tether-session", SESSION),
        ("x-tether-prompt-end", "1"),
        ("x-tether-turn-kind", "tool"),
    ];
    let r = s
        .post(
            "/v1/chat/completions",
            &h,
            &chat(&words("nk", 500), &["x"], 2),
        )
        .await;
    assert_eq!(r.status, 200);
    let m = s.metrics().await;
    assert_eq!(event(&m, "no_key"), 1.0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(event(&ranks[1].metrics().await, "adopted"), 0.0);
}

#[test]
fn bad_rebalancing_flags_are_refused_naming_the_flag() {
    let cfg = |extra: &[&str]| {
        let mut a = vec![
            "tether-rank".to_owned(),
            "--profile".to_owned(),
            profile_path().display().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        RankConfig::from_args(Args::try_parse_from(a).unwrap())
    };
    for (extra, flag) in [
        (vec!["--rebalance"], "--peers"),
        (vec!["--peers", "127.0.0.1:1 127.0.0.1:2"], "--peers"),
        (
            vec!["--rebalance", "--peers", "127.0.0.1:1 nowhere"],
            "--peers",
        ),
        (
            vec!["--rebalance", "--peers", "127.0.0.1:1,0 127.0.0.1:2"],
            "--peers",
        ),
        (
            vec![
                "--rebalance",
                "--peers",
                "127.0.0.1:1 127.0.0.1:2",
                "--candidates",
                "3",
            ],
            "--candidates",
        ),
        (vec!["--candidates", "2"], "--candidates"),
        (vec!["--rebalance-kv-factor", "1"], "--rebalance-kv-factor"),
        (vec!["--resident-factor", "0.5"], "--resident-factor"),
        (vec!["--resident-floor", "0"], "--resident-floor"),
        (vec!["--peer-poll-ms", "0"], "--peer-poll-ms"),
        (
            vec![
                "--rebalance",
                "--role",
                "prefill",
                "--peers",
                "127.0.0.1:1 127.0.0.1:2",
            ],
            "--rebalance",
        ),
    ] {
        let e = cfg(&extra).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{flag}:")), "{extra:?}: {e}");
    }
    // The flags parse, but this rank is not among the peers: refused at start.
    let c = cfg(&[
        "--rebalance",
        "--peers",
        "127.0.0.1:1",
        "127.0.0.1:2,1,b",
        "--listen",
        "127.0.0.1:3",
    ])
    .unwrap();
    let e = tether_rank::server::Rank::new(c).unwrap_err().to_string();
    assert!(e.starts_with("--peers: no endpoint is this rank"), "{e}");
}
