//! `gateway-bench`: what the tether filter costs inside a real Envoy, side by side
//! with no filter, the cheapest wasm filters (the floors) and Envoy's native JSON
//! routing, at 4 KB and 400 KB agent-shaped bodies.
//!
//! Run with `make bench-gateway` (or `cargo run --release -p tether-bench --bin
//! gateway-bench -- --quick`). Method and measured figures: `docs/bench-gateway.md`.

mod body;
mod cpu;
mod load;
mod perf;
mod report;
mod upstream;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use clap::Parser;
use hyper::header::{HeaderName, HeaderValue};
use load::{Reply, Target};
use report::{Results, Sample, Variant};
use std::collections::BTreeMap;
use std::time::Duration;
use tether_e2e::{Envoy, paths};

/// Measures six gateway configurations through real Envoy (one worker) in
/// interleaved rounds and prints medians, ratios and the two targets.
#[derive(Debug, Parser)]
#[command(name = "gateway-bench")]
struct Args {
    /// A short run (2 rounds, short phases) to check that everything works.
    #[arg(long)]
    quick: bool,
    /// Rounds; every variant runs once per round, in rotating order.
    #[arg(long)]
    rounds: Option<usize>,
    /// Seconds of each saturation phase.
    #[arg(long)]
    saturation_secs: Option<f64>,
    /// Seconds per variant of each round's interleaved concurrency-1 latency phase.
    #[arg(long)]
    latency_secs: Option<f64>,
    /// Connections at saturation.
    #[arg(long, default_value_t = 8)]
    conns: usize,
    /// Variants to run, by letter: a no filter, b header floor, c body floor,
    /// d tether header key, e tether body key, f native json_to_metadata,
    /// g the header floor inside tether's chain (d's floor),
    /// h the body floor inside tether's chain (e's floor),
    /// i (diagnostic) d with every header output, j (diagnostic) e with every
    /// header output, k (diagnostic) e for a vLLM connector (outputs vllm),
    /// l (diagnostic) h plus the host calls of tether's body path,
    /// m (diagnostic) l plus the least body-key decision.
    #[arg(long, default_value = "a,b,c,d,e,f,g,h,i,j,k,l,m")]
    variants: String,
    /// Print the phase timings a diagnostic filter build logs (`cargo build
    /// --features phase-timing`, given as `TETHER_FILTER_WASM`), per variant:
    /// where the time of a request goes inside Envoy's V8.
    #[arg(long)]
    phases: bool,
    /// Sample each variant's Envoy with Linux `perf` during the first round's
    /// saturation phase (files in this directory) and print where its CPU per
    /// request goes: the filter's wasm code, Envoy and V8, the kernel.
    #[arg(long)]
    perf: Option<std::path::PathBuf>,
    /// Pin every Envoy (all threads) to the last CPU and this process (client
    /// and upstream) to the others, with `taskset`: unpinned, each Envoy
    /// process lands where the scheduler puts it relative to the client, a
    /// per-process bias of tens of µs at concurrency 1 on a 2-core machine
    /// that the per-round pairing cannot cancel.
    #[arg(long)]
    pin: bool,
    /// Body sizes in bytes (the body-path target is judged at the largest).
    #[arg(long, value_delimiter = ',', default_values_t = [4096usize, 409600])]
    sizes: Vec<usize>,
}

/// Phase lengths after `--quick` and the explicit overrides.
struct Plan {
    rounds: usize,
    saturation: Duration,
    latency: Duration,
    warmup: Duration,
}

impl Args {
    fn plan(&self) -> Plan {
        let (rounds, sat, lat, warm) = if self.quick {
            (2, 0.5, 0.5, 0.5)
        } else {
            (9, 1.0, 1.0, 2.0)
        };
        Plan {
            rounds: self.rounds.unwrap_or(rounds).max(1),
            saturation: Duration::from_secs_f64(self.saturation_secs.unwrap_or(sat)),
            latency: Duration::from_secs_f64(self.latency_secs.unwrap_or(lat)),
            warmup: Duration::from_secs_f64(warm),
        }
    }

    fn variants(&self) -> Result<Vec<Variant>> {
        let range = format!(
            "{}-{}",
            Variant::ALL[0].letter(),
            Variant::ALL[Variant::ALL.len() - 1].letter()
        );
        let mut out = Vec::new();
        for part in self
            .variants
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let mut chars = part.chars();
            let (Some(c), None) = (chars.next(), chars.next()) else {
                bail!("variant {part:?} is not one letter {range}")
            };
            let v = Variant::from_letter(c)
                .with_context(|| format!("unknown variant {c:?} ({range})"))?;
            if !out.contains(&v) {
                out.push(v);
            }
        }
        ensure!(!out.is_empty(), "no variant selected");
        out.sort();
        Ok(out)
    }
}

