//! What one simulation run is configured with: the routing policy, the cache
//! mode, the fleet's shape (aggregated, or prefill and decode pools, possibly
//! scaled over time) and the engine settings every rank shares.

use super::identity::IdentityModel;
use crate::name::{UnknownName, pick};
use serde::{Deserialize, Serialize};
use tether_rank_engine::engine::EngineSettings;

/// Where the gateway sends a request (`docs/planning.md` states what identity
/// each one sees).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Each request to the next rank in turn.
    RoundRobin,
    /// The rank with the fewest requests in flight.
    LeastLoaded,
    /// Rendezvous hash of the client's address (source-IP affinity).
    ClientHash,
    /// Rendezvous hash of the end user (`x-user-id`-style affinity).
    UserHash,
    /// tether's key (session + subagent), rendezvous, no load bound.
    Tether,
    /// tether's key with bounded load on requests in flight (Envoy's
    /// `hash_balance_factor`, or the filter's own bound).
    TetherBounded,
    /// tether's key, spilled down its rendezvous order when the primary is over
    /// the bound in the ranks' polled `/load` view (the filter's load-aware pick).
    TetherLoad,
    /// tether's key placed by residency and load among its first *d*
    /// rendezvous candidates on the polled `/load` view: stay with the state,
    /// a new key to the least loaded candidate, an overloaded holder's key
    /// moved with its state over the KV link (`tether_placement::resident`);
    /// in P/D the prefill leg goes to a prefill rank chosen the same way.
    TetherResident,
    /// SGLang-style cache-aware routing on an approximate prefix tree.
    Prefix,
    /// The ceiling: every prompt served from one infinite cache holding every
    /// block seen before, on the least-loaded rank.
    Oracle,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 10] = [
        Policy::RoundRobin,
        Policy::LeastLoaded,
        Policy::ClientHash,
        Policy::UserHash,
        Policy::Tether,
        Policy::TetherBounded,
        Policy::TetherLoad,
        Policy::TetherResident,
        Policy::Prefix,
        Policy::Oracle,
    ];

    /// The name on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastLoaded => "least-loaded",
            Policy::ClientHash => "client-hash",
            Policy::UserHash => "user-hash",
            Policy::Tether => "tether",
            Policy::TetherBounded => "tether-bounded",
            Policy::TetherLoad => "tether-load",
            Policy::TetherResident => "tether-resident",
            Policy::Prefix => "prefix",
            Policy::Oracle => "oracle",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<Policy, UnknownName> {
        pick(&Self::ALL, Policy::name, s, "policy")
    }

    /// Whether the policy reads requests in flight (the simulator then keeps
    /// that count exact at every arrival).
    pub const fn reads_inflight(self) -> bool {
        matches!(
            self,
            Policy::LeastLoaded | Policy::TetherBounded | Policy::Prefix | Policy::Oracle
        )
    }
}

/// How `tether-resident` moves a key's state to its new rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Migrate {
    /// The P/D path with the old home as prefiller: the old home runs the
    /// request as a one-token prefill leg on its retained state (computing
    /// the turn's new tokens) and the KV crosses to the new rank
    /// (`x-prefiller-host-port`, the filter's `residency.migrate: "leg"`).
    Leg,
    /// The new rank leases the retained state from the old home (a round
    /// trip, `transfer_setup_ms`), reads the blocks matching its prompt over
    /// its link and computes the new tokens itself; nothing is scheduled on
    /// the old home — what `tether-rank` does on `x-tether-pull-from` and the
    /// vLLM connector over NIXL (the filter's default, `migrate: "pull"`).
    #[default]
    Pull,
}

impl Migrate {
    /// Both, in report order.
    pub const ALL: [Migrate; 2] = [Migrate::Leg, Migrate::Pull];

    /// The name on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Migrate::Leg => "leg",
            Migrate::Pull => "pull",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<Migrate, UnknownName> {
        pick(&Self::ALL, Migrate::name, s, "migration")
    }
}

/// How each rank caches (the `tether-rank --cache` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheMode {
    /// Plain prefix caching, LRU (markers ignored).
    Lru,
    /// Turn-boundary retention on the device.
    Retention,
    /// Retention plus a host tier.
    RetentionHost,
}

