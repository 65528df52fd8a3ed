//! Load-aware pick through real Envoy: the same burst of hot sessions sent
//! to four `tether-rank`s behind the tether filter in pick mode, without and
//! with `load` (polled `/load`, bounded-load spill), side by side in one run.
//! Prints each setting's simulated TTFT and ITL quantiles and how the burst
//! spread, then a verdict per target. Run: `make bench-spill` (BENCHMARKS.md).
//!
//! The workload: `--sessions` sessions, each sending `--requests` requests
//! `--gap-ms` apart (all sessions interleaved), each with the session's
//! shared system prompt (400 words, cached after its first request), its own
//! `--unique-words` of new input (a tool result: computed wherever it lands)
//! and `--max-tokens` output tokens, at `--speedup`. Every request of a session has the same
//! key, so plain pick sends a session's whole burst to one rank.

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tether_e2e::{Envoy, HttpClient, Request, SimRank, bootstrap, paths};
use tether_rank_engine::profile::Profile;

#[derive(Parser, Debug)]
#[command(about = "Load-aware pick vs plain pick on a burst of hot sessions, through Envoy")]
struct Args {
    /// Hot sessions.
    #[arg(long, default_value_t = 2)]
    sessions: usize,
    /// Requests per session.
    #[arg(long, default_value_t = 48)]
    requests: usize,
    /// Gap between two requests of the whole burst in the light scenario, ms
    /// (the hot rank keeps up).
    #[arg(long, default_value_t = 15)]
    light_gap_ms: u64,
    /// Gap in the overloaded scenario, ms (the hot rank's prefill queues).
    #[arg(long, default_value_t = 5)]
    overload_gap_ms: u64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 100)]
    max_tokens: u64,
    /// Words (tokens) of each request's own, uncached part (tool output).
    #[arg(long, default_value_t = 2000)]
    unique_words: usize,
    /// Runs per setting; the table shows the median of each figure.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Ranks' simulated-time rate.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// The keep-up setting's `residency.prefill_tokens_per_s`, every rank's
    /// rate (default: unset, the filter's default, which reads the rate each
    /// rank reports in `/load`).
    #[arg(long)]
    keep_up_prefill_tps: Option<f64>,
}

/// One answered request: where it ran and its simulated latencies.
struct Sample {
    rank: String,
    ttft_ms: f64,
    itl_ms: f64,
}

/// Nearest-rank `q`-quantile (NaN for no samples).
fn quantile(v: &[f64], q: f64) -> f64 {
    tether_fleet::quantile::of(v, q).unwrap_or(f64::NAN)
}

fn words(seed: &str, n: usize) -> String {
    (0..n).map(|i| format!("{seed}{i} ")).collect()
}

/// What the filter is configured with.
#[derive(Clone, Copy, PartialEq)]
enum Setting {
    /// Pick mode alone.
    Plain,
    /// Pick + `load` (bounded-load spill).
    Load,
    /// Pick + `load` + `residency` (the state follows the key), with the
    /// turn markers the ranks retain by.
    Resident,
    /// `Resident` with `over_bound: "keep-up"`: a holder over the in-flight
    /// bound keeps its key unless moving starts the turn's prefill 50 ms
    /// sooner, its backlog read at the rate the rank reports (or at
    /// `prefill_tokens_per_s` when set).
    KeepUp { prefill_tps: Option<f64> },
    /// `Resident` with every rank's backlog read at 20,000 tokens/s (the
    /// filter's rate before ranks reported their own, 2026-12-07).
    ResidentFixedRate,
}

impl Setting {
    fn name(self) -> &'static str {
        match self {
            Setting::Plain => "plain",
            Setting::Load => "load-aware",
            Setting::Resident => "residency",
            Setting::KeepUp { .. } => "residency, keep-up",
            Setting::ResidentFixedRate => "residency, 20 K tokens/s",
        }
    }
}