/// The Envoy bootstraps of `envoy/bench/`, one per gateway configuration.
mod bootstraps {
    pub const NONE: &str = include_str!("../../../../envoy/bench/none.yaml");
    pub const HEADER_FLOOR: &str = include_str!("../../../../envoy/bench/header-floor.yaml");
    pub const BODY_FLOOR: &str = include_str!("../../../../envoy/bench/body-floor.yaml");
    pub const TETHER: &str = include_str!("../../../../envoy/bench/tether.yaml");
    pub const NATIVE_JSON: &str = include_str!("../../../../envoy/bench/native-json.yaml");
    pub const HEADER_FLOOR_CHAIN: &str =
        include_str!("../../../../envoy/bench/header-floor-chain.yaml");
    pub const BODY_FLOOR_CHAIN: &str =
        include_str!("../../../../envoy/bench/body-floor-chain.yaml");
}

/// Which Envoy serves a variant: one process per variant, even where two share
/// a configuration (d and e), because the latency phase interleaves variants
/// request by request and a process that serves two of them is woken twice as
/// often — warmer, and measurably faster at concurrency 1.
fn envoy_key(v: Variant) -> &'static str {
    match v {
        Variant::NoFilter => "none",
        Variant::HeaderFloor => "header-floor",
        Variant::BodyFloor => "body-floor",
        Variant::TetherHeader => "tether-header",
        Variant::TetherBody => "tether-body",
        Variant::NativeJson => "native-json",
        Variant::FloorInChain => "header-floor-chain",
        Variant::BodyFloorInChain => "body-floor-chain",
        Variant::AllHeader => "tether-all-header",
        Variant::AllBody => "tether-all-body",
        Variant::VllmBody => "tether-vllm-body",
        Variant::BodyReadInChain => "body-read-chain",
        Variant::MinimalKeyInChain => "body-key-chain",
    }
}

/// The routing key the body floor in tether's chain (h) hands to Envoy.
const BODY_FLOOR_KEY: &str = "body-floor-key";

/// Starts the Envoy for `v` with its bootstrap and plugin configuration.
fn start_envoy(v: Variant, upstream: &upstream::Upstream) -> Result<Envoy> {
    let mut builder = Envoy::builder().concurrency(1).log_level("warning");
    for (i, addr) in upstream.addrs().iter().enumerate() {
        builder = builder.var(format!("UP_{i}_PORT"), addr.port().to_string());
    }
    let first = upstream
        .addrs()
        .first()
        .context("the upstream has no port")?;
    let (yaml, builder) = match v {
        Variant::NoFilter => (bootstraps::NONE, builder),
        Variant::HeaderFloor => {
            paths::require_floor_wasm()?;
            (
                bootstraps::HEADER_FLOOR,
                builder.plugin_config(&serde_json::json!({"mode": "header"})),
            )
        }
        Variant::BodyFloor => {
            paths::require_floor_wasm()?;
            let config = serde_json::json!({"mode": "body", "dst": first.to_string()});
            (bootstraps::BODY_FLOOR, builder.plugin_config(&config))
        }
        Variant::TetherHeader | Variant::TetherBody => {
            paths::require_filter_wasm()?;
            (
                bootstraps::TETHER,
                builder.plugin_config(&serde_json::json!({"mode": "hash"})),
            )
        }
        // The harness gives the chain the header_mutation entries these
        // outputs need (tether_envoy::outputs::align).
        Variant::AllHeader | Variant::AllBody => {
            paths::require_filter_wasm()?;
            (
                bootstraps::TETHER,
                builder.plugin_config(&serde_json::json!({"mode": "hash", "outputs": "all"})),
            )
        }
        Variant::VllmBody => {
            paths::require_filter_wasm()?;
            (
                bootstraps::TETHER,
                builder.plugin_config(
                    &serde_json::json!({"mode": "hash", "outputs": ["hash", "vllm"]}),
                ),
            )
        }
        Variant::NativeJson => (bootstraps::NATIVE_JSON, builder),
        Variant::FloorInChain => {
            paths::require_floor_wasm()?;
            (
                bootstraps::HEADER_FLOOR_CHAIN,
                builder.plugin_config(&serde_json::json!({"mode": "header"})),
            )
        }
        Variant::BodyFloorInChain => {
            paths::require_floor_wasm()?;
            let config = serde_json::json!({"mode": "body-state", "key": BODY_FLOOR_KEY});
            (bootstraps::BODY_FLOOR_CHAIN, builder.plugin_config(&config))
        }
        Variant::BodyReadInChain => {
            paths::require_floor_wasm()?;
            let config = serde_json::json!({"mode": "body-read", "key": BODY_FLOOR_KEY});
            (bootstraps::BODY_FLOOR_CHAIN, builder.plugin_config(&config))
        }
        Variant::MinimalKeyInChain => {
            paths::require_floor_wasm()?;
            let config = serde_json::json!({"mode": "body-key", "field": "prompt_cache_key"});
            (bootstraps::BODY_FLOOR_CHAIN, builder.plugin_config(&config))
        }
    };
    Ok(builder.start(yaml)?)
}

