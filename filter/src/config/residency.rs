//! The `residency` configuration: residency-aware placement (`docs/gateway.md`,
//! "Residency-aware placement").

use tether_placement::{
    FALLBACK_PREFILL_TOKENS_PER_S, LoadBound, MoveCost, OverBound, Rule, Unseen,
};

/// The `residency` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidencyConfig {
    /// *d*: rendezvous candidates a key may live on.
    pub candidates: usize,
    /// KV-cache bytes per token of the served model.
    pub kv_bytes_per_token: f64,
    /// KV link between ranks, GB/s (10⁹ bytes/s, as `tether-rank
    /// --kv-link-gbps`; 0: never migrate).
    pub link_gbps: f64,
    /// Fixed cost of one transfer, ms.
    pub transfer_setup_ms: f64,
    /// Every rank's prefill rate, tokens/s, when the configuration sets one:
    /// it turns the ranks' prefill backlogs into waits and prices a
    /// recompute. `None` (the default): each rank's own rate from its
    /// `/load` (`ranks[].prefill_tokens_per_s`), and
    /// [`FALLBACK_PREFILL_TOKENS_PER_S`] for a rank that reports none and
    /// for the recompute price.
    pub prefill_tokens_per_s: Option<f64>,
    /// Bounded-load factor of the holder (> 1): tighter than `load.factor`,
    /// since a key over it moves with its state instead of losing it.
    pub factor: f64,
    /// Below this many requests in flight a holder always keeps its keys (≥ 1).
    pub floor: f64,
    /// Where a key no candidate's summary shows goes (rule 2).
    pub unseen: Unseen,
    /// How a migrated key's state reaches its new endpoint (rule 3).
    pub migrate: Migrate,
    /// What a holder over the bound does (rule 3).
    pub over_bound: OverBound,
    /// Weight of an endpoint's busy share beside its requests in flight
    /// (`tether_placement::resident_load`; 0–1, 0: ties by rendezvous order).
    pub busy_weight: f64,
}

/// How a migrated key's state reaches its new endpoint (`residency.migrate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Migrate {
    /// The new endpoint pulls the state from the old holder, named in
    /// `x-tether-pull-from` (and `kv_transfer_params.tether.pull_from`): the
    /// old holder schedules nothing, it only holds the state under a lease.
    #[default]
    Pull,
    /// The old holder runs a prefill leg on its state, named as the prefiller
    /// in `x-prefiller-host-port` (llm-d's P/D path): the leg queues behind
    /// the backlog that made the key move.
    Leg,
}

impl Migrate {
    /// Every setting with its name, as the configuration spells it.
    pub const NAMES: [(&'static str, Migrate); 2] =
        [("pull", Migrate::Pull), ("leg", Migrate::Leg)];

    /// The setting named `s`.
    pub fn from_name(s: &str) -> Option<Migrate> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, m)| *m)
    }
}

impl Default for ResidencyConfig {
    /// The bundled Llama-3.1-8B FP8 H200 profile on a 50 GB/s link: the
    /// defaults of `tether replay --route resident` and `tether-rank`; the
    /// bound of `tether simulate --policy tether-resident`.
    fn default() -> Self {
        Self {
            candidates: tether_placement::DEFAULT_CANDIDATES,
            kv_bytes_per_token: 131_072.0,
            link_gbps: 50.0,
            transfer_setup_ms: 5.0,
            prefill_tokens_per_s: None,
            factor: 1.5,
            floor: 1.0,
            busy_weight: tether_placement::BUSY_WEIGHT,
            unseen: Unseen::default(),
            migrate: Migrate::default(),
            over_bound: OverBound::default(),
        }
    }
}

impl ResidencyConfig {
    /// The placement rule.
    pub fn rule(&self) -> Rule {
        Rule {
            candidates: self.candidates,
            bound: LoadBound {
                factor: self.factor,
                floor: self.floor,
            },
            cost: MoveCost::from_link(
                self.kv_bytes_per_token,
                self.link_gbps,
                self.transfer_setup_ms,
                self.prefill_tokens_per_s
                    .unwrap_or(FALLBACK_PREFILL_TOKENS_PER_S),
            ),
            unseen: self.unseen,
            over_bound: self.over_bound,
        }
    }

    /// How long a rank's prefill backlog of `tokens` holds a new prefill
    /// back, ms: at the configured rate when there is one, else at the rate
    /// the rank `reported` (positive and finite), else at the fallback.
    pub fn wait_ms(&self, rule: &Rule, tokens: f64, reported: Option<f64>) -> f64 {
        let own = reported.filter(|_| self.prefill_tokens_per_s.is_none());
        rule.cost.wait_ms(tokens, own)
    }
}
