//! `tether replay`: send a trace to a serving stack and write its report
//! (`report.json`, `report.md`, `requests.jsonl`, SVG plots) into `--out`.

use super::trace::synth::SynthArgs;
use crate::cli::input::TraceArgs;
use crate::replay::{self, Options, Route, Schedule, Target};
use crate::report::{self, markdown, plot};
use anyhow::{Context, Result, bail};
use clap::{Args as ClapArgs, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tether_placement::FALLBACK_PREFILL_TOKENS_PER_S;

/// How requests are spread over several `--target`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RouteArg {
    /// The gateway's placement of the session/subagent key (rendezvous).
    Session,
    /// In turn.
    RoundRobin,
    /// By residency and load (the filter's `residency` pick), polling the
    /// targets' `/load`; sends the turn markers and, for a migration,
    /// `x-tether-pull-from` (or, `--migrate leg`, `x-prefiller-host-port`).
    Resident,
}

/// `--route resident`: the placement rule's settings (the filter's
/// `residency` and `load` configuration, docs/gateway.md).
#[derive(Debug, Clone, ClapArgs)]
#[command(next_help_heading = "Resident route")]
pub struct ResidentArgs {
    /// Rendezvous candidates a key may live on (d).
    #[arg(long, default_value_t = tether_placement::DEFAULT_CANDIDATES)]
    pub candidates: usize,
    /// Bounded-load factor c (> 1).
    #[arg(long, default_value_t = 2.0)]
    pub balance_factor: f64,
    /// Below this load (running + waiting) a target always takes its keys.
    #[arg(long, default_value_t = 8.0)]
    pub balance_floor: f64,
    /// How often the targets' /load is polled, ms.
    #[arg(long, default_value_t = 200)]
    pub load_poll_ms: u64,
    /// The ranks' KV-transfer link, GB/s (the migrate rule).
    #[arg(long, default_value_t = 50.0)]
    pub kv_link_gbps: f64,
    /// Fixed cost of one KV transfer, ms (the migrate rule).
    #[arg(long, default_value_t = 5.0)]
    pub transfer_setup_ms: f64,
    /// KV bytes per token of the served model (the migrate rule).
    #[arg(long, default_value_t = 131_072)]
    pub kv_bytes_per_token: u64,
    /// Prefill tokens per second of every target (a backlog's wait and the
    /// migrate rule's recompute cost). Unset: each target's own rate from its
    /// `/load` (`prefill_tokens_per_s`), and 20,000 where it reports none.
    #[arg(long)]
    pub prefill_tokens_per_s: Option<f64>,
    /// How a migrated state moves: `pull` (the new rank pulls it from the old
    /// home, named in `x-tether-pull-from`) or `leg` (a prefill leg on the old
    /// home, named in `x-prefiller-host-port`; the ranks run `--role decode`).
    #[arg(long, default_value = "pull", value_parser = parse_migrate)]
    pub migrate: crate::sim::Migrate,
    /// A holder over the bound: `move` (to the least loaded other candidate) or
    /// `keep-up` (keeps the key unless moving starts the turn's prefill 50 ms
    /// sooner, by the targets' reported prefill backlogs).
    #[arg(long, default_value = "move", value_parser = crate::cli::simulate::parse_over_bound)]
    pub over_bound: tether_placement::OverBound,
}

fn parse_migrate(s: &str) -> Result<crate::sim::Migrate, String> {
    crate::sim::Migrate::parse(s).map_err(|e| e.to_string())
}

impl ResidentArgs {
    /// The rule, refusing settings out of range by flag name.
    pub fn rule(&self) -> Result<tether_placement::Rule> {
        if self.candidates == 0 {
            bail!("--candidates must be at least 1");
        }
        if self.balance_factor.is_nan() || self.balance_factor <= 1.0 {
            bail!(
                "--balance-factor {} must be greater than 1",
                self.balance_factor
            );
        }
        for (flag, v) in [
            ("--balance-floor", self.balance_floor),
            ("--kv-link-gbps", self.kv_link_gbps),
            ("--transfer-setup-ms", self.transfer_setup_ms),
            (
                "--prefill-tokens-per-s",
                self.prefill_tokens_per_s
                    .unwrap_or(FALLBACK_PREFILL_TOKENS_PER_S),
            ),
        ] {
            if !v.is_finite() || v < 0.0 {
                bail!("{flag} {v} must be a non-negative number");
            }
        }
        Ok(tether_placement::Rule {
            candidates: self.candidates,
            bound: tether_placement::LoadBound {
                factor: self.balance_factor,
                floor: self.balance_floor,
            },
            cost: tether_placement::MoveCost::from_link(
                self.kv_bytes_per_token as f64,
                self.kv_link_gbps,
                self.transfer_setup_ms,
                self.prefill_tokens_per_s
                    .unwrap_or(FALLBACK_PREFILL_TOKENS_PER_S),
            ),
            unseen: tether_placement::Unseen::default(),
            over_bound: self.over_bound,
        })
    }
}

