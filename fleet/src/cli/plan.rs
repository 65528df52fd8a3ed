//! `tether plan`: prefill and decode replica counts per interval against
//! latency objectives and a cost target, each plan verified by simulating it
//! (`docs/cli.md`, method in `docs/planning.md`).

use super::simulate::{FleetArgs, load_profile};
use crate::cli::input::TraceArgs;
use crate::plan::progress::Observer;
use crate::plan::size::Slo;
use crate::plan::{ApiPrice, PlanConfig, RunOptions, Spend, Target, deploy, output, plan_with};
use crate::report::Report;
use crate::report::observe::Observation;
use crate::sim::{CacheMode, FleetShape, Policy};
use crate::trace::{Trace, content_hash};
use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

/// `tether plan`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The trace and its format.
    #[command(flatten)]
    pub input: TraceArgs,
    /// A replay of this trace (`tether replay --out DIR`): plan on the cache hits it observed.
    #[arg(long)]
    pub replay: Option<PathBuf>,
    /// TTFT p90 objective, ms.
    #[arg(long)]
    pub ttft_p90_ms: Option<f64>,
    /// TTFT p99 objective, ms.
    #[arg(long)]
    pub ttft_p99_ms: Option<f64>,
    /// Per-token ITL p99 objective, ms.
    #[arg(long)]
    pub itl_p99_ms: Option<f64>,
    /// Minimum interactivity, output tokens/s per stream (an ITL of 1000 / this ms).
    #[arg(long)]
    pub min_interactivity: Option<f64>,
    /// Cost target, $ per million tokens: `X` (every token) or `IN,OUT` (input and output prices).
    #[arg(long, value_parser = parse_target)]
    pub target: Option<Target>,
    /// An API's prices per million tokens, `IN,CACHE_READ,OUT` or
    /// `IN,CACHE_READ,CACHE_WRITE,OUT`: prints its cost ÷ the chosen fleet's.
    #[arg(long, value_parser = parse_api)]
    pub api_price: Option<ApiPrice>,
    /// Under the target, spend the headroom on this (`interactivity`).
    #[arg(long, value_parser = parse_spend)]
    pub spend_headroom: Option<Spend>,
    /// Hold every planning interval to the objectives (default: the whole trace).
    #[arg(long)]
    pub per_interval_objectives: bool,
    /// Plan a trace with requests over the profile's max_model_len: those are
    /// refused as the engine refuses them, counted and left out of the objectives.
    #[arg(long)]
    pub cap_context: bool,
    /// Size the given routing, cache and engine settings only (no search).
    #[arg(long)]
    pub no_search: bool,
    /// Routing policy of the planned fleet.
    #[arg(long, default_value = "tether-bounded", value_parser = Policy::parse)]
    pub policy: Policy,
    /// Cache mode of the planned fleet.
    #[arg(long, default_value = "retention-host", value_parser = CacheMode::parse)]
    pub cache: CacheMode,
    /// Planning interval, seconds of trace time.
    #[arg(long, default_value_t = 300.0)]
    pub interval_s: f64,
    /// Simulation rounds per plan to correct the profile's first guess.
    #[arg(long, default_value_t = 6)]
    pub rounds: usize,
    /// Search a trace of more than twice this many requests on a session
    /// sample of about this many, and simulate the choice on the whole trace
    /// (0: search on the whole trace).
    #[arg(long, default_value_t = 10_000)]
    pub sample_requests: usize,
    /// Simulate a sampled plan's choice on the whole trace at the trace's own
    /// KV blocks instead of the sample's coarser ones (the default: 3-4x
    /// faster; each turn may cache up to one block less, which only adds work).
    #[arg(long, conflicts_with = "coarse_whole")]
    pub fine_whole: bool,
    /// The whole-trace simulation at the sample's coarser blocks: the default
    /// now (kept so that earlier commands still run).
    #[arg(long)]
    pub coarse_whole: bool,
    /// No progress bar (it is drawn on stderr only when stderr is a terminal).
    #[arg(long)]
    pub quiet: bool,
    /// Engine, routing and P/D settings (as `tether simulate`).
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Write the whole report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the replica counts per interval as JSON here.
    #[arg(long)]
    pub replicas: Option<PathBuf>,
    /// Write the chosen configuration as a Dynamo DynamoGraphDeployment here.
    #[arg(long)]
    pub dynamo: Option<PathBuf>,
    /// Write the chosen configuration as llm-d-style LeaderWorkerSets here.
    #[arg(long)]
    pub llm_d: Option<PathBuf>,
    /// The engine image of the manifests (required with --dynamo or --llm-d).
    #[arg(long)]
    pub image: Option<String>,
    /// Name of the deployment (a DNS label).
    #[arg(long, default_value = "tether")]
    pub name: String,
    /// Write the tokens-per-GPU-second vs interactivity chart (SVG) here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// `s` as comma-separated non-negative prices, as many as one of `n`.
