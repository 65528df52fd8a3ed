//! Residency-aware placement benchmark (issue: the session's state follows
//! it): `tether-resident` against the oracle and tether's other policies, on
//! the bundled traces, the Mooncake synthetic trace, a real Mooncake trace
//! (`--real`) and a generated coding-agent corpus, at 8 and 64 ranks; then
//! P/D with session-affine prefill against P/D with prefill by load alone and
//! against a coupled fleet of the same GPUs (BENCHMARKS.md, "Residency-aware
//! placement").
//!
//! Targets, per trace and fleet size: `tether-resident` keeps ≥ 95 % of the
//! oracle's saved prefill at busiest/mean busy time ≤ 1.25 and TTFT p90 ≤ 2×
//! the oracle's.
//!
//! Load: the recorded traces are replayed `--speedup`× faster at 8 ranks and
//! `ranks / 8` times faster again on larger fleets (the same sessions, denser);
//! the generated corpus (`--preset coding-agent`, on the long-context
//! Qwen3-Coder-Next profile, real time) grows with the fleet instead
//! (`--corpus-sessions` per 8 ranks over one hour), so each rank sees the
//! same load.
//!
//! Run: `cargo run --release -p tether-bench --bin resident-bench -- --real conversation_trace.jsonl`

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_bench::{median, root};
use tether_e2e::stack::{rank_args, replay_blocking};
use tether_e2e::{Stack, StackSpec};
use tether_envoy::Mode;
use tether_fleet::cli::replay::write_report;
use tether_fleet::generate::Preset;
use tether_fleet::generate::{GenerateOptions, generate};
use tether_fleet::import::{Format, ImportOptions, import};
use tether_fleet::replay::assemble::Source;
use tether_fleet::replay::{Options, Route, Schedule};
use tether_fleet::sim::{
    CacheMode, FleetShape, Migrate, Policy, RunReport, SimConfig, oracle_hits_within, simulate,
};
use tether_fleet::synth::{Identity, SynthOptions};
use tether_fleet::trace::Trace;
use tether_placement::OverBound;
use tether_rank_engine::engine::{ContextLimit, EngineSettings};
use tether_rank_engine::profile::Profile;

#[derive(Parser, Debug)]
#[command(about = "tether-resident against the oracle, with verdicts")]
struct Args {
    /// A real Mooncake conversation trace (FAST'25 `conversation_trace.jsonl`).
    #[arg(long)]
    real: Option<PathBuf>,
    /// Fleet sizes (aggregated ranks), comma-separated.
    #[arg(long, default_value = "8,64", value_delimiter = ',')]
    ranks: Vec<usize>,
    /// Speedup of the recorded traces at 8 ranks.
    #[arg(long, default_value_t = 5.0)]
    speedup: f64,
    /// Generated corpus: sessions per 8 ranks (over one hour).
    #[arg(long, default_value_t = 200)]
    corpus_sessions: u32,
    /// Seeded fleets: how many (59-session coding-agent fleets on 8 ranks,
    /// seeds 1 to this).
    #[arg(long, default_value_t = 24)]
    fleet_seeds: u64,
    /// Seeded fleets: speedups of their arrivals, comma-separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    fleet_speedups: Vec<f64>,
    /// Skip parts: `bundled`, `corpus`, `fleets`, `pd`, `envoy` (comma-separated).
    #[arg(long, default_value = "")]
    skip: String,
    /// Through Envoy: ranks behind the gateway, comma-separated.
    #[arg(long, default_value = "8", value_delimiter = ',')]
    envoy_ranks: Vec<usize>,
    /// Through Envoy: the bundled traces replayed (`examples/traces/<name>.jsonl`;
    /// `none`: only the corpus).
    #[arg(
        long,
        default_value = "agent-subagents,agent-tenants",
        value_delimiter = ','
    )]
    envoy_traces: Vec<String>,
    /// Through Envoy: speedup of the replays (trace time per wall time).
    #[arg(long, default_value_t = 20.0)]
    envoy_speedup: f64,
    /// Through Envoy: sessions of the coding-agent corpus per 8 ranks (starting
    /// over 10 minutes; 0: none — its 100 K-token prompts are ~0.6 MB bodies
    /// each). Busiest/mean simulated on 8 ranks, the oracle / the default
    /// placement: 12 sessions 1.31 / 1.43, 24 1.19 / 1.36, 36 1.09 / 1.22 —
    /// 36 is the fewest at which the simulated default meets the 1.25 target,
    /// so a miss through Envoy is the gateway's, not the trace's (2026-12-07,
    /// seed 19). The replay lasts the trace's span over the
    /// speedup: 12 sessions span 59 min (178 s at 20×), 24 and 36 span 2.3 h
    /// (415 s at 20×: one session runs 2.2 h), per setting and run.
    #[arg(long, default_value_t = 36)]
    envoy_corpus_sessions: u32,
    /// Through Envoy: speedup of the corpus' replays (default: `--envoy-speedup`).
    /// Its sessions run for up to 2 h of trace time, so at 20× one replay
    /// lasts up to 400 s of wall time.
    #[arg(long)]
    envoy_corpus_speedup: Option<f64>,
    /// Through Envoy: the settings compared, in this order (`load`: pick +
    /// load; `leg`, `pull`: pick + load + residency with that migration path).
    #[arg(
        long,
        value_enum,
        default_value = "load,leg,pull",
        value_delimiter = ','
    )]
    envoy_settings: Vec<Setting>,
    /// Through Envoy: what the ranks' residency summaries list
    /// (`tether-rank --residency-from`); every residency setting runs with each.
    #[arg(long, value_enum, default_value = "admission", value_delimiter = ',')]
    envoy_residency_from: Vec<ResidencyFrom>,
    /// Through Envoy: the filter's `residency.unseen` (rule 2, a key no fresh
    /// summary shows); every residency setting runs with each.
    #[arg(
        long,
        value_enum,
        default_value = "least-loaded",
        value_delimiter = ','
    )]
    envoy_unseen: Vec<Unseen>,
    /// Through Envoy: the filter's load poll period in ms of wall time
    /// (default: 200 ms of trace time, as the simulator's, at least 10 ms).
    /// A longer period than the trace's tool gaps shows what a stale view does.
    #[arg(long)]
    envoy_poll_ms: Option<u64>,
    /// Through Envoy: name sessions in the body (`metadata.session_id`, the
    /// body path: Envoy buffers the body and the filter reads the turn
    /// markers, so `tether_residency_unseen` can count) instead of Claude
    /// Code's headers (the header path: no turn markers, the counter stays 0).
    #[arg(long)]
    envoy_body_path: bool,
    /// Through Envoy: runs of every setting (each setting in turn per run);
    /// the verdicts are on the medians.
    #[arg(long, default_value_t = 1)]
    envoy_runs: usize,
    /// Reports of the Envoy replays go here.
    #[arg(long, default_value = "target/resident-bench")]
    out: PathBuf,
}