async fn run(args: &Args, gap_ms: u64, ranks: &[SimRank], setting: Setting) -> Result<Vec<Sample>> {
    // Stable names: rendezvous hashes the name, not the address, so every
    // run (fresh ranks on new ports) places the hot sessions alike. By
    // address, one run in four put both on one rank, and the medians of
    // three runs flipped between the two layouts.
    let eps: Vec<Value> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"address": r.addr().to_string(), "name": format!("rank-{i}")}))
        .collect();
    let mut cfg = json!({"mode": "pick", "endpoints": eps});
    if setting != Setting::Plain {
        // The documented defaults (factor 2, floor 8), polled every 50 ms.
        cfg["load"] = json!({"poll_ms": 50});
    }
    match setting {
        // Its documented defaults (d = 3, bound 1.5 / 1); the ranks retain by
        // the markers and take migrations (`--role decode`).
        Setting::Resident => cfg["residency"] = json!({}),
        Setting::ResidentFixedRate => cfg["residency"] = json!({"prefill_tokens_per_s": 20_000}),
        Setting::KeepUp { prefill_tps } => {
            cfg["residency"] = json!({"over_bound": "keep-up"});
            if let Some(tps) = prefill_tps {
                cfg["residency"]["prefill_tokens_per_s"] = json!(tps.round());
            }
        }
        Setting::Plain | Setting::Load => {}
    }
    if cfg.get("residency").is_some() {
        cfg["outputs"] = json!(["pick", "retain"]);
    }
    let mut b = Envoy::builder().plugin_config(&cfg).concurrency(2);
    for (i, r) in ranks.iter().enumerate() {
        b = b
            .var(format!("RANK_{i}_IP"), r.addr().ip().to_string())
            .var(format!("RANK_{i}_PORT"), r.addr().port().to_string());
    }
    let envoy = b.start(bootstrap::DEMO).context("starting Envoy")?;
    // Let the first polls land (and the plain setting wait as long).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = HttpClient::new().timeout(Duration::from_secs(120));
    // Both settings send the same requests with the same keys (fresh ranks each).
    let tag = "bench";
    let systems: Vec<String> = (0..args.sessions)
        .map(|s| words(&format!("{tag}s{s}w"), 400))
        .collect();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..args.sessions * args.requests {
        let s = i % args.sessions;
        let due = start + Duration::from_millis(gap_ms * i as u64);
        tokio::time::sleep_until(due.into()).await;
        let body = json!({"model": "m", "max_tokens": args.max_tokens, "messages": [
            {"role": "system", "content": systems[s]},
            {"role": "user", "content": words(&format!("{tag}r{i}w"), args.unique_words)}]});
        let req = Request::post_json("/v1/chat/completions", &body)
            .header("x-session-id", format!("hot-{s}"));
        let (client, addr) = (client.clone(), envoy.listen_addr());
        tasks.push(tokio::spawn(async move { client.send(addr, req).await }));
    }
    let mut out = Vec::new();
    for t in tasks {
        let r = t.await?.context("request")?;
        if r.status != 200 {
            bail!("status {}: {}", r.status, String::from_utf8_lossy(&r.body));
        }
        let v: Value = r.json()?;
        let u = &v["usage"]["tether"];
        out.push(Sample {
            rank: r.header("x-tether-rank").unwrap_or("?").to_owned(),
            ttft_ms: u["sim_ttft_ms"].as_f64().unwrap_or(f64::NAN),
            itl_ms: u["sim_itl_ms"].as_f64().unwrap_or(f64::NAN),
        });
    }
    Ok(out)
}

struct Summary {
    ttft_p50: f64,
    ttft_p99: f64,
    itl_p50: f64,
    itl_p99: f64,
    max_share: f64,
    ranks_used: usize,
}

fn summarize(s: &[Sample]) -> Summary {
    let ttft: Vec<f64> = s.iter().map(|x| x.ttft_ms).collect();
    let itl: Vec<f64> = s.iter().map(|x| x.itl_ms).collect();
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for x in s {
        *by.entry(x.rank.as_str()).or_default() += 1;
    }
    Summary {
        ttft_p50: quantile(&ttft, 0.5),
        ttft_p99: quantile(&ttft, 0.99),
        itl_p50: quantile(&itl, 0.5),
        itl_p99: quantile(&itl, 0.99),
        max_share: by.values().copied().max().unwrap_or(0) as f64 / s.len().max(1) as f64,
        ranks_used: by.len(),
    }
}