/// `tether replay`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The trace and its format.
    #[command(flatten)]
    pub input: TraceArgs,
    /// Where requests go: `http://host:port` (Envoy, a rank, any OpenAI-compatible
    /// server); repeat or separate with commas for several (see --route).
    #[arg(long, required = true, value_delimiter = ',')]
    pub target: Vec<String>,
    /// With several targets: `session` (the gateway's own placement),
    /// `round-robin`, or `resident` (residency and load, polling the targets).
    #[arg(long, value_enum, default_value_t = RouteArg::Session)]
    pub route: RouteArg,
    #[command(flatten)]
    pub resident: ResidentArgs,
    /// Replay N live session trees at a time (AgentX-style) instead of the trace's timestamps.
    #[arg(long)]
    pub live: Option<usize>,
    /// The AgentX harness's rules with N live session trees: `--live N`,
    /// streamed answers of exactly the trace's output tokens (`ignore_eos` +
    /// `min_tokens`), gaps capped at 10 s, and every prompt cache-busted for this
    /// run (a fresh `--salt` unless one is given); docs/cli.md lists what differs.
    #[arg(long, value_name = "N", conflicts_with = "live")]
    pub agentx: Option<usize>,
    /// Most requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub max_inflight: usize,
    /// Trace time runs F× faster than wall time (default: the scraped ranks' `--speedup`, else 1).
    #[arg(long)]
    pub speedup: Option<f64>,
    /// Live schedule: cap every think/tool gap at this many trace ms.
    #[arg(long, default_value_t = 10_000)]
    pub max_gap_ms: u64,
    /// Replay only the first N sessions (by start time).
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Request synthesis (as `tether trace synth`).
    #[command(flatten)]
    pub synth: SynthArgs,
    /// Per-request timeout, seconds (wall).
    #[arg(long, default_value_t = 300.0)]
    pub timeout_s: f64,
    /// Ranks to read configuration and busy time from (`ip:port`, comma-separated);
    /// default: the ranks named by `x-tether-rank` in the answers, read at the end.
    #[arg(long, value_delimiter = ',')]
    pub ranks: Vec<String>,
    /// Envoy admin address (`ip:port` or URL) to read the gateway's configuration from.
    #[arg(long)]
    pub gateway_admin: Option<String>,
    /// Column name in `tether compare`.
    #[arg(long, default_value = "")]
    pub label: String,
    /// Directory for the report files.
    #[arg(long, default_value = "replay-report")]
    pub out: PathBuf,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Exit non-zero (after writing the report) when more than this fraction of
    /// the requests sent failed; without it, only a replay in which no request
    /// succeeded fails.
    #[arg(long, value_parser = fraction)]
    pub max_error_rate: Option<f64>,
}

/// The AgentX harness's idle cap (trace ms).
const AGENTX_IDLE_CAP_MS: u64 = 10_000;

/// A value unique to this run (its start time in ns), for the AgentX cache-bust.
fn run_nonce() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A number from 0 to 1.
fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a fraction from 0 to 1")),
    }
}

/// The replay's verdict on its own errors: `Err` (a non-zero exit) when no
/// request succeeded, or when the error rate is over `max_error_rate`.
pub fn check_errors(r: &report::model::Requests, max_error_rate: Option<f64>) -> Result<()> {
    let sent = r.completed + r.errors;
    if sent == 0 {
        return Ok(());
    }
    let kinds = r
        .errors_by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    if r.completed == 0 {
        bail!(
            "no request succeeded: {} of {sent} failed ({kinds})",
            r.errors
        );
    }
    let rate = r.errors as f64 / sent as f64;
    if let Some(max) = max_error_rate
        && rate > max
    {
        bail!(
            "{} of {sent} requests failed ({:.2} %, over --max-error-rate {max}): {kinds}",
            r.errors,
            rate * 100.0
        );
    }
    Ok(())
}

/// `ip:port` or a URL → a URL (`http://` added when no scheme is given).
fn origin(s: &str) -> String {
    if s.contains("://") {
        s.trim_end_matches('/').to_owned()
    } else {
        format!("http://{s}")
    }
}