/// A gateway setting compared through Envoy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Setting {
    /// Pick + load, no residency.
    Load,
    /// Residency, migrations by a prefill leg on the old home.
    Leg,
    /// Residency, migrations pulled by the new rank (the default).
    Pull,
    /// `pull` with `over_bound: "keep-up"`: a holder over the bound keeps the
    /// key unless moving starts the turn's prefill sooner.
    PullKeepUp,
    /// `pull` with the rule before 2026-12-07: three candidates, ties in
    /// requests by rendezvous order (`candidates: 3, busy_weight: 0`).
    PullBefore,
    /// `pull` with every rank's backlog read at the filter's old default rate
    /// (`prefill_tokens_per_s: 20000`) instead of the rate each rank reports.
    PullFixedRate,
}

/// `tether-rank --residency-from` (docs/rank.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ResidencyFrom {
    Admission,
    Retention,
}

/// The filter's `residency.unseen` (docs/gateway.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Unseen {
    LeastLoaded,
    Rendezvous,
}

impl ResidencyFrom {
    fn name(self) -> &'static str {
        match self {
            ResidencyFrom::Admission => "admission",
            ResidencyFrom::Retention => "retention",
        }
    }
}

impl Unseen {
    fn name(self) -> &'static str {
        match self {
            Unseen::LeastLoaded => "least-loaded",
            Unseen::Rendezvous => "rendezvous",
        }
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

/// The generated coding-agent corpus for `ranks` ranks (`tether trace
/// generate --preset coding-agent`, docs/trace-format.md): `per_8` sessions
/// per 8 ranks starting over one hour, so every fleet size sees the same
/// load per rank; the command that makes the same trace is printed with it.
fn corpus(per_8: u32, ranks: usize) -> (String, GenerateOptions) {
    let sessions = ((f64::from(per_8) * ranks as f64 / 8.0).round() as u32).max(1);
    let o = GenerateOptions {
        seed: 19,
        sessions,
        session_span_ms: Some(3_600_000.0),
        ..Preset::CodingAgent.options()
    };
    let cmd = format!(
        "tether trace generate --preset coding-agent --seed 19 --sessions {sessions} --span-s 3600"
    );
    (cmd, o)
}

struct Row {
    report: RunReport,
}

/// The seeded fleets (`tether_bench::fleets`): every setting on every fleet
/// and speedup, one summary line per setting and speedup, then over all.
fn fleets(a: &Args, coder: &Profile) -> Result<()> {
    use tether_bench::fleets::{Judged, fleet, judge, settings, summary};
    let settings = settings();
    println!(
        "seeded fleets: tether trace generate --preset coding-agent --seed 1..={} --sessions 59 --span-s 3600, 8 ranks, speedups {:?}",
        a.fleet_seeds, a.fleet_speedups
    );
    let mut all: Vec<Vec<Judged>> = vec![Vec::new(); settings.len()];
    for &speedup in &a.fleet_speedups {
        let mut at: Vec<Vec<Judged>> = vec![Vec::new(); settings.len()];
        for seed in 1..=a.fleet_seeds {
            let trace = fleet(seed)?;
            let b = base(coder, FleetShape::aggregated(8), speedup);
            for (k, j) in judge(&trace, coder, &b, &settings)?.into_iter().enumerate() {
                at[k].push(j);
            }
        }
        println!("{} fleets at {speedup}x:", a.fleet_seeds);
        for (s, runs) in settings.iter().zip(&at) {
            println!("{}", summary(s.name, runs));
        }
        for (k, runs) in at.into_iter().enumerate() {
            all[k].extend(runs);
        }
    }
    println!("all seeded fleets:");
    for (s, runs) in settings.iter().zip(&all) {
        println!("{}", summary(s.name, runs));
    }
    Ok(())
}

fn base(profile: &Profile, fleet: FleetShape, speedup: f64) -> SimConfig {
    SimConfig {
        cache: CacheMode::RetentionHost,
        fleet,
        engine: EngineSettings {
            block_size: 0,
            ..EngineSettings::default()
        },
        host_bytes: 4 * profile.max_kv_tokens * profile.kv_bytes_per_token,
        speedup,
        load_poll_ms: 200.0,
        ..SimConfig::default()
    }
}

fn run(trace: &Trace, profile: &Profile, cfg: &SimConfig) -> Result<Row> {
    let window = ContextLimit(profile.max_model_len);
    let oracle = oracle_hits_within(trace, trace.block_size() as usize, window);
    Ok(Row {
        report: simulate(trace, profile, cfg, &oracle, false, None)?.report,
    })
}

/// A `tether-resident` setting's name: its migration path, and `keep-up`
/// when a holder over the bound keeps up (`residency.over_bound`).
fn setting(migrate: Migrate, over: OverBound) -> String {
    setting_name(migrate.name(), over)
}

fn setting_name(migrate: &str, over: OverBound) -> String {
    match over {
        OverBound::Move => migrate.to_owned(),
        OverBound::KeepUp => format!("{migrate}, keep-up"),
    }
}

fn line(r: &RunReport, migrate: Migrate, over: OverBound) {
    let res = r
        .sim
        .resident
        .map(|c| {
            format!(
                " [stay {} least {} migrate {} recompute {}]",
                c.stay, c.least, c.migrate, c.recompute
            )
        })
        .unwrap_or_default();
    println!(
        "  {:<22} {:>6.1} % of the oracle's saved prefill, busiest/mean {:.2}, TTFT p50 {:>7.0} p90 {:>7.0} p99 {:>8.0} ms, $/Mtok {:.4}{res}",
        if r.sim.policy == Policy::TetherResident {
            format!("{} ({})", r.sim.policy.name(), setting(migrate, over))
        } else {
            r.sim.policy.name().to_owned()
        },
        r.sim.oracle_share * 100.0,
        r.sim.balance.busy_max_over_mean,
        r.ttft_ms.p50,
        r.ttft_ms.p90,
        r.ttft_ms.p99,
        r.sim.usd_per_mtok,
    );
}

/// One trace on one fleet size: every policy side by side, the verdict.
fn compare(
    name: &str,
    trace: &Trace,
    profile: &Profile,
    ranks: usize,
    speedup: f64,
) -> Result<[bool; 3]> {
    println!(
        "{name} on {ranks} ranks ({} requests, {} sessions, {speedup}x):",
        trace.requests().len(),
        trace.sessions().len()
    );
    let b = base(profile, FleetShape::aggregated(ranks), speedup);
    let mut rows = Vec::new();
    // The migration model and the over-bound rule matter to tether-resident
    // only; the others run the defaults.
    let (mv, keep) = (OverBound::Move, OverBound::KeepUp);
    for (policy, migrate, over) in [
        (Policy::Oracle, Migrate::default(), mv),
        (Policy::Tether, Migrate::default(), mv),
        (Policy::TetherLoad, Migrate::default(), mv),
        (Policy::TetherResident, Migrate::Leg, mv),
        (Policy::TetherResident, Migrate::Pull, mv),
        (Policy::TetherResident, Migrate::Pull, keep),
    ] {
        let cfg = SimConfig {
            policy,
            migrate,
            resident_over_bound: over,
            ..b.clone()
        };
        let r = run(trace, profile, &cfg)?;
        line(&r.report, migrate, over);
        rows.push(r);
    }
    let oracle = &rows[0].report;
    let ideal = tether_fleet::trace::stats::ideal_hits(trace);
    let mut met = [false; 3];
    for (k, (res, migrate, over)) in [
        (&rows[3].report, Migrate::Leg, mv),
        (&rows[4].report, Migrate::Pull, mv),
        (&rows[5].report, Migrate::Pull, keep),
    ]
    .into_iter()
    .enumerate()
    {
        let share = res.sim.oracle_share;
        let bal = res.sim.balance.busy_max_over_mean;
        let p90 = res.ttft_ms.p90 / oracle.ttft_ms.p90.max(f64::MIN_POSITIVE);
        let ok = share >= 0.95 && bal <= 1.25 && p90 <= 2.0;
        met[k] = ok;
        println!(
            "verdict [{name}, {ranks} ranks, migrate {}]: tether-resident >= 95 % of the oracle's saved prefill ({:.1} %), busiest/mean <= 1.25 ({bal:.2}), TTFT p90 <= 2x the oracle's ({p90:.2}x): {} (the oracle's own busiest/mean {:.2}; perfect session affinity reaches {:.0} % of the oracle's hits on this trace)",
            setting(migrate, over),
            share * 100.0,
            verdict(ok),
            oracle.sim.balance.busy_max_over_mean,
            100.0 * ideal.session / ideal.global.max(1e-12)
        );
    }
    Ok(met)
}

/// P/D on the session's cache: `gpus` GPUs split P + D every way from 2 +
/// (gpus − 2) to half and half, each with prefill placed by load alone
/// (`tether-load`) and session-affine (`tether-resident`, pulled
/// migrations), against a coupled fleet of the same GPUs; the cheapest
/// P/D split that keeps TTFT p90 within 2× the coupled fleet's is the one
/// compared on $/Mtok, and the cost terms are printed beside it.
fn pd(trace: &Trace, profile: &Profile, gpus: usize, speedup: f64) -> Result<()> {
    let row = |label: &str, r: &RunReport| {
        let computed = r.computed_tokens as f64 / r.prompt_tokens.max(1) as f64;
        println!(
            "  {label:<28} prompt tokens computed {:>5.1} %, TTFT p50 {:>8.0} p90 {:>9.0} ms, ITL p50 {:.2} ms, GPU-s {:.0}, $/Mtok {:.4}",
            computed * 100.0,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.sim.itl_ms.p50,
            r.sim.gpu_seconds,
            r.sim.usd_per_mtok
        );
    };
    let sim = |fleet: FleetShape, policy: Policy| -> Result<RunReport> {
        let cfg = SimConfig {
            policy,
            migrate: Migrate::Pull,
            ..base(profile, fleet, speedup)
        };
        Ok(run(trace, profile, &cfg)?.report)
    };
    println!("P/D against {gpus} coupled ranks:");
    let coupled = sim(FleetShape::aggregated(gpus), Policy::TetherResident)?;
    row("coupled, tether-resident", &coupled);
    let mut best: Option<(usize, RunReport)> = None;
    for p in 2..=gpus / 2 {
        let d = gpus - p;
        let by_load = sim(FleetShape::disaggregated(p, d), Policy::TetherLoad)?;
        row(&format!("{p} + {d}, prefill by load"), &by_load);
        let affine = sim(FleetShape::disaggregated(p, d), Policy::TetherResident)?;
        row(&format!("{p} + {d}, session-affine"), &affine);
        let saved = 1.0 - affine.computed_tokens as f64 / (by_load.computed_tokens as f64).max(1.0);
        println!(
            "    session-affine prefill computes {:.1} % fewer prompt tokens than prefill by load",
            saved * 100.0
        );
        let within = affine.ttft_ms.p90 <= 2.0 * coupled.ttft_ms.p90;
        if within
            && best
                .as_ref()
                .is_none_or(|(_, b)| affine.sim.usd_per_mtok < b.sim.usd_per_mtok)
        {
            best = Some((p, affine));
        }
    }
    match best {
        Some((p, b)) => {
            let ok = b.sim.usd_per_mtok <= coupled.sim.usd_per_mtok;
            println!(
                "verdict [P/D vs coupled]: session-affine P/D ({p} + {}) costs <= coupled: {} (${:.4} vs ${:.4} per Mtok; prompt tokens computed {:.1} % vs {:.1} %; P/D pays a remote prefill leg and a KV transfer per remote request: {} of them, {:.0} ms mean)",
                gpus - p,
                verdict(ok),
                b.sim.usd_per_mtok,
                coupled.sim.usd_per_mtok,
                100.0 * b.computed_tokens as f64 / b.prompt_tokens.max(1) as f64,
                100.0 * coupled.computed_tokens as f64 / coupled.prompt_tokens.max(1) as f64,
                b.sim.pd.map_or(0, |x| x.remote_prefills),
                b.sim.pd.map_or(0.0, |x| x.transfer_ms_mean),
            );
        }
        None => println!(
            "verdict [P/D vs coupled]: no P/D split of {gpus} GPUs keeps TTFT p90 within 2x the coupled fleet's ({:.0} ms): coupled wins on this mix; the binding term is the prefill pool's capacity (every turn's new tokens and every cold start go through {}-way prefill)",
            coupled.ttft_ms.p90,
            gpus / 2
        ),
    }
    Ok(())
}

/// One setting through Envoy: its label, the filter's configuration beside
/// `mode` / `endpoints`, and the flags added to every rank's.
struct Run {
    label: String,
    residency: bool,
    plugin: Value,
    rank_extra: Vec<String>,
}

/// The settings compared, in order: every residency setting once per
/// `--envoy-residency-from` × `--envoy-unseen`. Both settings send the turn
/// markers the ranks retain by; the view is polled every `poll_ms`.
fn runs(a: &Args, poll_ms: u64) -> Vec<Run> {
    let mut v = Vec::new();
    for &s in &a.envoy_settings {
        let migrate = match s {
            Setting::Load => {
                v.push(Run {
                    label: "pick + load".into(),
                    residency: false,
                    plugin: json!({"load": {"poll_ms": poll_ms}, "outputs": ["pick", "retain"]}),
                    rank_extra: Vec::new(),
                });
                continue;
            }
            Setting::Leg => ("leg", OverBound::Move),
            Setting::Pull | Setting::PullBefore | Setting::PullFixedRate => {
                ("pull", OverBound::Move)
            }
            Setting::PullKeepUp => ("pull", OverBound::KeepUp),
        };
        let (migrate, over) = migrate;
        let before = s == Setting::PullBefore;
        let fixed_rate = s == Setting::PullFixedRate;
        for &from in &a.envoy_residency_from {
            for &unseen in &a.envoy_unseen {
                let mut label = format!("pick + load + residency, {}", setting_name(migrate, over));
                if before {
                    label += ", d = 3, ties by rendezvous";
                }
                if fixed_rate {
                    label += ", every rank at 20,000 tokens/s";
                }
                if a.envoy_residency_from.len() > 1 || from != ResidencyFrom::Admission {
                    label += &format!(", from {}", from.name());
                }
                if a.envoy_unseen.len() > 1 || unseen != Unseen::LeastLoaded {
                    label += &format!(", unseen {}", unseen.name());
                }
                let mut residency = json!({"migrate": migrate, "unseen": unseen.name(),
                                           "over_bound": over.name()});
                if before {
                    residency["candidates"] = json!(3);
                    residency["busy_weight"] = json!(0.0);
                }
                if fixed_rate {
                    residency["prefill_tokens_per_s"] = json!(20_000);
                }
                v.push(Run {
                    label,
                    residency: true,
                    plugin: json!({"load": {"poll_ms": poll_ms}, "residency": residency,
                                   "outputs": ["pick", "retain"]}),
                    rank_extra: vec!["--residency-from".into(), from.name().into()],
                });
            }
        }
    }
    v
}

/// One run's figures of one setting.
#[derive(Clone, Copy, Debug, Default)]
struct Fig {
    /// Usage's cached tokens, share of the shared cache's hits.
    cached: f64,
    /// Saved prefill (cached, restored or transferred), share of the shared cache's.
    saved: f64,
    /// Busiest / mean busy time.
    bal: f64,
    p50: f64,
    p90: f64,
    /// TTFT p90 over the simulated oracle's.
    p90x: f64,
    /// The filter's `tether_residency_unseen`: returning turns placed on a stale view.
    unseen: f64,
    errors: f64,
    /// Wall time of the replay.
    wall_s: f64,
}

/// One trace through real Envoy + the tether filter (pick mode, header
/// path, polled `/load`) in front of `ranks` `tether-rank --role decode`
/// processes, in every setting of [`runs`] (`--envoy-runs` times, each
/// setting in turn), beside the simulator's oracle on the same ranks and
/// speedup; verdicts on the medians.
#[allow(clippy::too_many_arguments)]
fn envoy(
    a: &Args,
    name: &str,
    trace: &Arc<Trace>,
    source: &Source,
    profile_file: &str,
    profile: &Profile,
    ranks: usize,
    speedup: f64,
) -> Result<()> {
    let kv_tokens = profile.max_kv_tokens;
    let host_gib = 4.0 * (kv_tokens * profile.kv_bytes_per_token) as f64 / f64::from(1u32 << 30);
    let mut rank_args = rank_args(speedup, "retention-host", kv_tokens, host_gib);
    if let Some(i) = rank_args.iter().position(|x| x == "--profile") {
        rank_args[i + 1] = root()
            .join("examples/profiles")
            .join(profile_file)
            .display()
            .to_string();
    }
    rank_args.extend(["--role".to_owned(), "decode".to_owned()]);
    // The ranks run `speedup`× simulated time per wall time, so the
    // replay's arrivals reach them on the trace's own timeline: the
    // simulations that match run at 1×. The simulated default beside the
    // oracle tells a miss of the trace itself (the oracle's own balance) from
    // one of the gateway.
    let simulated = |policy| -> Result<RunReport> {
        let cfg = SimConfig {
            policy,
            host_bytes: (host_gib * f64::from(1u32 << 30)) as u64,
            ..base(profile, FleetShape::aggregated(ranks), 1.0)
        };
        Ok(run(trace, profile, &cfg)?.report)
    };
    let oracle = simulated(Policy::Oracle)?;
    let resident = simulated(Policy::TetherResident)?;
    println!(
        "{name} through Envoy, {ranks} ranks ({} requests, {speedup}x); simulated on the same ranks: the oracle TTFT p90 {:.0} ms, busiest/mean {:.2}; tether-resident (defaults) {:.1} % of its saved prefill, busiest/mean {:.2}, TTFT p90 {:.0} ms",
        trace.requests().len(),
        oracle.ttft_ms.p90,
        oracle.sim.balance.busy_max_over_mean,
        resident.sim.oracle_share * 100.0,
        resident.sim.balance.busy_max_over_mean,
        resident.ttft_ms.p90
    );
    // The view is polled every 200 ms of trace time (as the simulator's): at
    // a replay speedup of S that is 200 / S ms of wall time (at least the
    // filter's 10).
    let poll_ms = a
        .envoy_poll_ms
        .unwrap_or(((200.0 / speedup).round() as u64).max(10));
    println!("  the filter's view polled every {poll_ms} ms of wall time");
    let settings = runs(a, poll_ms);
    let mut figs: Vec<Vec<Fig>> = vec![Vec::new(); settings.len()];
    for n in 0..a.envoy_runs.max(1) {
        for (k, s) in settings.iter().enumerate() {
            let mut ra = rank_args.clone();
            ra.extend(s.rank_extra.iter().cloned());
            let f = envoy_once(a, name, trace, source, &oracle, ranks, speedup, s, ra, n)?;
            figs[k].push(f);
        }
    }
    if a.envoy_runs > 1 {
        println!("  medians of {} runs:", a.envoy_runs);
    }
    for (s, f) in settings.iter().zip(&figs) {
        let m = |g: fn(&Fig) -> f64| median(f.iter().map(g).collect());
        let (saved, bal, p90x) = (m(|f| f.saved), m(|f| f.bal), m(|f| f.p90x));
        println!(
            "  {:<58} cached {:>5.1} %, saved prefill {:>5.1} %, busiest/mean {bal:.2}, TTFT p50 {:.0} p90 {:.0} ms ({p90x:.2}x the oracle's), unseen {}, errors {}, wall {:.0} s",
            s.label,
            m(|f| f.cached) * 100.0,
            saved * 100.0,
            m(|f| f.p50),
            m(|f| f.p90),
            m(|f| f.unseen),
            m(|f| f.errors),
            m(|f| f.wall_s),
        );
        if s.residency {
            let ok = saved >= 0.95 && bal <= 1.25 && p90x <= 2.0;
            println!(
                "verdict [{name} through Envoy, {ranks} ranks, {}]: saved prefill >= 95 % of the shared cache's ({:.1} %), busiest/mean <= 1.25 ({bal:.2}), TTFT p90 <= 2x the oracle's ({p90x:.2}x): {}",
                s.label,
                saved * 100.0,
                verdict(ok)
            );
        }
    }
    Ok(())
}

/// One replay of one setting on a fresh stack; prints its line.
#[allow(clippy::too_many_arguments)]
fn envoy_once(
    a: &Args,
    name: &str,
    trace: &Arc<Trace>,
    source: &Source,
    oracle: &RunReport,
    ranks: usize,
    speedup: f64,
    s: &Run,
    rank_args: Vec<String>,
    n: usize,
) -> Result<Fig> {
    let label = &s.label;
    let mut spec = StackSpec::new(ranks, Mode::Pick, &[]);
    spec.rank_args = rank_args;
    spec.concurrency = 2;
    if let Value::Object(m) = s.plugin.clone() {
        spec.plugin_config = m;
    }
    let stack =
        Stack::start(&spec).with_context(|| format!("{name} / {label}: starting the stack"))?;
    let opts = stack.options(Options {
        targets: Vec::new(),
        route: Route::Session,
        schedule: Schedule::Fixed,
        max_inflight: 512,
        speedup: Some(speedup),
        max_gap_ms: 10_000,
        synth: SynthOptions {
            identity: if a.envoy_body_path {
                Identity::Metadata
            } else {
                Identity::ClaudeCode
            },
            ..Default::default()
        },
        timeout: Duration::from_secs(600),
        sessions: None,
        ranks: Vec::new(),
        gateway_admin: None,
        progress: false,
    });
    let started = Instant::now();
    let (r, out) = replay_blocking(trace, source, &opts, label)?;
    let wall_s = started.elapsed().as_secs_f64();
    // Saved prefill, as the simulator counts it: every prompt token not
    // computed — cached, restored, or transferred from an old home (a pull
    // or a leg), which usage's cached tokens leave out.
    let computed: f64 = stack
        .ranks
        .iter()
        .filter_map(|k| k.metrics().ok())
        .flat_map(|m| m.samples)
        .filter(|s| {
            s.name == "vllm:prompt_tokens_by_source_total"
                && s.labels.get("source").map(String::as_str) == Some("local_compute")
        })
        .map(|s| s.value)
        .sum();
    let prompt: u64 = out
        .observations
        .iter()
        .filter_map(|o| o.served())
        .map(|s| s.prompt_tokens)
        .sum();
    let saved = 1.0 - computed / (prompt as f64).max(1.0);
    let unseen = if s.residency {
        println!("    {}", moves(&stack));
        stats_sum(&stack, "tether_residency_unseen")
    } else {
        0.0
    };
    drop(stack);
    let dir = a
        .out
        .join(format!("{name}-{ranks}"))
        .join(format!("{}-{n}", label.replace([' ', '+', ','], "")));
    write_report(&r, &out.observations, &dir)?;
    let busy: Vec<f64> = r.load.engines.iter().filter_map(|e| e.busy_s).collect();
    let mean = busy.iter().sum::<f64>() / busy.len().max(1) as f64;
    let max = busy.iter().copied().fold(0.0, f64::max);
    let f = Fig {
        cached: r.hit_ratio.of_shared_cache,
        saved: saved / r.hit_ratio.ideal_global.max(f64::MIN_POSITIVE),
        bal: if mean > 0.0 { max / mean } else { f64::NAN },
        p50: r.latency.ttft_ms.p50,
        p90: r.latency.ttft_ms.p90,
        p90x: r.latency.ttft_ms.p90 / oracle.ttft_ms.p90.max(f64::MIN_POSITIVE),
        unseen,
        errors: r.requests.errors as f64,
        wall_s,
    };
    println!(
        "  [run {}] {label:<58} {:>5.1} % of the shared cache's hits (saved prefill, cached or transferred: {:>5.1} %), busiest/mean busy {:.2}, TTFT p50 {:.0} p90 {:.0} ms ({:.2}x the oracle's), unseen {}, errors {}, wall {wall_s:.0} s",
        n + 1,
        f.cached * 100.0,
        f.saved * 100.0,
        f.bal,
        f.p50,
        f.p90,
        f.p90x,
        f.unseen,
        f.errors
    );
    Ok(f)
}

/// The sum of Envoy's stats whose name contains `needle`, read from the admin
/// interface's `/stats?filter=` (the filter's counters, `wasmcustom.<name>`);
/// NaN where Envoy does not answer.
fn stats_sum(stack: &Stack, needle: &str) -> f64 {
    let Ok((200, body)) = stack.envoy.admin(&format!("/stats?filter={needle}")) else {
        return f64::NAN;
    };
    String::from_utf8_lossy(&body)
        .lines()
        .filter_map(|l| l.rsplit_once(": "))
        .filter(|(k, _)| k.contains(needle))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

/// What the gateway decided and what the ranks did with the moves: the
/// filter's residency counters (Envoy) and the ranks' pull and leg outcomes.
fn moves(stack: &Stack) -> String {
    let envoy = stack.envoy.prometheus().unwrap_or_default();
    let decisions: Vec<String> = ["stay", "least", "migrate", "recompute", "bounded", "unseen"]
        .iter()
        .map(|d| format!("{d} {}", envoy.sum(&format!("tether_residency_{d}"))))
        .collect();
    let ranks: Vec<_> = stack
        .ranks
        .iter()
        .filter_map(|r| r.metrics().ok())
        .collect();
    let sum = |name: &str, label: (&str, &str)| -> f64 {
        ranks.iter().filter_map(|m| m.get(name, &[label])).sum()
    };
    let pulls: Vec<String> = [
        "ok",
        "not_held",
        "held_here",
        "failed",
        "timeout",
        "expired",
    ]
    .iter()
    .map(|o| format!("{o} {}", sum("tether_rank_pulls_total", ("outcome", o))))
    .collect();
    let legs: Vec<String> = ["ok", "failed"]
        .iter()
        .map(|o| {
            format!(
                "{o} {}",
                sum("tether_rank_prefill_legs_total", ("outcome", o))
            )
        })
        .collect();
    format!(
        "decisions: {}; pulls: {}; prefill legs: {}",
        decisions.join(", "),
        pulls.join(", "),
        legs.join(", ")
    )
}

fn main() -> Result<()> {
    let a = Args::parse();
    let skip: Vec<&str> = a.skip.split(',').map(str::trim).collect();
    let llama =
        Profile::from_file(&root().join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"))?;
    // The corpus' prompts reach 190 K tokens: a long-context coding model
    // (262 K window) serves them; Llama's 131 K would refuse half.
    let coder =
        Profile::from_file(&root().join("examples/profiles/qwen3-coder-next-fp8-h200-tp1.json"))?;
    println!(
        "profiles {} (recorded traces) and {} (coding-agent corpus), retention + host tier, load polled every 200 ms, d = {}, tether-resident's bound c = 1.5 over running + waiting plus {} x the busy share, floor 1",
        llama.name,
        coder.name,
        tether_placement::DEFAULT_CANDIDATES,
        tether_placement::BUSY_WEIGHT
    );
    // Cases meeting every target, with `leg` and with `pull` migrations.
    let mut met = [0usize; 3];
    let mut all = 0;
    if !skip.contains(&"bundled") {
        let traces = tether_bench::recorded_traces(a.real.as_deref())?;
        for (name, trace) in &traces {
            for &ranks in &a.ranks {
                let speedup = a.speedup * (ranks as f64 / 8.0).max(1.0);
                all += 1;
                let m = compare(name, trace, &llama, ranks, speedup)?;
                for (n, m) in met.iter_mut().zip(m) {
                    *n += usize::from(m);
                }
            }
        }
    }
    if !skip.contains(&"corpus") {
        for &ranks in &a.ranks {
            let (cmd, o) = corpus(a.corpus_sessions, ranks);
            println!("corpus: {cmd}");
            let trace = generate(&o)?;
            all += 1;
            let m = compare("coding-agent corpus", &trace, &coder, ranks, 1.0)?;
            for (n, m) in met.iter_mut().zip(m) {
                *n += usize::from(m);
            }
        }
    }
    if !skip.contains(&"fleets") {
        fleets(&a, &coder)?;
    }
    if !skip.contains(&"pd") {
        let (cmd, o) = corpus(a.corpus_sessions, 8);
        println!("corpus: {cmd}");
        let trace = generate(&o)?;
        pd(&trace, &coder, 8, 1.0)?;
    }
    if !skip.contains(&"envoy") {
        for &ranks in &a.envoy_ranks {
            for t in a.envoy_traces.iter().filter(|t| *t != "none") {
                let p = root().join(format!("examples/traces/{t}.jsonl"));
                let trace = Arc::new(import(Format::Tether, &p, &ImportOptions::default())?);
                let source = Source {
                    path: p.display().to_string(),
                    format: "tether".into(),
                };
                envoy(
                    &a,
                    t,
                    &trace,
                    &source,
                    "llama-3.1-8b-fp8-h200-tp1.json",
                    &llama,
                    ranks,
                    a.envoy_speedup,
                )?;
            }
            if a.envoy_corpus_sessions == 0 {
                continue;
            }
            let sessions =
                ((f64::from(a.envoy_corpus_sessions) * ranks as f64 / 8.0).round() as u32).max(1);
            let o = GenerateOptions {
                seed: 19,
                sessions,
                session_span_ms: Some(600_000.0),
                ..Preset::CodingAgent.options()
            };
            let cmd = format!(
                "tether trace generate --preset coding-agent --seed 19 --sessions {sessions} --span-s 600"
            );
            println!("corpus: {cmd}");
            let trace = Arc::new(generate(&o)?);
            let source = Source {
                path: cmd,
                format: "tether".into(),
            };
            envoy(
                &a,
                "coding-agent corpus",
                &trace,
                &source,
                "qwen3-coder-next-fp8-h200-tp1.json",
                &coder,
                ranks,
                a.envoy_corpus_speedup.unwrap_or(a.envoy_speedup),
            )?;
        }
    }
    // Only the simulated cases are counted (the Envoy parts print their own verdicts).
    if all > 0 {
        println!(
            "summary: of {all} trace/fleet cases, {} met every target with leg migrations, {} with pull, {} with pull and keep-up",
            met[0], met[1], met[2]
        );
    }
    Ok(())
}
