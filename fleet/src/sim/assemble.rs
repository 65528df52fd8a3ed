//! A simulation's observations → its [`Report`], the same document a replay
//! writes (`docs/report.md`): the simulated ranks stand in for the scraped
//! ones (with the settings a `tether-rank` reports, so `tether compare` lines
//! them up key by key with a replay), `sim.*` keys for the replay's own, and
//! the simulator-only figures ride in [`Report::simulation`].

use super::config::{CacheMode, SimConfig};
use super::run::{RunOutput, describe};
use crate::replay::assemble::Source;
use crate::report::config::{ProfileInfo, RankInfo};
use crate::report::model::RunInfo;
use crate::report::{BuildInput, Report, ServingConfig, build};
use crate::trace::{SessionId, Trace};
use serde_json::json;
use std::collections::BTreeMap;
use tether_rank_engine::profile::Profile;
use xxhash_rust::xxh3::xxh3_64;

/// The profile a run was timed by.
#[derive(Clone, Debug)]
pub struct ProfileSource<'a> {
    /// The profile.
    pub profile: &'a Profile,
    /// xxh3-64 of its file, 16 hex (what `tether-rank` reports as `profile_hash`).
    pub hash: String,
}

impl<'a> ProfileSource<'a> {
    /// `profile`, read from a file with these bytes.
    pub fn new(profile: &'a Profile, file: &[u8]) -> Self {
        Self {
            profile,
            hash: format!("{:016x}", xxh3_64(file)),
        }
    }
}

/// The simulation's settings as configuration keys (`sim.*`).
fn sim_keys(cfg: &SimConfig) -> BTreeMap<String, String> {
    let mut keys = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        keys.insert(format!("sim.{k}"), v);
    };
    put("policy", cfg.policy.name().to_owned());
    put("fleet", describe(&cfg.fleet));
    put("speedup", format!("{}", cfg.speedup));
    put("balance_factor", format!("{}", cfg.balance_factor));
    put("balance_floor", format!("{}", cfg.balance_floor));
    if cfg.fleet.is_disaggregated() {
        put("pd_threshold_tokens", cfg.pd.threshold_tokens.to_string());
    }
    keys
}

/// The ranks of the routed pool as `GET /tether/config` would describe them.
fn ranks(out: &RunOutput, cfg: &SimConfig, profile: &ProfileSource<'_>) -> Vec<RankInfo> {
    let (names, engine) = &out.routed;
    let p = profile.profile;
    let serving = json!({
        "cache": cfg.cache.name(),
        "host_bytes": if cfg.cache == CacheMode::RetentionHost { engine.policy.host_bytes } else { 0 },
        "device_blocks": engine.policy.device_blocks,
        "block_size": engine.policy.block_size,
        "dp_size": 1,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "profile_hash": profile.hash,
        "role": if cfg.fleet.is_disaggregated() { "decode" } else { "both" },
        "kv_link_gbps": cfg.pd.kv_link_gbps,
        "prefetch": engine.prefetch && cfg.cache == CacheMode::RetentionHost,
    });
    let config = json!({
        "serving": serving,
        "serving_hash": format!("{:016x}", xxh3_64(serving.to_string().as_bytes())),
        "profile": {
            "name": p.name,
            "hash": profile.hash,
            "gpu": p.gpu,
            "engine_hour_usd": p.engine_hour_usd(),
        },
    });
    names
        .iter()
        .map(|n| RankInfo {
            rank: n.clone(),
            config: config.clone(),
            serving_hash: config["serving_hash"].as_str().unwrap_or("").to_owned(),
        })
        .collect()
}

/// Builds the report of one simulation run (`out` kept its observations).
pub fn report(
    trace: &Trace,
    source: &Source,
    profile: &ProfileSource<'_>,
    cfg: &SimConfig,
    out: &RunOutput,
    label: &str,
    started_unix_ms: u64,
) -> Report {
    let mut config = ServingConfig::new(None, ranks(out, cfg, profile), sim_keys(cfg));
    if config.profile.is_none() {
        config.profile = Some(ProfileInfo {
            name: profile.profile.name.clone(),
            hash: profile.hash.clone(),
            gpu: profile.profile.gpu.clone(),
            engine_hour_usd: profile.profile.engine_hour_usd(),
        });
    }
    let r = &out.report;
    let run = RunInfo {
        label: label.to_owned(),
        tool: "tether simulate".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        targets: vec![format!("simulated: {}", describe(&cfg.fleet))],
        schedule: "fixed".to_owned(),
        live_sessions: None,
        max_inflight: 0,
        speedup: cfg.speedup,
        max_gap_ms: None,
        sessions_replayed: trace.sessions().len() as u64,
        api: None,
        identity: "simulated".to_owned(),
        stream: false,
        started_unix_ms,
        wall_s: r.wall_s,
        trace_s: r.span_s,
        clock: String::new(),
        lag_ms: Default::default(),
        partial: false,
        partial_reason: None,
    };
    let sessions: Vec<SessionId> = (0..trace.sessions().len() as u32).map(SessionId).collect();
    let mut report = build(BuildInput {
        trace,
        trace_path: source.path.clone(),
        trace_format: source.format.clone(),
        sessions: &sessions,
        observations: &out.records,
        run,
        config,
        busy_s: out.busy_s.clone(),
    });
    report.simulation = Some(r.sim.clone());
    report
}
