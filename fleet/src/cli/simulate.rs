//! `tether simulate`: routing policies and cache modes side by side on one
//! trace, on a simulated fleet (`docs/cli.md`, method in `docs/planning.md`).

use super::input::TraceArgs;
use super::replay::write_report;
use crate::name::UnknownName;
use crate::sim::assemble::{self, ProfileSource};
use crate::sim::config::{Migrate, PrefixOptions};
use crate::sim::identity::{Identities, IdentityModel};
use crate::sim::plot::{self, Point};
use crate::sim::report::{peak_rss_bytes, table};
use crate::sim::run::describe;
use crate::sim::{
    CacheMode, FleetShape, PdOptions, Policy, RunOutput, RunReport, SimConfig, oracle_hits_within,
    simulate,
};
use crate::trace::{Trace, content_hash};
use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use tether_rank_engine::engine::EngineSettings;
use tether_rank_engine::profile::Profile;

/// `tether simulate`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The trace and its format.
    #[command(flatten)]
    pub input: TraceArgs,
    /// Aggregated ranks (ignored with --pd).
    #[arg(long, default_value_t = 8)]
    pub ranks: usize,
    /// Disaggregated fleet: prefill and decode ranks, `P,D`.
    #[arg(long, value_parser = parse_pd)]
    pub pd: Option<(usize, usize)>,
    /// Routing policies, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Cache modes, comma-separated: lru, retention, retention-host.
    #[arg(long, default_value = "lru,retention,retention-host")]
    pub cache: String,
    /// Engine, routing and P/D settings shared with `tether plan`.
    #[command(flatten)]
    pub fleet: FleetArgs,
    /// Runs at once (default: the machine's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the throughput-per-GPU vs interactivity chart (SVG) here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write each run's report here as `tether replay --out` does (`report.json`,
    /// `report.md`, `requests.jsonl`, plots): into DIR for one run, into
    /// `DIR/<policy>.<cache>/` for several.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Column name in `tether compare` (default: `simulate <policy> / <cache>`).
    #[arg(long)]
    pub label: Option<String>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

/// Engine, routing, P/D and identity settings of a simulated fleet (shared by
/// `tether simulate` and `tether plan`; `docs/cli.md`).
#[derive(Debug, Clone, ClapArgs)]
pub struct FleetArgs {
    /// GPU profile: tether JSON, or a JSON naming Dynamo's NPZ files (docs/profile.md).
    #[arg(long)]
    pub profile: PathBuf,
    /// Device KV tokens per rank (default: the profile's max_kv_tokens).
    #[arg(long)]
    pub kv_tokens: Option<u64>,
    /// Host tier per rank with retention-host, GiB (default: 4 × the device KV bytes).
    #[arg(long)]
    pub host_gib: Option<f64>,
    /// Tokens per engine KV block; must divide the trace's block size (default: equal).
    #[arg(long, default_value_t = 0)]
    pub block_size: usize,
    /// vLLM --max-num-seqs of every rank.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// vLLM --max-num-batched-tokens of every rank.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Bounded-load factor c of tether-bounded and tether-load (> 1).
    #[arg(long, default_value_t = 2.0)]
    pub balance_factor: f64,
    /// Bounded load: below this load (requests in flight; running + waiting for
    /// tether-load) a rank always takes its keys.
    #[arg(long, default_value_t = 8.0)]
    pub balance_floor: f64,
    /// Rendezvous fallbacks per key for bounded load.
    #[arg(long, default_value_t = 8)]
    pub fallbacks: usize,
    /// tether-load, tether-resident: how often the ranks' load is polled, ms.
    #[arg(long, default_value_t = 200.0)]
    pub load_poll_ms: f64,
    /// tether-resident: rendezvous candidates a key may live on (d).
    #[arg(long, default_value_t = tether_placement::DEFAULT_CANDIDATES)]
    pub candidates: usize,
    /// tether-resident: bounded-load factor c over running + waiting (> 1).
    #[arg(long, default_value_t = 1.5)]
    pub resident_factor: f64,
    /// tether-resident: below this load a holder always keeps its keys.
    #[arg(long, default_value_t = 1.0)]
    pub resident_floor: f64,
    /// tether-resident: a holder over the bound: `move` (to the least loaded
    /// other candidate) or `keep-up` (keeps the key unless moving starts the
    /// turn's prefill 50 ms sooner; the filter's `residency.over_bound`).
    #[arg(long, default_value = "move", value_parser = parse_over_bound)]
    pub resident_over_bound: tether_placement::OverBound,
    /// tether-resident: weight of a rank's recent busy share (0–1, from its
    /// `/load` report) beside its requests in flight, 0 to 1 (the filter's
    /// 0.9 breaks ties toward the less busy rank; 0: ties by rendezvous order).
    #[arg(long, default_value_t = tether_placement::BUSY_WEIGHT)]
    pub resident_busy_weight: f64,
    /// tether-resident: fixed cost of one KV transfer in the migrate rule, ms.
    #[arg(long, default_value_t = 5.0)]
    pub transfer_setup_ms: f64,
    /// tether-resident: how a migrated state moves: `pull` (the new rank
    /// leases the state from the old home and reads it; the default, as the
    /// filter's) or `leg` (the P/D path, a prefill leg on the old home).
    #[arg(long, default_value = "pull", value_parser = parse_migrate)]
    pub migrate: Migrate,
    /// tether-resident: copy a tool/handoff turn's state to a cooler candidate
    /// during the tool gap when its home holds more device KV than the mean by
    /// --rebalance-kv-factor (docs/planning.md, "Rebalancing in tool gaps").
    #[arg(long)]
    pub rebalance: bool,
    /// tether-resident with --rebalance: a home whose device KV in use is above
    /// this × the ranks' mean is relieved (> 1).
    #[arg(long, default_value_t = 1.1)]
    pub rebalance_kv_factor: f64,
    /// P/D: prefill remotely only above this many uncached prompt tokens.
    #[arg(long, default_value_t = 2048)]
    pub pd_threshold: u64,
    /// P/D: a decode rank's KV-transfer link, GB/s.
    #[arg(long, default_value_t = 50.0)]
    pub kv_link_gbps: f64,
    /// P/D under tether-resident: disaggregate by the threshold alone, even
    /// when the prefill leg would compute more than the decode holder.
    #[arg(long)]
    pub pd_by_threshold: bool,
    /// prefix: route to the best match above this match rate.
    #[arg(long, default_value_t = 0.3)]
    pub prefix_threshold: f64,
    /// prefix: imbalance when max − min in-flight exceeds this …
    #[arg(long, default_value_t = 64.0)]
    pub balance_abs: f64,
    /// … and max exceeds this × min.
    #[arg(long, default_value_t = 1.5)]
    pub balance_rel: f64,
    /// Derived users: mean sessions per user (traces without users).
    #[arg(long, default_value_t = 4.0)]
    pub sessions_per_user: f64,
    /// Derived client addresses: users behind one address (NAT).
    #[arg(long, default_value_t = 16)]
    pub users_per_address: u32,
    /// Seed of the user and address derivation.
    #[arg(long, default_value_t = 1)]
    pub identity_seed: u64,
    /// Replay the trace this many times faster (arrivals divided by it).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Prefetch in tool gaps on every rank (retention-host runs; docs/engine.md "Prefetch").
    #[arg(long)]
    pub prefetch: bool,
}

