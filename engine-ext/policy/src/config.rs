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
    /// Bytes of one linear-state snapshot (layers × per-layer state); 0 for attention-only
    /// models. Snapshots are paid from the device block budget: each takes
    /// [`PolicyConfig::state_blocks`] block slots.
    pub state_bytes: u64,
    /// Host-tier capacity in bytes; 0 disables the host tier.
    pub host_bytes: u64,
    /// Honour prompt-end markers (false = plain LRU prefix caching).
    pub retention: bool,
    /// Extra linear-state checkpoints every this many tokens inside a retained prompt (0 = prompt end only).
    pub checkpoint_every_tokens: usize,
    /// Hybrid models: tokens between the boundaries a snapshot can be taken at (vLLM's
    /// `mamba_block_size`, which `--mamba-cache-mode align` makes the block size of the
    /// hybrid allocator); a multiple of `block_size`, 0 = every block. The prompt end
    /// and checkpoints are rounded down to it.
    pub state_align_tokens: usize,
    /// Upper bound on any interval, including an explicit `x-tether-retention-ms`.
    pub max_interval_ms: Millis,
    /// Retention interval per turn kind (the wire contract's table by default).
    pub intervals: RetentionMs,
    /// Hold a running request's partial and output blocks as vLLM does
    /// ([`RetentionCache::grow`](crate::RetentionCache::grow)): a request occupies
    /// `⌈(prompt + generated) ÷ block_size⌉` slots, and when it ends those past its
    /// full prompt blocks join the free queue as dead blocks ahead of its prompt (vLLM
    /// frees a request's blocks tail first, hashed or not, into one LRU queue). Off, a
    /// request holds its full prompt blocks only (the figures measured before it).
    pub hold_tail_blocks: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            device_blocks: 32_768,
            block_bytes: 2 << 20,
            state_bytes: 0,
            host_bytes: 0,
            retention: true,
            checkpoint_every_tokens: 0,
            state_align_tokens: 0,
            max_interval_ms: 3_600_000,
            intervals: RetentionMs::DEFAULT,
            hold_tail_blocks: false,
        }
    }
}

/// A configuration the policy cannot run with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A field that must be positive is zero.
    #[error("{0} must be positive")]
    Zero(&'static str),
    /// The snapshot alignment is not a whole number of blocks.
    #[error("state_align_tokens {align} must be a multiple of block_size {block}")]
    StateAlign {
        /// The configured alignment.
        align: usize,
        /// The block size.
        block: usize,
    },
    /// One linear-state snapshot needs more block slots than the device has.
    #[error(
        "state_bytes {state_bytes} needs {need} blocks of block_bytes, more than device_blocks {have}"
    )]
    StateTooLarge {
        /// The configured snapshot size.
        state_bytes: u64,
        /// Block slots one snapshot needs.
        need: u64,
        /// Device blocks configured.
        have: usize,
    },
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
        if !self.state_align_tokens.is_multiple_of(self.block_size) {
            return Err(ConfigError::StateAlign {
                align: self.state_align_tokens,
                block: self.block_size,
            });
        }
        if self.hybrid() {
            if self.block_bytes == 0 {
                return Err(ConfigError::Zero("block_bytes"));
            }
            let need = self.state_bytes.div_ceil(self.block_bytes);
            if need > self.device_blocks as u64 {
                return Err(ConfigError::StateTooLarge {
                    state_bytes: self.state_bytes,
                    need,
                    have: self.device_blocks,
                });
            }
        }
        Ok(())
    }

    /// Blocks between the boundaries a snapshot can be taken at (at least 1).
    pub fn state_align_blocks(&self) -> usize {
        (self.state_align_tokens / self.block_size.max(1)).max(1)
    }

    /// Device block slots one linear-state snapshot occupies (`state_bytes` rounded up
    /// to whole blocks, as vLLM pads a Mamba state to the shared page size); 0 for
    /// attention-only models.
    pub fn state_blocks(&self) -> usize {
        if self.hybrid() && self.block_bytes > 0 {
            usize::try_from(self.state_bytes.div_ceil(self.block_bytes)).unwrap_or(usize::MAX)
        } else {
            0
        }
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
