//! Where a large agent body spends its time, hop by hop (issue 27 part 4:
//! the coding-agent corpus through Envoy, ≈0.6 MB bodies): the replay
//! client's synthesis of the corpus, the rank's reading of a body (JSON + the
//! simulated tokenizer), one request to a rank process, the same request
//! through Envoy and the tether filter on its header and its body path, and
//! what the filter's load polling costs while nothing is sent. Medians over
//! rounds, CPU time beside wall time; a `--tether-before` / `--rank-before`
//! binary (an older checkout's) is timed beside the current one, interleaved.
//! Figures: BENCHMARKS.md, "The coding-agent corpus through Envoy".
//!
//! Run (after `make wasm envoy-install` and a release build of `tether` and
//! `tether-rank`): `make bench-body`, or
//! `cargo run --release -p tether-bench --bin body-bench -- --tether-before OLD/tether`

mod hops;

use anyhow::{Context, Result};
use clap::Parser;
use std::path::PathBuf;
use tether_bench::root;
use tether_fleet::generate::{GenerateOptions, Preset, generate};
use tether_fleet::synth::{Identity, SessionSynth, SynthOptions};
use tether_fleet::trace::{IdForm, SessionId, Trace, write_trace_file};

#[derive(Parser, Debug)]
#[command(about = "Where a large agent body spends its time, hop by hop")]
pub struct Args {
    /// Sessions of the coding-agent corpus (seed 19, starts over 600 s: the
    /// corpus `resident-bench` replays through Envoy).
    #[arg(long, default_value_t = 24)]
    sessions: u32,
    /// The largest bodies of the corpus timed per request.
    #[arg(long, default_value_t = 24)]
    bodies: usize,
    /// Rounds; figures are medians over them.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// A `tether` binary to time the corpus' synthesis against (`tether trace synth --summary`).
    #[arg(long)]
    tether_before: Option<PathBuf>,
    /// A `tether-rank` binary to time one-request exchanges against.
    #[arg(long)]
    rank_before: Option<PathBuf>,
    /// Skip parts: `client`, `read`, `rank`, `envoy`, `poll` (comma-separated).
    #[arg(long, default_value = "")]
    skip: String,
}

/// The corpus and where it was written (for the `tether` binaries).
struct Corpus {
    trace: Trace,
    path: PathBuf,
    /// The largest bodies (Claude Code identity, as resident-bench sends them).
    bodies: Vec<Body>,
}

/// One synthesized request.
pub struct Body {
    path: &'static str,
    headers: Vec<(String, String)>,
    bytes: Vec<u8>,
}

fn corpus(a: &Args) -> Result<Corpus> {
    let o = GenerateOptions {
        seed: 19,
        sessions: a.sessions,
        session_span_ms: Some(600_000.0),
        ..Preset::CodingAgent.options()
    };
    let trace = generate(&o)?;
    let path = root().join("target/body-bench/corpus.jsonl");
    std::fs::create_dir_all(path.parent().context("no parent")?)?;
    write_trace_file(&trace, IdForm::Runs, &path)?;
    let opts = SynthOptions {
        identity: Identity::ClaudeCode,
        ..Default::default()
    };
    let mut bodies: Vec<Body> = (0..trace.sessions().len() as u32)
        .flat_map(|s| SessionSynth::new(&trace, SessionId(s), opts.clone()))
        .map(|(_, r)| Body {
            path: r.path,
            headers: r.headers,
            bytes: r.body,
        })
        .collect();
    bodies.sort_by_key(|b| std::cmp::Reverse(b.bytes.len()));
    bodies.truncate(a.bodies);
    Ok(Corpus {
        trace,
        path,
        bodies,
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    let skip: Vec<&str> = a.skip.split(',').map(str::trim).collect();
    let c = corpus(&a)?;
    let mb = |n: usize| n as f64 / 1e6;
    let total: usize = c.bodies.iter().map(|b| b.bytes.len()).sum();
    println!(
        "corpus: tether trace generate --preset coding-agent --seed 19 --sessions {} --span-s 600 ({} requests); the {} largest bodies: {:.2}–{:.2} MB, mean {:.2} MB; {} rounds, medians",
        a.sessions,
        c.trace.requests().len(),
        c.bodies.len(),
        mb(c.bodies.last().map_or(0, |b| b.bytes.len())),
        mb(c.bodies.first().map_or(0, |b| b.bytes.len())),
        mb(total) / c.bodies.len().max(1) as f64,
        a.rounds
    );
    if !skip.contains(&"client") {
        hops::client(&a, &c.path)?;
    }
    if !skip.contains(&"read") {
        hops::read(&a, &c.bodies)?;
    }
    if !skip.contains(&"rank") || !skip.contains(&"envoy") {
        hops::exchanges(&a, &c.bodies, &skip)?;
    }
    if !skip.contains(&"poll") {
        hops::poll()?;
    }
    Ok(())
}
