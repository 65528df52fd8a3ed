//! Policy configuration: capacities, block geometry and retention intervals.

use crate::marker::TurnKind;
use tether_wire::RetentionMs;
use thiserror::Error;

/// Milliseconds on the caller's clock. The policy never reads a wall clock: every
/// operation takes `now`, so simulation and tests are deterministic.
pub type Millis = u64;

/// Everything the retention policy is configured with.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Tokens per KV block (vLLM `--block-size`, default 16).
    pub block_size: usize,
    /// Device KV capacity in blocks (the rank's block pool).
    pub device_blocks: usize,
    /// Bytes one block occupies across all layers (accounting and host-tier sizing).
    pub block_bytes: u64,
    /// Bytes of one linear-state snapshot (layers × per-layer state); 0 for attention-only models.
    pub state_bytes: u64,
    /// Device slots for retained linear-state snapshots.
    pub device_state_slots: usize,
    /// Host-tier capacity in bytes; 0 disables the host tier.
    pub host_bytes: u64,
    /// Honour prompt-end markers (false = plain LRU prefix caching).
    pub retention: bool,
    /// Extra linear-state checkpoints every this many tokens inside a retained prompt (0 = prompt end only).
    pub checkpoint_every_tokens: usize,
    /// Upper bound on any interval, including an explicit `x-tether-retention-ms`.
    pub max_interval_ms: Millis,
    /// Retention interval per turn kind (the wire contract's table by default).
    pub intervals: RetentionMs,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            device_blocks: 32_768,
            block_bytes: 2 << 20,
            state_bytes: 0,
            device_state_slots: 0,
            host_bytes: 0,
            retention: true,
            checkpoint_every_tokens: 0,
            max_interval_ms: 3_600_000,
            intervals: RetentionMs::DEFAULT,
        }
    }
}

/// A configuration the policy cannot run with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A field that must be positive is zero.
    #[error("{0} must be positive")]
    Zero(&'static str),
    /// Linear-state bytes are set but there are no slots to keep snapshots in, or vice versa.
    #[error("state_bytes and device_state_slots must be both zero or both positive")]
    StateSlots,
}

impl PolicyConfig {
    /// Checks the fields that would make the policy meaningless.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.block_size == 0 {
            return Err(ConfigError::Zero("block_size"));
        }
        if self.device_blocks == 0 {
            return Err(ConfigError::Zero("device_blocks"));
        }
        if (self.state_bytes == 0) != (self.device_state_slots == 0) {
            return Err(ConfigError::StateSlots);
        }
        Ok(())
    }

    /// True for hybrid models (linear attention / SSM layers), whose prefix is only
    /// reusable at a boundary that has a state snapshot.
    pub fn hybrid(&self) -> bool {
        self.state_bytes > 0
    }

    /// The interval a marker gets: its explicit value if present, else its kind's, clamped.
    pub fn interval(&self, kind: TurnKind, explicit_ms: Option<Millis>) -> Millis {
        explicit_ms
            .unwrap_or(self.intervals.get(kind))
            .min(self.max_interval_ms)
    }
}