fn numbers(s: &str, n: &[usize]) -> Result<Vec<f64>> {
    let v: Vec<f64> = s
        .split(',')
        .map(|x| {
            x.trim()
                .parse::<f64>()
                .with_context(|| format!("`{x}` is not a number"))
        })
        .collect::<Result<_>>()?;
    if !n.contains(&v.len()) {
        bail!(
            "`{s}`: expected {} comma-separated numbers",
            n.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        );
    }
    if v.iter().any(|x| !x.is_finite() || *x < 0.0) {
        bail!("`{s}`: prices must be non-negative");
    }
    Ok(v)
}

fn parse_target(s: &str) -> Result<Target> {
    Ok(match numbers(s, &[1, 2])?.as_slice() {
        [x] => Target::Blended(*x),
        [i, o] => Target::Split {
            input: *i,
            output: *o,
        },
        _ => bail!("`{s}`: expected 1 or 2 comma-separated numbers"),
    })
}

fn parse_api(s: &str) -> Result<ApiPrice> {
    match *numbers(s, &[3, 4])?.as_slice() {
        [input, cached_input, output] => Ok(ApiPrice {
            input,
            cached_input,
            cache_write: None,
            output,
        }),
        [input, cached_input, cache_write, output] => Ok(ApiPrice {
            input,
            cached_input,
            cache_write: Some(cache_write),
            output,
        }),
        _ => bail!("`{s}`: expected 3 or 4 comma-separated numbers"),
    }
}

fn parse_spend(s: &str) -> Result<Spend> {
    match s {
        "interactivity" => Ok(Spend::Interactivity),
        _ => bail!("`{s}`: the headroom can be spent on `interactivity`"),
    }
}

/// The cache hits a replay observed, per trace request (`None`: not served).
fn observed_hits(dir: &Path, trace: &Trace) -> Result<Vec<Option<u32>>> {
    let report = Report::read(&dir.join("report.json"))
        .with_context(|| format!("--replay {}", dir.display()))?;
    let hash = content_hash(trace);
    if report.trace.content_hash != hash {
        bail!(
            "--replay {}: that replay ran trace {}, not this one ({hash})",
            dir.display(),
            report.trace.content_hash
        );
    }
    let path = dir.join("requests.jsonl");
    let f = std::fs::File::open(&path).with_context(|| format!("--replay: {}", path.display()))?;
    let mut hits = vec![None; trace.requests().len()];
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}", path.display(), n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let o: Observation =
            serde_json::from_str(&line).with_context(|| format!("{}:{}", path.display(), n + 1))?;
        if let (Some(s), Some(slot)) = (o.served(), hits.get_mut(o.request as usize)) {
            *slot = Some(u32::try_from(s.cached_tokens).unwrap_or(u32::MAX));
        }
    }
    Ok(hits)
}

/// The plan's progress as one bar on stderr: the search's candidates, then
/// the whole trace's requests, each phase with its ETA.
struct Bar(ProgressBar);

