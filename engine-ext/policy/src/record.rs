//! Retention records: what one (tenant, session, subagent) keeps pinned, and until when.

use crate::config::Millis;
use crate::hash::BlockHash;
use crate::marker::{RetentionKey, TurnKind};
use crate::payload::{SlotId, StateSlot};

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
    /// Logical bytes the record pins (blocks × block bytes + states × state bytes).
    pub bytes: u64,
    /// Hashes of the prompt's full blocks past the record's end (a hybrid retention
    /// ends at its snapshot's boundary): not held, kept to measure how much of the
    /// prompt the key's next request rewrites (`crate::rewrite`).
    pub past_end: Vec<BlockHash>,
}

impl RecordMeta {
    /// Eviction order among live records: least recently used first.
    ///
    /// Measured against value models that weight a record by its prefill cost per
    /// byte and by its turn kind's expected return time (a GreedyDual-style value
    /// with a shared decay): on the real Mooncake conversation trace and on the
    /// synthetic one, recency alone lost the least prefill — device-only retention
    /// within 0.1 % of plain LRU where the weighted value lost up to 16 % more, and
    /// with a host tier 2.3 M vs 3.8 M tokens re-prefilled (docs/engine.md, "Eviction
    /// order"). The turn kind acts through the interval (expired records go first),
    /// not through the order among live ones.
    pub fn priority(&self) -> Millis {
        self.last_use_ms
    }

    /// A hit: push the expiry out by the kind's interval from now.
    pub fn refresh(&mut self, now: Millis, interval_ms: Millis) {
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
    /// The block pool's LRU clock at its last use (creation or hit): the record is
    /// older than an unpinned block whose LRU entry tick is larger.
    pub lru_tick: u64,
    /// Brought back from the host tier by a prefetch and not hit since: counted used
    /// at its next hit, wasted if it leaves the device first.
    pub prefetched: bool,
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