impl FleetArgs {
    /// The simulation settings these flags describe, for `profile` and `fleet`.
    pub fn config(&self, profile: &Profile, fleet: FleetShape) -> Result<SimConfig> {
        let a = self;
        let device_kv = a.kv_tokens.unwrap_or(profile.max_kv_tokens);
        let host_bytes = match a.host_gib {
            Some(g) if g > 0.0 && g.is_finite() => (g * (1u64 << 30) as f64) as u64,
            Some(g) => bail!("--host-gib: {g} must be positive"),
            None => 4 * device_kv * profile.kv_bytes_per_token,
        };
        if a.sessions_per_user.is_nan() || a.sessions_per_user < 1.0 {
            bail!("--sessions-per-user: must be at least 1");
        }
        Ok(SimConfig {
            fleet,
            engine: EngineSettings {
                block_size: a.block_size,
                device_kv_tokens: a.kv_tokens,
                max_num_seqs: a.max_num_seqs,
                max_num_batched_tokens: a.max_num_batched_tokens,
                prefetch: a.prefetch,
                ..EngineSettings::default()
            },
            host_bytes,
            pd: PdOptions {
                threshold_tokens: a.pd_threshold,
                kv_link_gbps: a.kv_link_gbps,
                by_cost: !a.pd_by_threshold,
            },
            balance_factor: a.balance_factor,
            balance_floor: a.balance_floor,
            fallbacks: a.fallbacks,
            load_poll_ms: a.load_poll_ms,
            candidates: a.candidates,
            resident_bound: tether_placement::LoadBound {
                factor: a.resident_factor,
                floor: a.resident_floor,
            },
            resident_unseen: tether_placement::Unseen::default(),
            resident_over_bound: a.resident_over_bound,
            resident_busy_weight: a.resident_busy_weight,
            rebalance: a.rebalance.then_some(tether_placement::Rebalance {
                kv_factor: a.rebalance_kv_factor,
            }),
            transfer_setup_ms: a.transfer_setup_ms,
            migrate: a.migrate,
            prefix: PrefixOptions {
                cache_threshold: a.prefix_threshold,
                balance_abs: a.balance_abs,
                balance_rel: a.balance_rel,
            },
            identity: IdentityModel {
                sessions_per_user: a.sessions_per_user,
                users_per_address: a.users_per_address,
                seed: a.identity_seed,
            },
            speedup: a.speedup,
            ..SimConfig::default()
        })
    }
}