impl Bar {
    /// Hidden with `--quiet` or when stderr is not a terminal.
    fn new(quiet: bool) -> Self {
        let bar = ProgressBar::new(1);
        if quiet || !std::io::stderr().is_terminal() {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        Self(bar)
    }
}

impl Observer for Bar {
    fn phase(&self, name: &str, len: u64, unit: &str) {
        let style = ProgressStyle::with_template(&format!(
            "{{prefix:>12}} [{{bar:30}}] {{pos}}/{{len}} {unit}, eta {{eta}} ({{elapsed}}) {{wide_msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        self.0.set_style(style);
        self.0.set_prefix(name.to_owned());
        self.0.set_length(len.max(1));
        self.0.reset();
    }

    fn grow(&self, len: u64) {
        if self.0.length().is_some_and(|l| len > l) {
            self.0.set_length(len);
        }
    }

    fn at(&self, done: u64) {
        // The search's length is an estimate: never show more done than planned.
        self.grow(done);
        self.0.set_position(done);
    }

    fn note(&self, what: &str) {
        self.0.set_message(what.to_owned());
    }
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let trace = a.input.read()?;
    let profile = load_profile(&a.fleet.profile)?;
    let itl = match (a.itl_p99_ms, a.min_interactivity) {
        (x, Some(i)) if i > 0.0 && i.is_finite() => {
            Some(x.map_or(1000.0 / i, |x| x.min(1000.0 / i)))
        }
        (_, Some(i)) => bail!("--min-interactivity: {i} must be positive"),
        (x, None) => x,
    };
    let slo = Slo {
        ttft_p90_ms: a.ttft_p90_ms,
        ttft_p99_ms: a.ttft_p99_ms,
        itl_p99_ms: itl,
    };
    for (flag, v) in [
        ("--ttft-p90-ms", slo.ttft_p90_ms),
        ("--ttft-p99-ms", slo.ttft_p99_ms),
        ("--itl-p99-ms", slo.itl_p99_ms),
    ] {
        if v.is_some_and(|x| x.is_nan() || x <= 0.0) {
            bail!("{flag}: must be positive");
        }
    }
    if slo.ttft_p90_ms.is_none() && slo.ttft_p99_ms.is_none() && slo.itl_p99_ms.is_none() {
        bail!(
            "give at least one objective: --ttft-p90-ms, --ttft-p99-ms, --itl-p99-ms or --min-interactivity"
        );
    }
    if (a.dynamo.is_some() || a.llm_d.is_some()) && a.image.is_none() {
        bail!("--dynamo and --llm-d need --image (the engine image the pods run)");
    }
    let dns = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if a.name.is_empty()
        || a.name.len() > 40
        || !a.name.chars().all(dns)
        || a.name.starts_with('-')
        || a.name.ends_with('-')
    {
        bail!(
            "--name {:?}: must be a DNS label of at most 40 characters (a-z, 0-9, -)",
            a.name
        );
    }
    let observed = a
        .replay
        .as_deref()
        .map(|d| observed_hits(d, &trace))
        .transpose()?;
    let mut sim = a.fleet.config(&profile, FleetShape::aggregated(1))?;
    sim.policy = a.policy;
    sim.cache = a.cache;
    let cfg = PlanConfig {
        sim,
        slo,
        target: a.target,
        api_price: a.api_price,
        interval_ms: a.interval_s * 1000.0,
        rounds: a.rounds,
        observed_hits: observed,
        per_interval: a.per_interval_objectives,
        cap_context: a.cap_context,
        spend: a.spend_headroom,
        search: !a.no_search,
    };
    if a.spend_headroom.is_some() && a.target.is_none() {
        bail!("--spend-headroom needs a --target to spend under");
    }
    let bar = Bar::new(a.quiet);
    let run = RunOptions {
        sample_requests: a.sample_requests,
        coarse_whole: !a.fine_whole,
        observer: &bar,
    };
    let report = plan_with(&trace, &profile, &cfg, &run);
    bar.0.finish_and_clear();
    let report = report?;
    println!(
        "trace {} ({}): {} requests; profile {} ({} GPU/engine, ${}/GPU-hour)",
        a.input.path().display(),
        content_hash(&trace),
        trace.requests().len(),
        profile.name,
        profile.gpus_per_engine,
        profile.gpu_hour_usd
    );
    print!("{}", output::text(&report));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.replicas {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&output::replicas_json(&report))?,
        )
        .with_context(|| format!("writing {}", p.display()))?;
    }
    for (path, render) in [
        (&a.dynamo, deploy::dynamo as fn(&_, &_) -> Option<String>),
        (&a.llm_d, deploy::llm_d),
    ] {
        let Some(p) = path else { continue };
        let Some(image) = &a.image else { continue };
        let o = deploy::DeployOptions {
            name: a.name.clone(),
            model: profile.model.clone(),
            image: image.clone(),
            gpus_per_engine: profile.gpus_per_engine,
            max_model_len: profile.max_model_len,
            host_bytes: cfg.sim.host_bytes,
        };
        match render(&report, &o) {
            Some(y) => std::fs::write(p, y).with_context(|| format!("writing {}", p.display()))?,
            None => eprintln!(
                "{}: not written, no configuration meets the objectives",
                p.display()
            ),
        }
    }
    if let Some(p) = &a.svg {
        std::fs::write(p, output::svg(&report))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if report.chosen.is_none() {
        bail!("no configuration meets the objectives (see the verdict above)");
    }
    Ok(())
}
