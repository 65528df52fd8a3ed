//! The `pd` configuration: P/D in pick mode (`docs/gateway.md`, "P/D").

use tether_placement::Endpoint;

/// The `pd` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PdConfig {
    /// The prefill pool (`x-prefiller-host-port` candidates).
    pub prefill: Vec<Endpoint>,
    /// Disaggregate when more expected-uncached prompt tokens than this.
    pub threshold_tokens: u64,
    /// Request-body bytes per prompt token, for the estimate.
    pub bytes_per_token: f64,
}

/// Default `pd.threshold_tokens`: the fleet simulator's default (`tether simulate --pd-threshold`).
pub const DEFAULT_THRESHOLD_TOKENS: u64 = 2048;
/// Default `pd.bytes_per_token`: JSON of English text and code runs near 4 bytes per token.
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;
