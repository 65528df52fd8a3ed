//! `tether replay` and `tether compare` as a user runs them, against a real
//! `tether-rank` server (in this process, over loopback): reports written,
//! bad input refused by name, ^C (SIGINT) leaving a partial report.

use super::{TempDir, tether, text};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tether_rank::config::{Args, RankConfig};
use tether_rank::server::{Rank, serve};

/// A `tether-rank` served from a background thread; returns its address.
fn rank(speedup: &str) -> String {
    let profile = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/profiles/llama-3.1-8b-fp8-h200-tp1.json")
        .display()
        .to_string();
    let args = <Args as clap::Parser>::try_parse_from([
        "tether-rank",
        "--profile",
        &profile,
        "--listen",
        "127.0.0.1:0",
        "--speedup",
        speedup,
        "--rank-id",
        "test-rank",
    ])
    .expect("flags");
    let cfg = RankConfig::from_args(args).expect("config");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind(cfg.args.listen)
                .await
                .expect("bind");
            tx.send(l.local_addr().expect("addr").to_string())
                .expect("send");
            let _ = serve(l, Rank::new(cfg).expect("rank")).await;
        });
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("rank ready")
}

fn generate(dir: &TempDir, name: &str, seed: &str, sessions: &str) -> String {
    let out = dir.path(name);
    let o = tether(&[
        "trace",
        "generate",
        "--seed",
        seed,
        "--sessions",
        sessions,
        "--session-gap-ms",
        "3000",
        "--system-tokens",
        "300",
        "--tool-tokens",
        "300",
        "--tool-result-tokens",
        "300",
        "--calls-per-turn",
        "3",
        "--user-turns",
        "2",
        "--output",
        &out,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    out
}

/// The report in `dir`, after checking every file a report writes is there.
fn report(dir: &str) -> serde_json::Value {
    for f in [
        "report.json",
        "report.md",
        "requests.jsonl",
        "ttft_cdf.svg",
        "hit_over_time.svg",
        "load.svg",
    ] {
        assert!(
            std::path::Path::new(&format!("{dir}/{f}")).is_file(),
            "{dir}/{f} missing"
        );
    }
    serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/report.json")).expect("report.json"),
    )
    .expect("json")
}

#[test]
fn a_replay_writes_its_report_and_compare_refuses_other_traces() {
    let dir = TempDir::new("ok");
    let addr = rank("1000");
    let a = generate(&dir, "a.jsonl", "4", "4");
    let b = generate(&dir, "b.jsonl", "5", "4");
    for (trace, out, label) in [
        (&a, "ra", "first"),
        (&a, "rb", "second"),
        (&b, "rc", "other"),
    ] {
        let out = dir.path(out);
        let o = tether(&[
            "replay", "--trace", trace, "--target", &addr, "--out", &out, "--label", label,
            "--quiet", "--salt", label,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("hit ratio"), "{}", text(&o));
        let r = report(&out);
        assert_eq!(r["format"], "tether-report");
        assert_eq!(r["run"]["partial"], false);
        assert_eq!(r["requests"]["sent"], r["requests"]["in_trace"]);
        assert_eq!(r["requests"]["errors"], 0);
        assert_eq!(r["run"]["clock"], "simulated");
        assert_eq!(r["load"]["engines"][0]["engine"], "test-rank#0");
        assert_eq!(r["config"]["keys"]["rank.speedup"], "1000.0");
        assert_eq!(
            r["run"]["speedup"], 1000.0,
            "the rank's speedup is used when not given"
        );
    }
    // Live schedule: two session trees at a time, every request still served.
    let live = dir.path("live");
    let o = tether(&[
        "replay", "--trace", &a, "--target", &addr, "--out", &live, "--live", "2", "--quiet",
        "--stream", "--api", "messages",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let r = report(&live);
    assert_eq!(r["run"]["schedule"], "live");
    assert_eq!(r["requests"]["completed"], r["requests"]["in_trace"]);
    assert_eq!(r["config"]["keys"]["replay.schedule"], "live 2");
    assert_eq!(r["config"]["keys"]["replay.api"], "messages");
    let o = tether(&["compare", &dir.path("ra"), &dir.path("rb")]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("| metric | first | second |"),
        "{}",
        text(&o)
    );
    let o = tether(&["compare", &dir.path("ra"), &dir.path("rc")]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("reports of different traces"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_simulation_and_a_replay_of_the_same_trace_compare_side_by_side() {
    let dir = TempDir::new("sim-vs-replay");
    let addr = rank("1000");
    let trace = generate(&dir, "t.jsonl", "7", "4");
    let profile = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/profiles/llama-3.1-8b-fp8-h200-tp1.json")
        .display()
        .to_string();
    let (replayed, simulated) = (dir.path("replay"), dir.path("sim"));
    // The trace as the positional argument, as every other subcommand takes it.
    let o = tether(&[
        "replay", &trace, "--target", &addr, "--out", &replayed, "--label", "served", "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // The rank's own settings: one rank, `--cache retention`, blocks of 16 tokens.
    let o = tether(&[
        "simulate",
        &trace,
        "--profile",
        &profile,
        "--ranks",
        "1",
        "--policy",
        "tether",
        "--cache",
        "retention",
        "--block-size",
        "16",
        "--out",
        &simulated,
        "--label",
        "simulated",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let (r, s) = (report(&replayed), report(&simulated));
    assert_eq!(s["format"], "tether-report");
    assert_eq!(s["run"]["tool"], "tether simulate");
    assert_eq!(s["run"]["clock"], "simulated");
    assert_eq!(s["trace"]["content_hash"], r["trace"]["content_hash"]);
    assert_eq!(s["requests"]["completed"], s["requests"]["in_trace"]);
    assert_eq!(r["requests"]["completed"], r["requests"]["in_trace"]);
    // The same requests reached both: the same prompt and output tokens.
    assert_eq!(s["tokens"]["prompt"], r["tokens"]["prompt"]);
    assert_eq!(s["tokens"]["output"], r["tokens"]["output"]);
    // The simulated rank is described as the served one: the keys line up.
    for k in [
        "rank.cache",
        "rank.block_size",
        "rank.max_num_seqs",
        "profile.hash",
    ] {
        assert_eq!(s["config"]["keys"][k], r["config"]["keys"][k], "{k}");
    }
    // The simulator's own figures are the report's extension, not in a replay's.
    assert!(
        s["simulation"]["oracle_share"]
            .as_f64()
            .is_some_and(|x| x > 0.0)
    );
    assert!(s["simulation"]["steps"].as_u64().is_some_and(|x| x > 0));
    assert!(r.get("simulation").is_none());
    let cmp = dir.path("cmp");
    let o = tether(&["compare", &simulated, &replayed, "--out", &cmp]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("| metric | simulated | served |"), "{t}");
    assert!(
        t.contains("Produced by: simulated: `tether simulate`, served: `tether replay`"),
        "{t}"
    );
    assert!(t.contains("| `sim.policy` | tether | (absent) |"), "{t}");
    assert!(std::path::Path::new(&format!("{cmp}/compare.md")).is_file());
    // The planner takes a simulation where it takes a replay.
    let o = tether(&[
        "plan",
        &trace,
        "--profile",
        &profile,
        "--replay",
        &simulated,
        "--ttft-p90-ms",
        "2000",
        "--rounds",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn bad_traces_and_flags_are_refused_by_name() {
    let dir = TempDir::new("bad");
    let good = generate(&dir, "g.jsonl", "6", "2");
    let mut lines: Vec<String> = std::fs::read_to_string(&good)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    lines[2] = "{\"type\":\"request\",".to_owned();
    let bad = dir.path("bad.jsonl");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let o = tether(&[
        "replay",
        "--trace",
        &bad,
        "--target",
        "127.0.0.1:1",
        "--quiet",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains(&format!("{bad}:3: ")), "{}", text(&o));
    let o = tether(&[
        "replay",
        "--trace",
        &good,
        "--format",
        "sharegpt",
        "--target",
        "127.0.0.1:1",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("unknown trace format `sharegpt`"),
        "{}",
        text(&o)
    );
    let o = tether(&["replay", "--trace", &good, "--target", "https://x:1"]);
    assert!(text(&o).contains("plain http only"), "{}", text(&o));
    let o = tether(&["replay", "--trace", &good, "--target", "not-a-host:abc"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("the port is not a number"),
        "{}",
        text(&o)
    );
    let o = tether(&[
        "replay",
        "--trace",
        &good,
        "--target",
        "127.0.0.1:1",
        "--max-error-rate",
        "1.5",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--max-error-rate"), "{}", text(&o));
    let o = tether(&[
        "replay",
        "--trace",
        &good,
        "--target",
        "127.0.0.1:1",
        "--live",
        "0",
    ]);
    assert!(text(&o).contains("--live"), "{}", text(&o));
    // Nothing listens there: every request is a counted connect error, no hang.
    let out = dir.path("dead");
    let o = tether(&[
        "replay",
        "--trace",
        &good,
        "--target",
        "127.0.0.1:1",
        "--speedup",
        "1000",
        "--quiet",
        "--out",
        &out,
    ]);
    assert!(!o.status.success(), "nothing succeeded: {}", text(&o));
    assert!(
        text(&o).contains("error: no request succeeded"),
        "{}",
        text(&o)
    );
    let r = report(&out);
    assert_eq!(r["requests"]["errors"], r["requests"]["sent"]);
    assert_eq!(
        r["requests"]["errors_by_kind"]["connect"],
        r["requests"]["sent"]
    );
}

#[test]
fn sigint_writes_a_partial_report() {
    let dir = TempDir::new("sigint");
    // Real time (speedup 1): 12 sessions 3 s apart take half a minute.
    let addr = rank("1");
    let trace = generate(&dir, "t.jsonl", "7", "12");
    let out = dir.path("partial");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args([
            "replay", "--trace", &trace, "--target", &addr, "--out", &out, "--quiet",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(2500));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let start = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "replay did not stop after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(130));
    let r = report(&out);
    assert_eq!(r["run"]["partial"], true);
    assert!(
        r["run"]["partial_reason"]
            .as_str()
            .unwrap()
            .contains("interrupted")
    );
    let (sent, total) = (
        r["requests"]["sent"].as_u64().unwrap(),
        r["requests"]["in_trace"].as_u64().unwrap(),
    );
    assert!(sent > 0 && sent < total, "sent {sent} of {total}");
    assert_eq!(r["requests"]["not_sent"].as_u64().unwrap(), total - sent);
    assert!(
        std::fs::read_to_string(format!("{out}/report.md"))
            .unwrap()
            .contains("**PARTIAL**")
    );
}

#[test]
fn gateway_writes_a_bootstrap_and_refuses_reserved_plugin_fields() {
    let dir = TempDir::new("gateway");
    let out = dir.path("envoy.yaml");
    let o = tether(&[
        "gateway",
        "--ranks",
        "127.0.0.1:8001,127.0.0.1:8002",
        "--mode",
        "hash",
        "--output",
        &out,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let y = std::fs::read_to_string(&out).unwrap();
    assert!(
        y.contains("port_value: 8002") && y.contains("maglev") && !y.contains("${"),
        "{y}"
    );
    let cfg = dir.path("plugin.json");
    std::fs::write(&cfg, r#"{"mode": "pick", "fallbacks": 1}"#).unwrap();
    let o = tether(&[
        "gateway",
        "--ranks",
        "127.0.0.1:8001",
        "--plugin-config",
        &cfg,
        "--output",
        &out,
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("plugin configuration field `mode`"),
        "{}",
        text(&o)
    );
    let o = tether(&["gateway", "--ranks", "127.0.0.1:8001", "--mode", "random"]);
    assert!(text(&o).contains("unknown mode `random`"), "{}", text(&o));
}

/// Run from another directory with no environment: the bootstrap names the
/// module of the checkout `tether` was built in by its absolute path.
#[test]
fn gateway_defaults_do_not_depend_on_the_current_directory() {
    let dir = TempDir::new("gateway-cwd");
    let out = dir.path("envoy.yaml");
    let o = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args([
            "gateway",
            "--ranks",
            "127.0.0.1:8001",
            "--no-validate",
            "--output",
            &out,
        ])
        .current_dir(&dir.0)
        .env_remove("TETHER_FILTER_WASM")
        .env_remove("TETHER_ENVOY")
        .output()
        .expect("run tether");
    assert!(o.status.success(), "{}", text(&o));
    let y = std::fs::read_to_string(&out).unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap();
    let module = root.join("target/wasm32-wasip1/wasm-release/tether_filter.wasm");
    assert!(
        y.contains(&format!("filename: {}", module.display())),
        "{}\n{y}",
        module.display()
    );
}

/// `--agentx N`: N live session trees, streamed exact-length answers, gaps
/// capped at 10 s, and a run-unique salt, so a second run against the same warm
/// rank finds nothing of the first one cached.
#[test]
fn agentx_mode_follows_the_harness_rules_and_busts_the_cache_per_run() {
    let dir = TempDir::new("agentx");
    let addr = rank("1000");
    let t = generate(&dir, "t.jsonl", "9", "3");
    // The two sessions start together and share the run's salted prefix, so
    // whichever is served second may hit the other's prefill: of the first
    // wave (the `--agentx 2` first requests), at least one must be cold. A
    // salt that did not bust the cache would warm both from the run before.
    let coldest_first = |out: &str| -> u64 {
        let text = std::fs::read_to_string(format!("{out}/requests.jsonl")).unwrap();
        let mut rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        rows.sort_by(|a, b| {
            a["sent_ms"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["sent_ms"].as_f64().unwrap())
        });
        rows.iter()
            .take(2)
            .map(|r| r["outcome"]["served"]["cached_tokens"].as_u64().unwrap())
            .min()
            .unwrap()
    };
    for run in ["a1", "a2"] {
        let out = dir.path(run);
        let o = tether(&[
            "replay",
            &t,
            "--target",
            &addr,
            "--out",
            &out,
            "--quiet",
            "--agentx",
            "2",
            "--max-gap-ms",
            "60000",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let r = report(&out);
        let keys = &r["config"]["keys"];
        assert_eq!(keys["replay.schedule"], "live 2");
        assert_eq!(keys["replay.stream"], "true");
        assert_eq!(keys["replay.exact_output"], "true");
        assert_eq!(keys["replay.max_gap_ms"], "10000", "the harness's cap wins");
        assert_eq!(r["requests"]["completed"], r["requests"]["in_trace"]);
        assert_eq!(
            coldest_first(&out),
            0,
            "{run}: a cold start, whatever ran before"
        );
    }
    let o = tether(&[
        "replay", &t, "--target", &addr, "--agentx", "2", "--live", "2",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--live"), "{}", text(&o));
}
