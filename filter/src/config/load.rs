//! The `load` configuration: load-aware pick (`docs/gateway.md`, "Load-aware pick").

/// The `load` configuration: load-aware pick.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// Envoy cluster that holds every endpoint and honours
    /// `x-gateway-destination-endpoint` (`override_host`): where polls go.
    pub cluster: String,
    /// Poll period (the root context's tick), ms.
    pub poll_ms: u64,
    /// Timeout of one poll, ms.
    pub timeout_ms: u64,
    /// A sample older than this is stale, ms: with every sample stale there
    /// is no view (load 0); beside fresh ones it keeps its last value.
    pub max_age_ms: u64,
    /// Bounded-load factor `c` (> 1): a primary over `c` times its share spills.
    pub factor: f64,
    /// Below this many requests in flight an endpoint never spills (≥ 1).
    pub floor: f64,
}

impl Default for LoadConfig {
    /// The fleet simulator's defaults (`tether simulate --balance-factor 2
    /// --balance-floor 8 --load-poll-ms 200`), so a simulated plan and the
    /// gateway spill alike.
    fn default() -> Self {
        Self {
            cluster: "ranks".to_owned(),
            poll_ms: 200,
            timeout_ms: 200,
            max_age_ms: 1000,
            factor: 2.0,
            floor: 8.0,
        }
    }
}

impl LoadConfig {
    /// The bound of [`tether_placement::Placement::pick_bounded`].
    pub fn bound(&self) -> tether_placement::LoadBound {
        tether_placement::LoadBound {
            factor: self.factor,
            floor: self.floor,
        }
    }
}
