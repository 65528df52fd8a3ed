//! Retention records: what one (tenant, session, subagent) keeps pinned, until when, and what it is worth.

use crate::config::{Millis, PolicyConfig};
use crate::hash::BlockHash;
use crate::marker::{RetentionKey, TurnKind};
use crate::payload::{SlotId, StateSlot};
use crate::value;

/// The bookkeeping shared by a record on either tier.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordMeta {
    /// Owner.
    pub key: RetentionKey,
    /// Kind of the wait after this prompt end.
    pub kind: TurnKind,
    /// Tokens of prefix the record lets the next turn skip (full blocks only).
    pub tokens: u64,
    /// When the prompt end was retained.
    pub created_ms: Millis,
    /// Last retain or hit.
    pub last_use_ms: Millis,
    /// End of the retention interval; afterwards the record is evictable before live ones.
    pub expires_ms: Millis,
    /// Expected time until the key's next turn (kind prior, then the key's observed gaps).
    pub expected_gap_ms: Millis,
    /// Logical bytes the record pins (blocks × block bytes + states × state bytes).
    pub bytes: u64,
    /// Time from this prompt end to the key's next turn, once that turn arrived.
    pub observed_gap_ms: Option<Millis>,
}

impl RecordMeta {
    /// True once the interval has run out.
    pub fn expired(&self, now: Millis) -> bool {
        now >= self.expires_ms
    }

    /// Eviction value: higher is kept longer (see [`crate::value`]).
    pub fn value(&self, cfg: &PolicyConfig, now: Millis) -> f64 {
        value::value(
            cfg,
            self.tokens,
            self.bytes,
            self.expected_gap_ms,
            now.saturating_sub(self.last_use_ms),
        )
    }

    /// Eviction priority (time-invariant; see [`value::priority`]).
    pub fn priority(&self, cfg: &PolicyConfig) -> f64 {
        value::priority(
            cfg,
            self.tokens,
            self.bytes,
            self.expected_gap_ms,
            self.last_use_ms,
        )
    }

    /// A hit: push the expiry out by the kind's interval from now.
    pub fn refresh(&mut self, now: Millis, interval_ms: Millis) {
        if self.observed_gap_ms.is_none() {
            self.observed_gap_ms = Some(now.saturating_sub(self.created_ms));
        }
        self.last_use_ms = now;
        self.expires_ms = self.expires_ms.max(now.saturating_add(interval_ms));
    }
}

/// A retention living on the device: pins its whole chain and its state snapshots.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceRecord {
    /// Bookkeeping.
    pub meta: RecordMeta,
    /// Cached slots of the prompt's full blocks, root first (each retained once).
    pub chain: Vec<SlotId>,
    /// Hashes of the same blocks.
    pub hashes: Vec<BlockHash>,
    /// Linear-state snapshots: (boundary block hash, device slot), prompt end first.
    pub states: Vec<(BlockHash, StateSlot)>,
    /// The interval, kept to refresh by on a hit.
    pub interval_ms: Millis,
}

/// A retention living on the host tier: the blocks and states are host payloads.
#[derive(Clone, Debug, PartialEq)]
pub struct HostRecord {
    /// Bookkeeping.
    pub meta: RecordMeta,
    /// Hashes of the prompt's full blocks, root first.
    pub hashes: Vec<BlockHash>,
    /// Boundary hashes of the state snapshots, prompt end first.
    pub states: Vec<BlockHash>,
    /// The interval, kept to refresh by on a hit.
    pub interval_ms: Millis,
}