impl CacheMode {
    /// Every mode.
    pub const ALL: [CacheMode; 3] = [
        CacheMode::Lru,
        CacheMode::Retention,
        CacheMode::RetentionHost,
    ];

    /// The name on the command line and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            CacheMode::Lru => "lru",
            CacheMode::Retention => "retention",
            CacheMode::RetentionHost => "retention-host",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<CacheMode, UnknownName> {
        pick(&Self::ALL, CacheMode::name, s, "cache mode")
    }
}

/// SGLang's cache-aware thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PrefixOptions {
    /// Route to the best match only above this match rate.
    pub cache_threshold: f64,
    /// Imbalanced when max − min in-flight exceeds this …
    pub balance_abs: f64,
    /// … and max exceeds this × min.
    pub balance_rel: f64,
}

impl Default for PrefixOptions {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs: 64.0,
            balance_rel: 1.5,
        }
    }
}

/// Ranks active from `start_ms` on (a scaling step of a plan).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Step {
    /// Trace time the step starts, ms.
    pub start_ms: f64,
    /// Active prefill ranks (0 in an aggregated fleet).
    pub prefill: usize,
    /// Active decode (or aggregated) ranks, ≥ 1.
    pub decode: usize,
}

/// The fleet's shape: its ranks, and how many are active when.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetShape {
    /// Prefill ranks (0 = aggregated: every rank prefills and decodes).
    pub prefill: usize,
    /// Decode ranks (the aggregated ranks when `prefill` is 0).
    pub decode: usize,
    /// Scaling steps, by start time (simulated ms, after any speedup); empty =
    /// all ranks active throughout. Each step's counts are at most `prefill` /
    /// `decode`.
    pub steps: Vec<Step>,
    /// The fleet is paid for at least until this time (the end of a plan's
    /// last interval), even when the trace is served sooner.
    pub until_ms: Option<f64>,
}

impl FleetShape {
    /// `n` aggregated ranks, all active.
    pub fn aggregated(n: usize) -> Self {
        Self {
            prefill: 0,
            decode: n,
            steps: Vec::new(),
            until_ms: None,
        }
    }

    /// `p` prefill and `d` decode ranks, all active.
    pub fn disaggregated(p: usize, d: usize) -> Self {
        Self {
            prefill: p,
            decode: d,
            steps: Vec::new(),
            until_ms: None,
        }
    }

    /// Whether prefill runs on its own pool.
    pub fn is_disaggregated(&self) -> bool {
        self.prefill > 0
    }
}

/// Disaggregated serving: when a prefill goes to the prefill pool, and how its
/// KV reaches the decode rank.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PdOptions {
    /// Prefill remotely only when the prompt tokens the decode rank does not
    /// hold exceed this (llm-d `nonCachedTokens`); 0 = every prefill remote.
    pub threshold_tokens: u64,
    /// Bandwidth of a decode rank's KV-transfer link, GB/s.
    pub kv_link_gbps: f64,
    /// `tether-resident`: a request over the threshold is still prefilled on
    /// its decode holder when the prefill leg would compute more of its prompt
    /// than the holder (the leg's rank holds less of it), so a returning turn's
    /// new tokens stay with the session's cache (docs/planning.md).
    pub by_cost: bool,
}

impl Default for PdOptions {
    fn default() -> Self {
        Self {
            threshold_tokens: 2048,
            kv_link_gbps: 50.0,
            by_cost: true,
        }
    }
}

/// Hybrid-model (linear-attention / SSM) state retention, per rank: overrides of the
/// profile's `hybrid` member (`docs/profile.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct HybridOptions {
    /// Bytes of one state snapshot (0 = the profile's; attention-only without one).
    pub state_bytes: u64,
    /// Tokens between resumable boundaries (0 = the profile's, else every block).
    pub align_tokens: usize,
    /// Extra snapshots every this many tokens inside a retained prompt (0 = prompt end only).
    pub checkpoint_tokens: usize,
}