/// The request a variant sends: the same body everywhere; the header variants
/// add `x-session-id` (the key tether's header path uses).
fn target(v: Variant, envoy: &Envoy, body: &Bytes) -> Target {
    let mut headers = Vec::new();
    if matches!(
        v,
        Variant::HeaderFloor | Variant::TetherHeader | Variant::FloorInChain | Variant::AllHeader
    ) {
        headers.push((
            HeaderName::from_static("x-session-id"),
            HeaderValue::from_static(body::SESSION_ID),
        ));
    }
    Target {
        addr: envoy.listen_addr(),
        headers,
        body: body.clone(),
    }
}

/// Checks once that a variant really took its path: the bench upstream answered,
/// got the whole body, and saw the routing evidence of that path.
fn check_reply(v: Variant, reply: &Reply, body_len: usize) -> Result<()> {
    let header = |name: &str| {
        reply
            .headers
            .get(name)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    };
    ensure!(reply.status == 200, "status {}", reply.status);
    let got =
        header("x-up-body-bytes").context("the reply did not come from the bench upstream")?;
    // Outputs `vllm` rewrite the body (the markers go into it): only longer.
    let rewritten = v == Variant::VllmBody;
    ensure!(
        got == body_len.to_string()
            || rewritten && got.parse::<usize>().is_ok_and(|n| n > body_len),
        "the upstream got {got} body bytes, sent {body_len}"
    );
    let source = header("x-up-x-tether-key-source").unwrap_or_default();
    match v {
        Variant::HeaderFloor | Variant::FloorInChain => ensure!(
            header("x-up-x-floor").as_deref() == Some("1"),
            "x-floor not set"
        ),
        // Default outputs: the key alone, so the path shows in what is absent.
        Variant::TetherHeader | Variant::TetherBody => ensure!(
            header("x-up-x-tether-key").is_some() && source.is_empty(),
            "expected x-tether-key alone (default outputs), key source {source:?}"
        ),
        Variant::AllHeader => ensure!(
            source == "header:x-session-id",
            "key source {source:?}, expected the header"
        ),
        Variant::AllBody => ensure!(
            source.starts_with("body:"),
            "key source {source:?}, expected a body field"
        ),
        Variant::VllmBody => ensure!(
            header("x-up-x-session-id").is_some() && header("x-up-x-tether-key").is_some(),
            "expected x-session-id and x-tether-key (outputs vllm)"
        ),
        Variant::NativeJson => ensure!(
            header("x-up-x-tether-key").as_deref() == Some(body::SESSION_ID),
            "json_to_metadata did not deliver prompt_cache_key as x-tether-key"
        ),
        Variant::BodyFloorInChain | Variant::BodyReadInChain => ensure!(
            header("x-up-x-tether-key").as_deref() == Some(BODY_FLOOR_KEY),
            "the body floor's filter state did not reach the upstream as x-tether-key"
        ),
        // The hash of the body's prompt_cache_key, not the floor's "missing" key.
        Variant::MinimalKeyInChain => ensure!(
            header("x-up-x-tether-key")
                .is_some_and(|k| k.len() == 16 && k.bytes().all(|b| b.is_ascii_hexdigit())),
            "the body-key floor did not find prompt_cache_key (x-tether-key {:?})",
            header("x-up-x-tether-key")
        ),
        Variant::NoFilter | Variant::BodyFloor => {}
    }
    Ok(())
}

