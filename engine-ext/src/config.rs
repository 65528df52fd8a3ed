//! Policy configuration: capacities, block geometry, retention intervals and the value model's priors.

use crate::marker::TurnKind;
use tether_wire::RetentionMs;
use thiserror::Error;

/// Milliseconds on the caller's clock. The policy never reads a wall clock: every
/// operation takes `now`, so simulation and tests are deterministic.
pub type Millis = u64;

/// Retention interval and expected time-to-return for one turn kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindPolicy {
    /// How long a prompt end of this kind stays pinned (refreshed by a hit).
    pub interval_ms: Millis,
    /// Prior for how long until the session returns, before its own gaps are observed.
    pub expected_gap_ms: Millis,
}

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
    /// Per-kind intervals; `first` falls back to `user` unless set.
    pub first: Option<KindPolicy>,
    /// Waiting for a human reply.
    pub user: KindPolicy,
    /// Waiting for a tool result.
    pub tool: KindPolicy,
    /// A subagent handoff.
    pub handoff: KindPolicy,
    /// Prefill cost model: cost(t) = t + t² / `attention_knee_tokens` (token-equivalents).
    pub attention_knee_tokens: u64,
    /// A retention's value decays by e every this many ms without a hit (same for all records).
    pub idle_decay_ms: Millis,
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
            first: Some(KindPolicy {
                interval_ms: RetentionMs::DEFAULT.first,
                expected_gap_ms: 120_000,
            }),
            user: KindPolicy {
                interval_ms: RetentionMs::DEFAULT.user,
                expected_gap_ms: 120_000,
            },
            tool: KindPolicy {
                interval_ms: RetentionMs::DEFAULT.tool,
                expected_gap_ms: 15_000,
            },
            handoff: KindPolicy {
                interval_ms: RetentionMs::DEFAULT.handoff,
                expected_gap_ms: 60_000,
            },
            attention_knee_tokens: 32_768,
            idle_decay_ms: 300_000,
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
        if self.attention_knee_tokens == 0 {
            return Err(ConfigError::Zero("attention_knee_tokens"));
        }
        if self.idle_decay_ms == 0 {
            return Err(ConfigError::Zero("idle_decay_ms"));
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

    /// The policy for a turn kind.
    pub fn kind(&self, kind: TurnKind) -> KindPolicy {
        match kind {
            TurnKind::First => self.first.unwrap_or(self.user),
            TurnKind::User => self.user,
            TurnKind::Tool => self.tool,
            TurnKind::Handoff => self.handoff,
        }
    }

    /// The interval a marker gets: its explicit value if present, else its kind's, clamped.
    pub fn interval(&self, kind: TurnKind, explicit_ms: Option<Millis>) -> Millis {
        explicit_ms
            .unwrap_or(self.kind(kind).interval_ms)
            .min(self.max_interval_ms)
    }
}
