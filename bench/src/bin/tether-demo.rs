//! `tether-demo` (`make demo`): one bundled agent trace replayed through real
//! Envoy and the tether filter in front of four simulated ranks
//! (`tether-rank`), under the three settings a serving engineer compares:
//!
//! - (a) round robin + LRU prefix caching (vLLM's default, no affinity);
//! - (b) tether routing (pick mode) + LRU;
//! - (c) tether routing + turn-boundary retention + a host tier.
//!
//! It prints the comparison (hit ratio, prefill tokens computed, TTFT p50/p90,
//! cost per million tokens), says in a few lines what the numbers show, and
//! leaves every report, the comparison and the plots under `--out`.

use anyhow::{Context, Result, bail};
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_e2e::stack::{rank_args, replay_blocking};
use tether_e2e::{Stack, StackSpec, paths};
use tether_envoy::Mode;
use tether_fleet::cli::replay::write_report;
use tether_fleet::import::{Format, ImportOptions, import};
use tether_fleet::replay::assemble::Source;
use tether_fleet::replay::{Options, Route, Schedule};
use tether_fleet::report::compare::compare;
use tether_fleet::report::markdown::{count, pct};
use tether_fleet::report::{Report, plot};
use tether_fleet::synth::{Identity, SynthOptions};

#[derive(Parser)]
#[command(
    about = "Replay a bundled agent trace through Envoy + tether under three serving settings and compare them"
)]
struct Args {
    /// The agent trace (tether format).
    #[arg(long, default_value = "examples/traces/agent-demo.jsonl")]
    trace: PathBuf,
    /// Simulated ranks behind Envoy.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Device KV capacity per rank, tokens: scaled down with the trace (64
    /// sessions) so the caches fill up as a busy production rank's do.
    #[arg(long, default_value_t = 48_000)]
    kv_tokens: u64,
    /// Host tier per rank in setting (c), GiB.
    #[arg(long, default_value_t = 16.0)]
    host_gib: f64,
    /// Simulated time runs this many times faster than wall time (ranks and
    /// replay); the demo prints how far behind the trace's timestamps requests
    /// went — raise it only while that stays small.
    #[arg(long, default_value_t = 25.0)]
    speedup: f64,
    /// Replay only the first N sessions (a quicker run).
    #[arg(long)]
    sessions: Option<usize>,
    /// Where reports, the comparison and plots go.
    #[arg(long, default_value = "target/demo")]
    out: PathBuf,
}

struct Setting {
    name: &'static str,
    title: &'static str,
    mode: Mode,
    cache: &'static str,
}

const SETTINGS: [Setting; 3] = [
    Setting {
        name: "a-round-robin-lru",
        title: "(a) round robin + LRU",
        mode: Mode::RoundRobin,
        cache: "lru",
    },
    Setting {
        name: "b-tether-lru",
        title: "(b) tether routing + LRU",
        mode: Mode::Pick,
        cache: "lru",
    },
    Setting {
        name: "c-tether-retention-host",
        title: "(c) tether + retention + host tier",
        mode: Mode::Pick,
        cache: "retention-host",
    },
];

fn ms(v: f64) -> String {
    format!("{v:.0} ms")
}