/// `--pin`: Envoys on the last CPU, this process on the others. Assumes the
/// visible CPUs are numbered 0..N−1 (a cpuset that starts elsewhere makes
/// `taskset` fail, and the run stops with its status).
fn pin(envoys: &BTreeMap<&str, Envoy>) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    ensure!(cpus >= 2, "--pin needs at least 2 CPUs, {cpus} visible");
    let taskset = |cpus: &str, pid: u32| -> Result<()> {
        let status = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", cpus])
            .arg(pid.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .context("running taskset (util-linux) for --pin")?;
        ensure!(status.success(), "taskset -c {cpus} {pid}: {status}");
        Ok(())
    };
    let last = (cpus - 1).to_string();
    for envoy in envoys.values() {
        taskset(&last, envoy.pid())?;
    }
    taskset(&format!("0-{}", cpus - 2), std::process::id())?;
    eprintln!(
        "gateway-bench: Envoys pinned to CPU {last}, client and upstream to CPU 0-{}",
        cpus - 2
    );
    Ok(())
}

fn envoy_version() -> String {
    std::process::Command::new(paths::envoy_bin())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            // `envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`
            let build = text
                .split("version:")
                .nth(1)?
                .split_whitespace()
                .next()?
                .to_owned();
            build.split('/').nth(1).map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let plan = args.plan();
    let mut variants = args.variants()?;
    let mut sizes = args.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    ensure!(!sizes.is_empty(), "no body size");
    paths::require_envoy()?;

    let upstream = upstream::Upstream::start(4)?;
    let bodies: BTreeMap<usize, Bytes> = sizes
        .iter()
        .map(|&s| (s, Bytes::from(body::chat_completion(s, true))))
        .collect();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut envoys: BTreeMap<&str, Envoy> = BTreeMap::new();
    let mut skipped: Vec<(Variant, String)> = Vec::new();
    variants.retain(|&v| {
        let key = envoy_key(v);
        if !envoys.contains_key(key) {
            match start_envoy(v, &upstream) {
                Ok(envoy) => {
                    envoys.insert(key, envoy);
                }
                Err(e) => {
                    skipped.push((v, format!("{e:#}")));
                    return false;
                }
            }
        }
        let Some(envoy) = envoys.get(key) else {
            return false;
        };
        for (&size, body) in &bodies {
            let t = target(v, envoy, body);
            let outcome = rt
                .block_on(load::probe(&t))
                .and_then(|r| check_reply(v, &r, body.len()));
            if let Err(e) = outcome {
                skipped.push((
                    v,
                    format!(
                        "routing check at {} failed: {e:#}",
                        report::human_size(size)
                    ),
                ));
                return false;
            }
        }
        true
    });
    for (v, why) in &skipped {
        eprintln!(
            "gateway-bench: skipping {}. {}: {why}",
            v.letter(),
            v.label()
        );
    }
    ensure!(!variants.is_empty(), "no variant could run");

    let targets: BTreeMap<(Variant, usize), Target> = variants
        .iter()
        .flat_map(|&v| bodies.iter().map(move |(&s, b)| (v, s, b)))
        .filter_map(|(v, s, b)| envoys.get(envoy_key(v)).map(|e| ((v, s), target(v, e, b))))
        .collect();

    // Counted before --pin narrows this process's affinity.
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    if args.pin {
        pin(&envoys)?;
    }

    eprintln!("gateway-bench: warming up");
    for t in targets.values() {
        rt.block_on(async {
            load::saturate(t, args.conns, plan.warmup).await?;
            load::latency_interleaved(&[t], 20, plan.warmup / 4).await
        })?;
    }

    let mut results = Results::default();
    let mut splits = BTreeMap::new();
    for round in 0..plan.rounds {
        eprintln!("gateway-bench: round {}/{}", round + 1, plan.rounds);
        for &size in &sizes {
            // Latency: all variants in one interleaved phase (one request at a time).
            let phase: Vec<&Target> = variants.iter().map(|v| &targets[&(*v, size)]).collect();
            let budget = plan.latency * variants.len() as u32;
            let hists = rt.block_on(load::latency_interleaved(&phase, 20, budget))?;
            // Saturation: one variant at a time, the order rotating each round so
            // drift and the neighbours' load hit all alike.
            let mut order: Vec<(usize, Variant)> = variants.iter().copied().enumerate().collect();
            let turn = round % order.len();
            order.rotate_left(turn);
            for (i, v) in order {
                let pid = envoys.get(envoy_key(v)).map(Envoy::pid);
                let recording = match (&args.perf, pid) {
                    (Some(dir), Some(pid)) if round == 0 => Some(perf::record(
                        dir,
                        &format!("{}-{size}", v.letter()),
                        pid,
                        plan.saturation,
                    )?),
                    _ => None,
                };
                let meter = pid.map(cpu::Meter::start);
                let sat = rt.block_on(load::saturate(
                    &targets[&(v, size)],
                    args.conns,
                    plan.saturation,
                ))?;
                let cpu_us = meter.and_then(|m| m.per_request_us(sat.requests));
                if let Some(rec) = recording {
                    splits.insert((v, size), (rec.finish()?, cpu_us));
                }
                let hist = &hists[i];
                let sample = Sample {
                    p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
                    p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
                    rps: sat.rps,
                    cpu_us,
                };
                results.record(v, size, sample);
            }
        }
    }

    println!(
        "gateway-bench: Envoy {} --concurrency 1, {cores} CPU cores visible{}",
        envoy_version(),
        if args.pin {
            ", Envoys pinned to the last core, client and upstream to the others"
        } else {
            ""
        }
    );
    println!(
        "{} rounds (medians shown; ratios and deltas are medians of per-round pairs); latency at concurrency 1, variants interleaved request by request, {:.1} s per variant per round; saturation: {} connections for {:.1} s per variant per round",
        plan.rounds,
        plan.latency.as_secs_f64(),
        args.conns,
        plan.saturation.as_secs_f64()
    );
    let sizes_text: Vec<String> = bodies
        .iter()
        .map(|(s, b)| format!("{} ({} bytes)", report::human_size(*s), b.len()))
        .collect();
    println!(
        "bodies: Chat Completions agent transcripts, {}",
        sizes_text.join(", ")
    );
    println!("upstream: in-process hyper server (drains the body, fixed 200-byte reply)\n");
    println!("{}", report::table(&results, &variants, &sizes));
    println!("targets (floors inside tether's own chain):");
    println!("  {}", report::header_target(&results, &sizes));
    for &size in &sizes {
        println!("  {}", report::body_target(&results, size));
    }
    println!("diagnostics:");
    for &size in &sizes {
        let at = report::human_size(size);
        let chain = results.rps_ratio(Variant::FloorInChain, Variant::HeaderFloor, size);
        if let Some(chain) = chain {
            println!(
                "  header chain at {at}: the chain around a trivial filter costs {chain:.3}x (g vs b)"
            );
        }
        for (v, base, what) in [
            (
                Variant::AllHeader,
                Variant::TetherHeader,
                "header path, all outputs vs default (i vs d)",
            ),
            (
                Variant::AllBody,
                Variant::TetherBody,
                "body path, all outputs vs default (j vs e)",
            ),
            (
                Variant::VllmBody,
                Variant::TetherBody,
                "body path, markers in the body vs default (k vs e)",
            ),
            (
                Variant::TetherBody,
                Variant::BodyReadInChain,
                "body path, tether vs the floor making its host calls (e vs l)",
            ),
            (
                Variant::MinimalKeyInChain,
                Variant::BodyReadInChain,
                "body path, the least body-key decision vs the floor making tether's calls (m vs l)",
            ),
            (
                Variant::TetherBody,
                Variant::MinimalKeyInChain,
                "body path, tether vs the least body-key decision (e vs m)",
            ),
        ] {
            if let (Some(r), Some(dp)) = (
                results.rps_ratio(v, base, size),
                results.added_p50(v, base, size),
            ) {
                let cpu = results.added_cpu(v, base, size).map_or(String::new(), |c| {
                    format!(", {c:+.0} µs Envoy CPU per request")
                });
                println!("  {what} at {at}: {r:.3}x rps, {dp:+.0} µs p50{cpu}");
            }
        }
    }
    if !splits.is_empty() {
        print!("{}", perf::table(&splits));
    }
    if args.phases {
        println!("phase timings logged by the filter (median µs per window of requests):");
        for &v in &variants {
            let Some(envoy) = envoys.get(envoy_key(v)) else {
                continue;
            };
            for line in envoy.log().lines() {
                if let Some(i) = line.find("tether phases") {
                    println!("  {}. {}", v.letter(), &line[i..]);
                }
            }
        }
    }
    for (v, why) in &skipped {
        println!(
            "  not run: {}. {} — {}",
            v.letter(),
            v.label(),
            why.lines().next().unwrap_or("")
        );
    }
    Ok(())
}