fn parse_pd(s: &str) -> Result<(usize, usize)> {
    let (p, d) = s
        .split_once(',')
        .with_context(|| format!("`{s}`: expected P,D (prefill and decode ranks)"))?;
    let n = |x: &str| {
        x.trim()
            .parse::<usize>()
            .ok()
            .filter(|v| *v > 0)
            .with_context(|| format!("`{x}` is not a positive rank count"))
    };
    Ok((n(p)?, n(d)?))
}

/// Reads a profile, tether JSON or Dynamo NPZ by its extension.
pub fn load_profile(path: &Path) -> Result<Profile> {
    crate::profile::load(path).with_context(|| format!("profile {}", path.display()))
}

/// Parses a comma list with `parse`, `all` meaning `all`.
fn list<T: Copy>(
    s: &str,
    all: &[T],
    parse: impl Fn(&str) -> Result<T, UnknownName>,
) -> Result<Vec<T>> {
    if s.trim() == "all" {
        return Ok(all.to_vec());
    }
    let mut v = Vec::new();
    for x in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        v.push(parse(x)?);
    }
    if v.is_empty() {
        bail!("an empty list");
    }
    Ok(v)
}

/// The configurations a command line asks for: every policy × cache mode
/// (the oracle once: its cache is infinite), in report order.
pub fn grid(policies: &[Policy], caches: &[CacheMode], base: &SimConfig) -> Vec<SimConfig> {
    let mut out = Vec::new();
    for &policy in policies {
        if policy == Policy::Oracle {
            if !base.fleet.is_disaggregated() {
                out.push(SimConfig {
                    policy,
                    cache: CacheMode::Lru,
                    ..base.clone()
                });
            }
            continue;
        }
        for &cache in caches {
            out.push(SimConfig {
                policy,
                cache,
                ..base.clone()
            });
        }
    }
    out
}