fn main() -> Result<()> {
    let a = Args::parse();
    let started = Instant::now();
    let trace_path = if a.trace.is_relative() && !a.trace.exists() {
        paths::workspace_root().join(&a.trace)
    } else {
        a.trace.clone()
    };
    let trace = Arc::new(
        import(Format::Tether, &trace_path, &ImportOptions::default())
            .with_context(|| format!("reading {}", trace_path.display()))?,
    );
    let input: u64 = trace
        .requests()
        .iter()
        .map(|r| u64::from(r.input_tokens))
        .sum();
    println!(
        "tether demo: {} — {} sessions, {} requests, {:.1} M prompt tokens",
        a.trace.display(),
        a.sessions
            .unwrap_or(trace.sessions().len())
            .min(trace.sessions().len()),
        trace.requests().len(),
        input as f64 / 1e6
    );
    println!(
        "{} simulated ranks (tether-rank, Llama-3.1-8B FP8 on one H200, {} KV tokens each, {}× faster than real time) behind Envoy with the tether filter\n",
        a.ranks,
        count(a.kv_tokens),
        a.speedup
    );
    let source = Source {
        path: a.trace.display().to_string(),
        format: "tether".into(),
    };
    let mut reports: Vec<Report> = Vec::new();
    for s in &SETTINGS {
        let t0 = Instant::now();
        let mut spec = StackSpec::new(a.ranks, s.mode, &[]);
        spec.rank_args = rank_args(a.speedup, s.cache, a.kv_tokens, a.host_gib);
        let stack = Stack::start(&spec).with_context(|| format!("starting {}", s.title))?;
        let opts = stack.options(Options {
            targets: Vec::new(),
            route: Route::Session,
            schedule: Schedule::Fixed,
            max_inflight: 64,
            speedup: Some(a.speedup),
            max_gap_ms: 10_000,
            synth: SynthOptions {
                identity: Identity::None,
                ..Default::default()
            },
            timeout: Duration::from_secs(120),
            sessions: a.sessions,
            ranks: Vec::new(),
            gateway_admin: None,
            progress: false,
        });
        let (r, out) = replay_blocking(&trace, &source, &opts, s.title)?;
        drop(stack);
        write_report(&r, &out.observations, &a.out.join(s.name))?;
        println!(
            "{:<38} {} requests, {} errors, {:.1} s (sent behind the trace's timestamps by p50 {:.0} ms / p90 {:.0} ms of trace time)",
            s.title,
            r.requests.completed,
            r.requests.errors,
            t0.elapsed().as_secs_f64(),
            r.run.lag_ms.p50,
            r.run.lag_ms.p90
        );
        if r.requests.errors > 0 {
            bail!(
                "{}: {} requests failed ({:?}); see {}",
                s.title,
                r.requests.errors,
                r.requests.errors_by_kind,
                a.out.join(s.name).join("requests.jsonl").display()
            );
        }
        reports.push(r);
    }

    let c = compare(&reports)?;
    let dir = a.out.join("compare");
    std::fs::create_dir_all(&dir)?;
    let refs: Vec<&Report> = reports.iter().collect();
    let plots = plot::write_all(&refs, &dir)?;
    std::fs::write(dir.join("compare.md"), c.to_markdown())?;

    let [ra, rb, rc] = [&reports[0], &reports[1], &reports[2]];
    println!(
        "\n| setting | hit ratio | prefill tokens computed | TTFT p50 | TTFT p90 | $/Mtok |\n|---|---:|---:|---:|---:|---:|"
    );
    for r in &reports {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.run.label,
            pct(r.hit_ratio.overall),
            count(r.tokens.computed),
            ms(r.latency.ttft_ms.p50),
            ms(r.latency.ttft_ms.p90),
            r.cost
                .usd_per_mtok
                .map_or("-".into(), |v| format!("${v:.4}"))
        );
    }
    println!(
        "\nideal hit ratio of this trace: {} with perfect session affinity, {} with one cache shared by all (infinite caches)",
        pct(ra.hit_ratio.ideal_session),
        pct(ra.hit_ratio.ideal_global)
    );

    println!("\nWhat the numbers show:");
    println!(
        "- Round robin spreads each session's turns over all ranks, so a turn finds its own earlier prefix only where an earlier turn happened to land: {} of prompt tokens hit ({} of the ideal).",
        pct(ra.hit_ratio.overall),
        pct(ra.hit_ratio.of_ideal)
    );
    println!(
        "- tether routing sends every turn of a session (and of each subagent) to the rank holding its cache: {} hit, prefill work ×{:.2}, TTFT p50 {} → {}.",
        pct(rb.hit_ratio.overall),
        rb.tokens.computed as f64 / ra.tokens.computed.max(1) as f64,
        ms(ra.latency.ttft_ms.p50),
        ms(rb.latency.ttft_ms.p50)
    );
    let (avb, avc) = (
        rb.reprefill.avoidable_at_placement_tokens,
        rc.reprefill.avoidable_at_placement_tokens,
    );
    println!(
        "- With {} KV tokens per rank the caches fill up; LRU still evicts prompts whose session comes back ({} tokens of avoidable re-prefill). Retention keeps each turn's prompt end for its interval and moves it to the host tier under pressure: {} tokens ({}), {} hit, TTFT p90 {} → {}.",
        count(a.kv_tokens),
        count(avb),
        count(avc),
        if avc == 0 {
            "none left".to_owned()
        } else {
            format!("{:.1}× less", avb as f64 / avc as f64)
        },
        pct(rc.hit_ratio.overall),
        ms(rb.latency.ttft_ms.p90),
        ms(rc.latency.ttft_ms.p90)
    );
    let busy = |r: &Report| r.load.engines.iter().filter_map(|e| e.busy_s).sum::<f64>();
    let usd = |r: &Report| {
        r.cost
            .usd_per_mtok
            .map_or("-".into(), |v| format!("${v:.4}"))
    };
    println!(
        "- Cost per Mtok prices the ranks' busy GPU time (prefill and decode steps) at the profile's price: {} → {} → {}. From (a) to (c) prefill tokens fall ×{:.2} but busy time only ×{:.2}: the rest is decoding this trace's long answers, which no cache saves.",
        usd(ra),
        usd(rb),
        usd(rc),
        rc.tokens.computed as f64 / ra.tokens.computed.max(1) as f64,
        busy(rc) / busy(ra).max(1e-9)
    );
    println!(
        "\nReports: {}/{{{}}}/report.md; comparison with the configuration changes: {}",
        a.out.display(),
        SETTINGS.map(|s| s.name).join(","),
        dir.join("compare.md").display()
    );
    println!(
        "Plots: {}",
        plots
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("Demo finished in {:.0} s.", started.elapsed().as_secs_f64());
    Ok(())
}