/// One simulation run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Routing policy (of the decode pool, or of the only pool).
    pub policy: Policy,
    /// Cache mode of every rank.
    pub cache: CacheMode,
    /// The fleet.
    pub fleet: FleetShape,
    /// Engine settings of every rank (block size `0` = the trace's block
    /// size; `retention` and `kv_link_gbps` are set from `cache` and `pd`).
    pub engine: EngineSettings,
    /// Host-tier bytes per rank with `retention-host`.
    pub host_bytes: u64,
    /// P/D settings (used when the fleet is disaggregated).
    pub pd: PdOptions,
    /// Bounded-load factor `c` of `tether-bounded` and `tether-load`.
    pub balance_factor: f64,
    /// Below this load a rank always takes its keys (`tether-bounded`,
    /// `tether-load`; requests in flight, or running + waiting).
    pub balance_floor: f64,
    /// Fallbacks kept per key for bounded load (the rendezvous order's length − 1).
    pub fallbacks: usize,
    /// How often `tether-load` and `tether-resident` poll the ranks' load, ms.
    pub load_poll_ms: f64,
    /// `tether-resident`: rendezvous candidates a key may live on (*d* ≥ 1).
    pub candidates: usize,
    /// `tether-resident`'s load bound (over running + waiting): tighter than
    /// `tether-load`'s, because a key over it moves with its state instead
    /// of losing it.
    pub resident_bound: tether_placement::LoadBound,
    /// `tether-resident`: where a key no rank holds goes (the filter's
    /// `residency.unseen`).
    pub resident_unseen: tether_placement::Unseen,
    /// `tether-resident`: what a holder over the bound does (the filter's
    /// `residency.over_bound`).
    pub resident_over_bound: tether_placement::OverBound,
    /// `tether-resident`: weight of a rank's busy share beside its requests
    /// in flight (`tether_placement::resident_load`; the filter's
    /// `tether_placement::BUSY_WEIGHT`; 0: ties by rendezvous order).
    pub resident_busy_weight: f64,
    /// `tether-resident`: copy a `tool`/`handoff` turn's retained state to a
    /// cooler candidate during the tool gap when its home holds more device KV
    /// than the mean by the factor (`tether_placement::rebalance`), releasing
    /// the copy the next turn does not take; `None`: off.
    pub rebalance: Option<tether_placement::Rebalance>,
    /// `tether-resident`: fixed cost of one KV transfer (the migrate rule), ms.
    pub transfer_setup_ms: f64,
    /// `tether-resident`: how a migrated state moves.
    pub migrate: Migrate,
    /// SGLang cache-aware thresholds of `prefix`.
    pub prefix: PrefixOptions,
    /// Users and client addresses (client-hash, user-hash).
    pub identity: IdentityModel,
    /// Also count what an unlimited per-rank cache would have reused (for the
    /// avoidable re-prefill of `retention-bench`; costs a set of block ids per rank).
    pub track_reusable: bool,
    /// Hybrid-model state retention.
    pub hybrid: HybridOptions,
    /// Replay the trace this many times faster (arrival times divided by it;
    /// think and tool gaps shrink alike, retention intervals do not).
    pub speedup: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            policy: Policy::TetherBounded,
            cache: CacheMode::Retention,
            fleet: FleetShape::aggregated(8),
            engine: EngineSettings {
                block_size: 0,
                ..EngineSettings::default()
            },
            host_bytes: 0,
            pd: PdOptions::default(),
            balance_factor: 2.0,
            balance_floor: 8.0,
            fallbacks: 8,
            load_poll_ms: 200.0,
            candidates: tether_placement::DEFAULT_CANDIDATES,
            resident_bound: tether_placement::LoadBound {
                factor: 1.5,
                floor: 1.0,
            },
            resident_unseen: tether_placement::Unseen::default(),
            resident_over_bound: tether_placement::OverBound::default(),
            resident_busy_weight: tether_placement::BUSY_WEIGHT,
            rebalance: None,
            transfer_setup_ms: 5.0,
            migrate: Migrate::Pull,
            prefix: PrefixOptions::default(),
            identity: IdentityModel::default(),
            track_reusable: false,
            hybrid: HybridOptions::default(),
            speedup: 1.0,
        }
    }
}