/// Runs `configs` on up to `threads` threads, with a progress bar each;
/// `records` keeps every run's observations (for `--out`).
pub fn run_all(
    trace: &Trace,
    profile: &Profile,
    configs: &[SimConfig],
    oracle: &[u32],
    threads: usize,
    quiet: bool,
    records: bool,
) -> Result<Vec<RunOutput>> {
    let multi = MultiProgress::new();
    if quiet {
        multi.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let style = ProgressStyle::with_template(
        "{prefix:>32} [{bar:30}] {pos}/{len} requests {per_sec} eta {eta} ({elapsed})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RunOutput>>>> =
        Mutex::new(configs.iter().map(|_| None).collect());
    let n = trace.requests().len() as u64;
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(configs.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(cfg) = configs.get(i) else { break };
                    let bar = multi.add(ProgressBar::new(n));
                    bar.set_style(style.clone());
                    bar.set_prefix(format!("{} / {}", cfg.policy.name(), cfg.cache.name()));
                    let tick = |done: u64| bar.set_position(done);
                    let r = simulate(trace, profile, cfg, oracle, records, Some(&tick))
                        .map_err(anyhow::Error::from);
                    // Each run's last line stays, with its wall time.
                    bar.finish();
                    if let Ok(mut v) = results.lock() {
                        v[i] = Some(r);
                    }
                }
            });
        }
    });
    let v = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a run panicked"))?;
    v.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a run did not finish"))))
        .collect()
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let started = std::time::Instant::now();
    let trace = a.input.read()?;
    let profile = load_profile(&a.fleet.profile)?;
    let policies = list(&a.policy, &Policy::ALL, Policy::parse).context("--policy")?;
    let caches = list(&a.cache, &CacheMode::ALL, CacheMode::parse).context("--cache")?;
    let fleet = match a.pd {
        Some((p, d)) => FleetShape::disaggregated(p, d),
        None if a.ranks == 0 => bail!("--ranks: must be at least 1"),
        None => FleetShape::aggregated(a.ranks),
    };
    if fleet.prefill + fleet.decode > 4096 {
        bail!("--ranks/--pd: at most 4096 ranks");
    }
    let base = a.fleet.config(&profile, fleet)?;
    let identity = base.identity.clone();
    let device_kv = a.fleet.kv_tokens.unwrap_or(profile.max_kv_tokens);
    let host_bytes = base.host_bytes;
    let configs = grid(&policies, &caches, &base);
    if configs.is_empty() {
        bail!("nothing to run: the oracle alone needs an aggregated fleet");
    }
    let block = if a.fleet.block_size == 0 {
        trace.block_size() as usize
    } else {
        a.fleet.block_size
    };
    // What a fleet of this model could save: requests over its window are
    // refused by every run alike.
    let window = tether_rank_engine::engine::ContextLimit(profile.max_model_len);
    let oracle = oracle_hits_within(&trace, block, window);
    let ids = Identities::derive(&trace, &identity);
    let hash = content_hash(&trace);
    println!(
        "trace    {} ({hash}): {} requests, {} sessions, {} agents",
        a.input.path().display(),
        trace.requests().len(),
        trace.sessions().len(),
        trace.agents().len()
    );
    println!(
        "identity {} users ({} from the trace, the rest {} sessions each on average), {} client addresses ({} users each)",
        ids.users,
        ids.users_from_trace,
        identity.sessions_per_user,
        ids.addresses,
        identity.users_per_address
    );
    println!(
        "fleet    {} of {} ({} GPU each, ${}/GPU-hour); device KV {device_kv} tokens/rank, host tier {:.1} GiB/rank with retention-host, blocks of {block} tokens",
        describe(&base.fleet),
        profile.name,
        profile.gpus_per_engine,
        profile.gpu_hour_usd,
        host_bytes as f64 / (1u64 << 30) as f64
    );
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let outputs = run_all(
        &trace,
        &profile,
        &configs,
        &oracle,
        threads,
        a.quiet,
        a.out.is_some(),
    )?;
    if let Some(dir) = &a.out {
        let file = std::fs::read(&a.fleet.profile)
            .with_context(|| format!("--profile {}", a.fleet.profile.display()))?;
        let source = a.input.source();
        let profile_src = ProfileSource::new(&profile, &file);
        for (cfg, out) in configs.iter().zip(&outputs) {
            let label = a
                .label
                .clone()
                .unwrap_or_else(|| format!("simulate {}", out.report.label()));
            let report = assemble::report(
                &trace,
                &source,
                &profile_src,
                cfg,
                out,
                &label,
                started_unix_ms,
            );
            let at = if configs.len() == 1 {
                dir.clone()
            } else {
                dir.join(format!("{}.{}", cfg.policy.name(), cfg.cache.name()))
            };
            let md = write_report(&report, &out.records, &at)?;
            println!("report: {}", md.display());
        }
    }
    let runs: Vec<RunReport> = outputs.into_iter().map(|o| o.report).collect();
    print!("{}", table(&runs));
    let rss = peak_rss_bytes();
    let wall = started.elapsed().as_secs_f64();
    println!(
        "columns: returning-turn hit ratio; share of the oracle's saved prefill; busiest rank's busy time / mean; TTFT and per-token ITL (ms); interactivity (1000 / median TPOT ms); total tokens per GPU-second; $ per million total tokens; requests refused or failed"
    );
    println!(
        "{} runs in {wall:.1} s; peak memory {}",
        runs.len(),
        rss.map_or("unknown".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1u64 << 20) as f64
        ))
    );
    if let Some(p) = &a.svg {
        let pts: Vec<Point> = runs
            .iter()
            .map(|r| Point {
                label: r.label(),
                x: r.sim.interactivity_tok_s,
                y: r.sim.tokens_per_gpu_s,
            })
            .collect();
        let title = format!(
            "{} on {} ({})",
            trace_name(&trace, a.input.path()),
            describe(&base.fleet),
            profile.name
        );
        std::fs::write(p, plot::svg(&title, &pts))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "trace": {"path": a.input.path().display().to_string(), "content_hash": hash,
                      "requests": trace.requests().len(), "sessions": trace.sessions().len()},
            "profile": profile.name,
            "fleet": base.fleet,
            "device_kv_tokens": device_kv,
            "host_bytes": host_bytes,
            "block_size": block,
            "identity": {"model": identity, "users": ids.users, "users_from_trace": ids.users_from_trace,
                         "addresses": ids.addresses},
            "runs": runs,
            "peak_rss_bytes": rss,
            "wall_s": wall,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn trace_name(trace: &Trace, path: &Path) -> String {
    trace.header().name.clone().unwrap_or_else(|| {
        path.file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned())
    })
}

fn parse_migrate(s: &str) -> Result<Migrate, String> {
    Migrate::parse(s).map_err(|e| e.to_string())
}

/// `--resident-over-bound` / `tether replay --over-bound`: an [`OverBound`](tether_placement::OverBound) by name.
pub(crate) fn parse_over_bound(s: &str) -> Result<tether_placement::OverBound, String> {
    tether_placement::OverBound::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = tether_placement::OverBound::NAMES
            .iter()
            .map(|(n, _)| *n)
            .collect();
        format!("unknown setting {s:?}: one of {}", names.join(", "))
    })
}
