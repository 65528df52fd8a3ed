//! A serving stack to replay traces against: `n` real `tether-rank`
//! processes behind a real Envoy whose bootstrap `tether_envoy::render`
//! generated for them (the same code as `tether gateway`), all guard-owned.
//! Used by the replay tests, the demo and the replay benchmark.

use crate::{Envoy, HarnessError, SimRank};
use serde_json::{Map, Value};
use std::sync::Arc;
use tether_envoy::{GatewaySpec, Mode, render};
use tether_fleet::replay::assemble::{Source, report};
use tether_fleet::replay::{Options, Outcomes, replay};
use tether_fleet::report::Report;
use tether_fleet::trace::Trace;

/// Flags for `tether-rank` with the shipped Llama-3.1-8B FP8 / H200 profile:
/// `cache` (`lru`, `retention`, `retention-host`), device KV tokens, and the
/// host tier (GiB, used with `retention-host` only).
pub fn rank_args(speedup: f64, cache: &str, kv_tokens: u64, host_gib: f64) -> Vec<String> {
    let profile =
        crate::paths::workspace_root().join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json");
    let mut v: Vec<String> = vec![
        "--profile".into(),
        profile.display().to_string(),
        "--speedup".into(),
        speedup.to_string(),
        "--cache".into(),
        cache.into(),
        "--kv-tokens".into(),
        kv_tokens.to_string(),
    ];
    if cache == "retention-host" {
        v.extend(["--host-gib".into(), host_gib.to_string()]);
    }
    v
}

/// What to start.
#[derive(Clone, Debug)]
pub struct StackSpec {
    /// Ranks.
    pub ranks: usize,
    /// Flags for every rank (`--profile`, `--cache`, `--kv-tokens`, `--speedup`, …).
    pub rank_args: Vec<String>,
    /// Gateway mode.
    pub mode: Mode,
    /// Filter plugin configuration (without `mode` / `endpoints`).
    pub plugin_config: Map<String, Value>,
    /// Upstream retries after a failed connection.
    pub retries: u32,
    /// Envoy worker threads.
    pub concurrency: u32,
    /// MAGLEV bounded load (hash mode), else the template's.
    pub hash_balance_factor: Option<u32>,
    /// Name rank `i` `<prefix><i>` with `--rank-id` (else ranks name themselves by address).
    pub rank_id_prefix: Option<String>,
    /// Give every rank `--peers` = the stack's ranks in the gateway's
    /// endpoint order, each on an address chosen before they start (for
    /// `tether-rank --rebalance`, docs/rank.md "Rebalancing in tool gaps").
    pub peers: bool,
}

impl StackSpec {
    /// `ranks` ranks with `rank_args`, in `mode`, default filter configuration, 2 retries, 1 worker.
    pub fn new(ranks: usize, mode: Mode, rank_args: &[&str]) -> Self {
        Self {
            ranks,
            rank_args: rank_args.iter().map(|s| s.to_string()).collect(),
            mode,
            plugin_config: Map::new(),
            retries: 2,
            concurrency: 1,
            hash_balance_factor: None,
            rank_id_prefix: None,
            peers: false,
        }
    }
}

/// A running stack.
#[derive(Debug)]
pub struct Stack {
    /// The ranks (kill one to see a failure).
    pub ranks: Vec<SimRank>,
    /// Envoy.
    pub envoy: Envoy,
}

impl Stack {
    /// Starts the ranks, renders the bootstrap for them and starts Envoy.
    pub fn start(spec: &StackSpec) -> Result<Stack, HarnessError> {
        let listen = if spec.peers {
            free_ports(spec.ranks)?
        } else {
            Vec::new()
        };
        let peers: Vec<String> = listen.iter().map(|a| a.to_string()).collect();
        let ranks = (0..spec.ranks)
            .map(|i| {
                let mut args = spec.rank_args.clone();
                if let Some(p) = &spec.rank_id_prefix {
                    args.extend(["--rank-id".to_owned(), format!("{p}{i}")]);
                }
                if let Some(a) = listen.get(i) {
                    args.extend(["--listen".to_owned(), a.to_string()]);
                    args.push("--peers".to_owned());
                    args.extend(peers.iter().cloned());
                }
                SimRank::start(&args)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let envoy = gateway(spec, &ranks)?;
        Ok(Stack { ranks, envoy })
    }

    /// Another gateway replica in front of the same ranks, as `spec` renders
    /// it (a second Envoy shares nothing with the first: no shared data).
    pub fn replica(&self, spec: &StackSpec) -> Result<Envoy, HarnessError> {
        gateway(spec, &self.ranks)
    }

    /// The gateway's URL.
    pub fn target(&self) -> String {
        format!("http://{}", self.envoy.listen_addr())
    }

    /// Envoy's admin URL.
    pub fn admin(&self) -> String {
        format!("http://{}", self.envoy.admin_addr())
    }

    /// The ranks' URLs.
    pub fn rank_origins(&self) -> Vec<String> {
        self.ranks
            .iter()
            .map(|r| format!("http://{}", r.addr()))
            .collect()
    }

    /// `opts` aimed at this stack: the gateway as target, its admin and ranks scraped.
    pub fn options(&self, mut opts: Options) -> Options {
        opts.targets = vec![
            tether_fleet::replay::Target::parse(&self.target()).unwrap_or_else(|_| unreachable!()),
        ];
        opts.ranks = self.rank_origins();
        opts.gateway_admin = Some(self.admin());
        opts
    }
}

/// `n` loopback addresses free now (bound, then let go for ranks to bind).
pub fn free_ports(n: usize) -> Result<Vec<std::net::SocketAddr>, HarnessError> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(crate::error::io("reserving rank ports"))?;
    held.iter()
        .map(|l| l.local_addr())
        .collect::<Result<Vec<_>, _>>()
        .map_err(crate::error::io("reserving rank ports"))
}

/// Renders the bootstrap of `spec` for `ranks` and starts an Envoy on it.
fn gateway(spec: &StackSpec, ranks: &[SimRank]) -> Result<Envoy, HarnessError> {
    let gw = GatewaySpec {
        mode: spec.mode,
        ranks: ranks.iter().map(SimRank::addr).collect(),
        dp_size: 1,
        plugin_config: spec.plugin_config.clone(),
        filter_wasm: crate::paths::require_filter_wasm()?.display().to_string(),
        listen: "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
        admin: "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
        retries: spec.retries,
        hash_balance_factor: spec.hash_balance_factor,
        rank_names: Vec::new(),
        timeouts: tether_envoy::Timeouts::default(),
        eject_after: 5,
        eject_for_s: 30,
    };
    let yaml = render(&gw).map_err(|e| HarnessError::Protocol {
        what: "tether_envoy::render".into(),
        why: e.to_string(),
    })?;
    Envoy::builder()
        .concurrency(spec.concurrency)
        .log_level("warning")
        .start(&yaml)
}

/// Replays `trace` with `opts` on a fresh tokio runtime (no cancellation)
/// and builds its report.
pub fn replay_blocking(
    trace: &Arc<Trace>,
    source: &Source,
    opts: &Options,
    label: &str,
) -> Result<(Report, Outcomes), HarnessError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(crate::error::io("starting a tokio runtime"))?;
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let out = rt
        .block_on(replay(trace.clone(), opts.clone(), rx))
        .map_err(|e| HarnessError::Protocol {
            what: "tether replay".into(),
            why: e.to_string(),
        })?;
    let r = report(trace, source, opts, &out, label);
    Ok((r, out))
}
