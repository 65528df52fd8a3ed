//! The rank's command line (`tether-rank --help`, `docs/rank.md`) and the
//! validated configuration built from it. Every refusal names its flag.

use crate::engine::{EngineConfig, EngineSettings};
use crate::profile::{Profile, ProfileError};
use clap::{Parser, ValueEnum};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;
use thiserror::Error;

/// Which KV-cache policy the simulated engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheMode {
    /// Plain prefix caching with LRU eviction (markers ignored): vLLM's default.
    Lru,
    /// Turn-boundary retention on the device only.
    Retention,
    /// Retention, offloading retained prompts to a host tier under pressure.
    RetentionHost,
}

impl CacheMode {
    /// Flag spelling.
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Lru => "lru",
            CacheMode::Retention => "retention",
            CacheMode::RetentionHost => "retention-host",
        }
    }
}

/// What the rank does in a disaggregated (P/D) fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Prefill and decode here; `x-prefiller-host-port` is ignored (a plain engine).
    Both,
    /// A prefill endpoint: every request is answered with one token.
    Prefill,
    /// A decode endpoint: with `x-prefiller-host-port`, the prompt is prefilled
    /// there and its KV transferred here; without it, served here whole.
    Decode,
}

impl Role {
    /// Flag spelling.
    pub fn name(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// `tether-rank`: a simulated OpenAI/Anthropic-compatible engine rank whose KV
/// cache is tether's retention policy.
#[derive(Debug, Clone, Parser)]
#[command(name = "tether-rank", version, about, args_override_self = true)]
pub struct Args {
    /// Address to listen on (port 0 picks one; the bound address is printed as `READY <addr>`).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// GPU profile (JSON, docs/profile.md): latency curves, KV capacity, restore bandwidth, price.
    #[arg(long)]
    pub profile: PathBuf,
    /// KV-cache policy.
    #[arg(long, value_enum, default_value_t = CacheMode::Retention)]
    pub cache: CacheMode,
    /// Host-tier capacity per DP rank in GiB (only with `--cache retention-host`, where it is required).
    #[arg(long, default_value_t = 0.0)]
    pub host_gib: f64,
    /// Device KV capacity per DP rank in tokens (default: the profile's `max_kv_tokens`).
    #[arg(long)]
    pub kv_tokens: Option<u64>,
    /// Tokens per KV block (vLLM `--block-size`).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Data-parallel ranks in this process, each with its own cache and batch.
    #[arg(long, default_value_t = 1)]
    pub dp_size: usize,
    /// Most requests running at once per DP rank (vLLM `--max-num-seqs`).
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens per engine step, decodes included (vLLM `--max-num-batched-tokens`).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// Longest prompt + output accepted (default: the profile's `max_model_len`, else unbounded).
    #[arg(long)]
    pub max_model_len: Option<u64>,
    /// Output tokens when a request does not say (`max_tokens` and its per-API names).
    #[arg(long, default_value_t = 128)]
    pub default_max_tokens: usize,
    /// Simulated time runs this many times faster than wall time.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Model name listed by `/v1/models` and used in metric labels (default: the profile's `model`).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Largest request body accepted, in bytes (larger: 413).
    #[arg(long, default_value_t = 64 << 20)]
    pub max_body_bytes: usize,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Also write the bound address to this file.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Name sent in the `x-tether-rank` response header (default: the bound `ip:port`).
    #[arg(long)]
    pub rank_id: Option<String>,
    /// P/D role (docs/rank.md "P/D roles").
    #[arg(long, value_enum, default_value_t = Role::Both)]
    pub role: Role,
    /// KV-transfer link of a decode-role rank, GB/s (prefilled KV arriving from a prefiller).
    #[arg(long, default_value_t = 50.0)]
    pub kv_link_gbps: f64,
    /// Prefetch in tool gaps: bring a tool/handoff turn's state back from the host
    /// tier before the session is expected back (only with `--cache retention-host`).
    #[arg(long)]
    pub prefetch: bool,
    /// Hold each running request's partial and output blocks and free them tail first
    /// into the LRU queue, as vLLM's block manager does (docs/rank.md "Flags"); off,
    /// a request holds its full prompt blocks only, as every figure measured before it.
    #[arg(long)]
    pub vllm_tail_blocks: bool,
    /// Most entries of the residency summary in `/load` (docs/rank.md
    /// "Residency summary"); the largest retained states are listed first; 0
    /// publishes none.
    #[arg(long, default_value_t = tether_placement::residency::MAX_ENTRIES)]
    pub residency_entries: usize,
    /// What the residency summary lists: `admission` (retained states and
    /// the keys of admitted requests, waiting or running) or `retention`
    /// (retained states only).
    #[arg(long, default_value = "admission", value_parser = ["admission", "retention"])]
    pub residency_from: String,
    /// State pull, as a holder: how long a lease holds a key's retained
    /// blocks after its grant or last renewal, ms (docs/rank.md "State pull").
    #[arg(long, default_value_t = 30_000)]
    pub pull_lease_ms: u64,
    /// State pull, as a new home: the bound on a lease call, ms; past it the
    /// prompt is computed here.
    #[arg(long, default_value_t = 10_000)]
    pub pull_timeout_ms: u64,
    /// Rebalancing in tool gaps (docs/rank.md "Rebalancing in tool gaps"):
    /// at a tool/handoff turn's end, copy the retained state to a cooler
    /// candidate when this rank holds more KV than the fleet's mean; needs `--peers`.
    #[arg(long)]
    pub rebalance: bool,
    /// Rebalancing: the fleet's endpoints as the gateway's `endpoints` list
    /// them, in the same order, this rank included: `address[,weight[,name]]`
    /// each (several values, or one value separated by spaces).
    #[arg(long, num_args = 1.., value_delimiter = ' ')]
    pub peers: Vec<String>,
    /// Rebalancing: a home whose device KV in use is above this × the
    /// fleet's mean copies its tool turn's state (> 1).
    #[arg(long, default_value_t = 1.1)]
    pub rebalance_kv_factor: f64,
    /// Rebalancing: *d*, the rendezvous candidates a key may live on (the
    /// gateway's `residency.candidates`; default 4, at most the peers).
    #[arg(long)]
    pub candidates: Option<usize>,
    /// Rebalancing: a candidate has room under this bounded-load factor (the
    /// gateway's `residency.factor`, > 1).
    #[arg(long, default_value_t = 1.5)]
    pub resident_factor: f64,
    /// Rebalancing: below this many requests a candidate has room (the
    /// gateway's `residency.floor`, ≥ 1).
    #[arg(long, default_value_t = 1.0)]
    pub resident_floor: f64,
    /// Rebalancing: how often the peers' `/load` is polled, ms.
    #[arg(long, default_value_t = 200)]
    pub peer_poll_ms: u64,
}

/// A command line the rank cannot start with.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The profile file is unusable.
    #[error("--profile {path}: {source}")]
    Profile {
        /// The file.
        path: String,
        /// Why.
        source: ProfileError,
    },
    /// A flag's value is out of range or inconsistent with another.
    #[error("--{flag}: {why}")]
    Flag {
        /// The flag, without dashes.
        flag: &'static str,
        /// Why.
        why: String,
    },
}

fn flag(flag: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Flag {
        flag,
        why: why.into(),
    }
}

/// Whether `s` cannot be sent as a header value as it is.
fn hyper_header_unsafe(s: &str) -> bool {
    !s.bytes().all(|b| b.is_ascii_graphic())
}

/// The validated configuration of a rank process.
#[derive(Debug, Clone)]
pub struct RankConfig {
    /// The command line as given.
    pub args: Args,
    /// The profile read from `--profile`.
    pub profile: Profile,
    /// xxh3-64 of the profile file's bytes, hex (reports name the profile by it).
    pub profile_hash: String,
    /// Device KV blocks per DP rank.
    pub device_blocks: usize,
    /// Host-tier bytes per DP rank.
    pub host_bytes: u64,
    /// Longest prompt + output accepted.
    pub max_model_len: Option<u64>,
    /// Served model name.
    pub model_name: String,
    /// `--peers` read (empty without `--rebalance`).
    pub peers: Vec<tether_placement::Endpoint>,
}

impl RankConfig {
    /// Reads the profile and checks every flag.
    pub fn from_args(args: Args) -> Result<Self, ConfigError> {
        let path = args.profile.display().to_string();
        let text = std::fs::read(&args.profile).map_err(|e| ConfigError::Profile {
            path: path.clone(),
            source: ProfileError::Read {
                path: path.clone(),
                why: e.to_string(),
            },
        })?;
        let profile_hash = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&text));
        let profile = std::str::from_utf8(&text)
            .map_err(|e| ProfileError::Parse(e.to_string()))
            .and_then(Profile::from_json)
            .map_err(|source| ConfigError::Profile {
                path: path.clone(),
                source,
            })?;
        Self::with_profile(args, profile, profile_hash)
    }

    /// Checks the flags against an already-read profile.
    pub fn with_profile(
        args: Args,
        profile: Profile,
        profile_hash: String,
    ) -> Result<Self, ConfigError> {
        if args.block_size == 0 {
            return Err(flag("block-size", "must be at least 1"));
        }
        let kv_tokens = args.kv_tokens.unwrap_or(profile.max_kv_tokens);
        let device_blocks =
            usize::try_from(kv_tokens / args.block_size as u64).unwrap_or(usize::MAX);
        if device_blocks == 0 {
            return Err(flag(
                "kv-tokens",
                format!("{kv_tokens} tokens hold no {}-token block", args.block_size),
            ));
        }
        if args.dp_size == 0 || args.dp_size > 1024 {
            return Err(flag("dp-size", "must be between 1 and 1024"));
        }
        if args.max_num_seqs == 0 {
            return Err(flag("max-num-seqs", "must be at least 1"));
        }
        if args.max_num_batched_tokens < args.max_num_seqs {
            return Err(flag(
                "max-num-batched-tokens",
                format!("must be at least --max-num-seqs ({})", args.max_num_seqs),
            ));
        }
        if args.default_max_tokens == 0 {
            return Err(flag("default-max-tokens", "must be at least 1"));
        }
        if !(args.speedup.is_finite() && args.speedup > 0.0 && args.speedup <= 1e6) {
            return Err(flag("speedup", "must be a number in (0, 1e6]"));
        }
        if !(args.host_gib.is_finite() && args.host_gib >= 0.0) {
            return Err(flag("host-gib", "must be a non-negative number"));
        }
        let host_bytes = (args.host_gib * (1u64 << 30) as f64) as u64;
        match (args.cache, host_bytes) {
            (CacheMode::RetentionHost, 0) => {
                return Err(flag(
                    "host-gib",
                    "must be positive with --cache retention-host",
                ));
            }
            (CacheMode::Lru | CacheMode::Retention, b) if b > 0 => {
                return Err(flag(
                    "host-gib",
                    format!(
                        "a host tier needs --cache retention-host (got --cache {})",
                        args.cache.name()
                    ),
                ));
            }
            _ => {}
        }
        if args.prefetch && args.cache != CacheMode::RetentionHost {
            return Err(flag(
                "prefetch",
                format!(
                    "prefetches from the host tier, which needs --cache retention-host (got --cache {})",
                    args.cache.name()
                ),
            ));
        }
        if args.max_model_len == Some(0) {
            return Err(flag("max-model-len", "must be at least 1"));
        }
        if args.threads == 0 || args.threads > 256 {
            return Err(flag("threads", "must be between 1 and 256"));
        }
        if let Some(id) = &args.rank_id
            && (id.is_empty() || hyper_header_unsafe(id))
        {
            return Err(flag(
                "rank-id",
                "must be non-empty visible ASCII (it is sent as a header value)",
            ));
        }
        if !(args.kv_link_gbps.is_finite() && args.kv_link_gbps > 0.0) {
            return Err(flag("kv-link-gbps", "must be a positive number"));
        }
        if args.residency_entries > tether_placement::residency::MAX_ENTRIES {
            return Err(flag(
                "residency-entries",
                format!(
                    "at most {} (what a reader accepts)",
                    tether_placement::residency::MAX_ENTRIES
                ),
            ));
        }
        if args.max_body_bytes == 0 {
            return Err(flag("max-body-bytes", "must be positive"));
        }
        for (name, v) in [
            ("pull-lease-ms", args.pull_lease_ms),
            ("pull-timeout-ms", args.pull_timeout_ms),
        ] {
            if !(1..=3_600_000).contains(&v) {
                return Err(flag(name, "must be between 1 and 3600000"));
            }
        }
        let model_name = args
            .served_model_name
            .clone()
            .unwrap_or_else(|| profile.model.clone());
        if model_name.trim().is_empty() {
            return Err(flag("served-model-name", "must not be empty"));
        }
        let max_model_len = args.max_model_len.or(profile.max_model_len);
        let peers = crate::rebalance::check_flags(&args)?;
        Ok(Self {
            profile,
            profile_hash,
            device_blocks,
            host_bytes,
            max_model_len,
            model_name,
            args,
            peers,
        })
    }

    /// The engine configuration of one DP rank.
    pub fn engine(&self) -> EngineConfig {
        let mut e = EngineConfig::for_profile(
            &self.profile,
            &EngineSettings {
                block_size: self.args.block_size,
                device_kv_tokens: Some(self.device_blocks as u64 * self.args.block_size as u64),
                host_bytes: self.host_bytes,
                retention: self.args.cache != CacheMode::Lru,
                max_num_seqs: self.args.max_num_seqs,
                max_num_batched_tokens: self.args.max_num_batched_tokens,
                kv_link_gbps: self.args.kv_link_gbps,
                prefetch: self.args.prefetch,
            },
        );
        e.policy.hold_tail_blocks = self.args.vllm_tail_blocks;
        e
    }

    /// The effective configuration as JSON (`GET /tether/config`), with a hash
    /// of the serving settings so reports can tell configurations apart.
    pub fn describe(&self) -> Value {
        let a = &self.args;
        let serving = json!({
            "cache": a.cache.name(),
            "vllm_tail_blocks": a.vllm_tail_blocks,
            "host_bytes": self.host_bytes,
            "device_blocks": self.device_blocks,
            "block_size": a.block_size,
            "dp_size": a.dp_size,
            "max_num_seqs": a.max_num_seqs,
            "max_num_batched_tokens": a.max_num_batched_tokens,
            "max_model_len": self.max_model_len,
            "default_max_tokens": a.default_max_tokens,
            "speedup": a.speedup,
            "served_model_name": self.model_name,
            "profile_hash": self.profile_hash,
            "role": a.role.name(),
            "kv_link_gbps": a.kv_link_gbps,
            "prefetch": a.prefetch,
        });
        let hash = format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(serving.to_string().as_bytes())
        );
        json!({
            "serving": serving,
            "serving_hash": hash,
            "profile": {
                "path": a.profile.display().to_string(),
                "name": self.profile.name,
                "model": self.profile.model,
                "gpu": self.profile.gpu,
                "gpus_per_engine": self.profile.gpus_per_engine,
                "gpu_hour_usd": self.profile.gpu_hour_usd,
                "engine_hour_usd": self.profile.engine_hour_usd(),
                "max_kv_tokens": self.profile.max_kv_tokens,
                "kv_bytes_per_token": self.profile.kv_bytes_per_token,
                "host_restore_gbps": self.profile.host_restore_gbps,
                "hash": self.profile_hash,
            },
            "rank_id": a.rank_id,
            "pull": {"lease_ms": a.pull_lease_ms, "timeout_ms": a.pull_timeout_ms},
            "rebalance": a.rebalance.then(|| json!({
                "peers": self.peers.iter().map(|e| json!({
                    "address": e.address, "weight": e.weight, "name": e.name,
                })).collect::<Vec<_>>(),
                "kv_factor": a.rebalance_kv_factor,
                "candidates": crate::rebalance::candidates(a, self.peers.len()),
                "resident_factor": a.resident_factor,
                "resident_floor": a.resident_floor,
                "peer_poll_ms": a.peer_poll_ms,
            })),
            "version": env!("CARGO_PKG_VERSION"),
        })
    }
}