/// The median of each figure over runs.
fn median(runs: &[Summary]) -> Summary {
    let m = |f: fn(&Summary) -> f64| {
        tether_fleet::quantile::median(&runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
    };
    Summary {
        ttft_p50: m(|s| s.ttft_p50),
        ttft_p99: m(|s| s.ttft_p99),
        itl_p50: m(|s| s.itl_p50),
        itl_p99: m(|s| s.itl_p99),
        max_share: m(|s| s.max_share),
        ranks_used: m(|s| s.ranks_used as f64) as usize,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let profile = paths::workspace_root().join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json");
    let rank_args: Vec<String> = [
        "--profile",
        &profile.display().to_string(),
        "--speedup",
        &args.speedup.to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    println!(
        "spill-bench: {} hot sessions x {} requests, {} new input tokens, {} output tokens, speedup {}, 4 ranks, Envoy 2 workers; load-aware = load {{poll_ms: 50}} (factor 2, floor 8); medians of {} runs",
        args.sessions,
        args.requests,
        args.unique_words,
        args.max_tokens,
        args.speedup,
        args.repeats.max(1)
    );
    // The keep-up setting's backlog test reads each rank's reported rate
    // unless `--keep-up-prefill-tps` sets one; the profile's rate at one
    // request's prompt (system + new words, a token a word) for reference.
    let prompt = (400 + args.unique_words) as f64;
    let at_prompt = prompt / Profile::from_file(&profile)?.prefill_ttft_ms.at(prompt) * 1e3;
    match args.keep_up_prefill_tps {
        Some(tps) => {
            println!("residency, keep-up: prefill_tokens_per_s {tps:.0} (--keep-up-prefill-tps)")
        }
        None => println!(
            "residency, keep-up: each rank's reported prefill rate (the profile prefills {at_prompt:.0} tokens/s at {prompt} tokens)"
        ),
    }
    let keep_up = Setting::KeepUp {
        prefill_tps: args.keep_up_prefill_tps,
    };
    println!(
        "{:<44} {:>10} {:>10} {:>9} {:>9} {:>10} {:>6}",
        "scenario / setting", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "max share", "ranks"
    );
    let mut results = Vec::new();
    for (scenario, gap) in [
        ("light", args.light_gap_ms),
        ("overload", args.overload_gap_ms),
    ] {
        let mut pair = Vec::new();
        for setting in [
            Setting::Plain,
            Setting::Load,
            Setting::Resident,
            keep_up,
            Setting::ResidentFixedRate,
        ] {
            let mut runs = Vec::new();
            let mut args_here = rank_args.clone();
            if !matches!(setting, Setting::Plain | Setting::Load) {
                args_here.extend(["--role".to_owned(), "decode".to_owned()]);
            }
            for _ in 0..args.repeats.max(1) {
                // Fresh ranks per run: no cache or queue carried over.
                let ranks = (0..4)
                    .map(|_| SimRank::start(&args_here))
                    .collect::<Result<Vec<_>, _>>()?;
                runs.push(summarize(&run(&args, gap, &ranks, setting).await?));
            }
            let s = median(&runs);
            let name = format!("{scenario} ({gap} ms) / {}", setting.name());
            println!(
                "{name:<44} {:>8.1}ms {:>8.1}ms {:>7.2}ms {:>7.2}ms {:>9.0}% {:>6}",
                s.ttft_p50,
                s.ttft_p99,
                s.itl_p50,
                s.itl_p99,
                s.max_share * 100.0,
                s.ranks_used
            );
            pair.push(s);
        }
        results.push(pair);
    }
    let verdict = |ok: bool| if ok { "MET" } else { "MISSED" };
    let (light, over) = (&results[0], &results[1]);
    let r = |p: &[Summary], f: fn(&Summary) -> f64| f(&p[0]) / f(&p[1]);
    let over_p50 = r(over, |s| s.ttft_p50);
    let light_p99 = r(light, |s| s.ttft_p99);
    println!(
        "overload: TTFT p50 plain / load-aware = {over_p50:.2}x (target >= 1.5x): {}",
        verdict(over_p50 >= 1.5)
    );
    println!(
        "overload: TTFT p99 {:.2}x, ITL p99 {:.2}x (reported; p99 holds the backlog queued before the first poll saw it)",
        r(over, |s| s.ttft_p99),
        r(over, |s| s.itl_p99)
    );
    println!(
        "light: TTFT p99 plain / load-aware = {light_p99:.2}x (target >= 0.95x: spilling costs a light fleet nothing): {}",
        verdict(light_p99 >= 0.95)
    );
    println!(
        "overload: burst on {} ranks with load-aware vs {} plain (target: more): {}",
        over[1].ranks_used,
        over[0].ranks_used,
        verdict(over[1].ranks_used > over[0].ranks_used)
    );
    // Residency (issue: the session's state follows it): the same targets,
    // for each residency setting (columns 2 and 3).
    for (col, label) in [
        (2, "residency"),
        (3, "keep-up"),
        (4, "residency at 20 K tokens/s"),
    ] {
        let ratio = |p: &[Summary], f: fn(&Summary) -> f64| f(&p[0]) / f(&p[col]);
        let over_p50 = ratio(over, |s| s.ttft_p50);
        let light_p99 = ratio(light, |s| s.ttft_p99);
        println!(
            "{label}, overload: TTFT p50 plain / {label} = {over_p50:.2}x (target >= 1.5x): {}",
            verdict(over_p50 >= 1.5)
        );
        println!(
            "{label}, light: TTFT p99 plain / {label} = {light_p99:.2}x (target >= 0.95x): {}",
            verdict(light_p99 >= 0.95)
        );
    }
    Ok(())
}