/// Writes the report files into `dir`; returns the markdown path.
pub fn write_report(
    r: &report::Report,
    observations: &[report::Observation],
    dir: &Path,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--out {}: cannot create", dir.display()))?;
    let plots = plot::write_all(&[r], dir)?;
    let names: Vec<String> = plots
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    std::fs::write(dir.join("report.json"), r.to_json())
        .with_context(|| format!("writing {}", dir.join("report.json").display()))?;
    let md = dir.join("report.md");
    std::fs::write(&md, markdown::render(r, &names))
        .with_context(|| format!("writing {}", md.display()))?;
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(dir.join("requests.jsonl"))
            .with_context(|| format!("writing {}", dir.join("requests.jsonl").display()))?,
    );
    for o in observations {
        serde_json::to_writer(&mut f, o)?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    Ok(md)
}

/// One line per headline figure.
pub fn summary(r: &report::Report) -> String {
    let h = &r.hit_ratio;
    let l = &r.latency;
    format!(
        "{}{} requests ({} errors), hit ratio {} ({} of the shared-cache ceiling {}; session-affinity ceiling {}; returning turns {}), prefill computed {} tokens, TTFT p50/p90 {:.1}/{:.1} ms ({} clock), load max/mean {}, cost {}",
        if r.run.partial { "PARTIAL: " } else { "" },
        r.requests.completed,
        r.requests.errors,
        markdown::pct(h.overall),
        markdown::pct(h.of_shared_cache),
        markdown::pct(h.ideal_global),
        markdown::pct(h.ideal_session),
        markdown::pct(h.returning),
        markdown::count(r.tokens.computed),
        l.ttft_ms.p50,
        l.ttft_ms.p90,
        r.run.clock,
        r.load
            .max_over_mean_prompt_tokens
            .map_or("-".to_owned(), |v| format!("{v:.2}")),
        r.cost
            .usd_per_mtok
            .map_or("-".to_owned(), |v| format!("${v:.4}/Mtok"))
    )
}

/// Runs it. A ^C stops sending, writes the report marked partial and exits 130.
pub fn run(a: Args) -> Result<()> {
    let targets: Vec<Target> = a
        .target
        .iter()
        .map(|t| Target::parse(&origin(t)).map_err(anyhow::Error::from))
        .collect::<Result<_>>()
        .context("--target")?;
    if a.live == Some(0) {
        bail!("--live: must be at least 1");
    }
    if a.max_inflight == 0 {
        bail!("--max-inflight: must be at least 1");
    }
    if let Some(s) = a.speedup
        && !(s.is_finite() && s > 0.0)
    {
        bail!("--speedup: must be a positive number");
    }
    if !(a.timeout_s.is_finite() && a.timeout_s > 0.0) {
        bail!("--timeout-s: must be a positive number");
    }
    if a.agentx == Some(0) {
        bail!("--agentx: must be at least 1");
    }
    let trace = Arc::new(a.input.read()?);
    let mut synth = a.synth.options();
    let mut max_gap_ms = a.max_gap_ms;
    if a.agentx.is_some() {
        synth.stream = true;
        synth.exact_output = true;
        max_gap_ms = max_gap_ms.min(AGENTX_IDLE_CAP_MS);
        if synth.salt.is_empty() {
            synth.salt = format!("agentx-{}", run_nonce());
        }
    }
    let schedule = match a.live.or(a.agentx) {
        Some(n) => Schedule::Live(n),
        None => Schedule::Fixed,
    };
    let opts = Options {
        targets: targets.clone(),
        route: match a.route {
            RouteArg::Session => Route::Session,
            RouteArg::RoundRobin => Route::RoundRobin,
            RouteArg::Resident => Route::Resident {
                rule: a.resident.rule()?,
                poll_ms: a.resident.load_poll_ms,
                migrate: a.resident.migrate,
                own_rates: a.resident.prefill_tokens_per_s.is_none(),
            },
        },
        schedule,
        max_inflight: a.max_inflight,
        speedup: a.speedup,
        max_gap_ms,
        synth,
        timeout: Duration::from_secs_f64(a.timeout_s),
        sessions: a.sessions,
        ranks: a.ranks.iter().map(|r| origin(r)).collect(),
        gateway_admin: a.gateway_admin.as_deref().map(origin),
        progress: !a.quiet,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    let out = runtime.block_on(async {
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("interrupted: stopping, writing a partial report");
                let _ = cancel_tx.send(true);
            }
        });
        replay::replay(trace.clone(), opts.clone(), cancel_rx).await
    })?;
    for w in &out.warnings {
        eprintln!("warning: {w}");
    }
    let r = replay::assemble::report(&trace, &a.input.source(), &opts, &out, &a.label);
    let md = write_report(&r, &out.observations, &a.out)?;
    println!("{}", summary(&r));
    println!(
        "report: {} (JSON, plots and requests.jsonl beside it)",
        md.display()
    );
    if r.run.partial {
        std::process::exit(130);
    }
    check_errors(&r.requests, a.max_error_rate)
}

#[cfg(test)]
mod tests;
