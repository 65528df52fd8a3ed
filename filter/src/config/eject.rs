//! The `eject` configuration: passive outlier detection in pick mode (`docs/gateway.md`).

/// `eject`: consecutive failures that eject an endpoint, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EjectConfig {
    /// Failed answers in a row (5xx, reset, timeout, refused) that eject it.
    pub failures: u32,
    /// How long it stays out; then one request tries it again.
    pub ms: u64,
}

impl Default for EjectConfig {
    fn default() -> Self {
        Self {
            failures: 3,
            ms: 10_000,
        }
    }
}
