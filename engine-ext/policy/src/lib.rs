//! tether engine extension: turn-boundary retention of KV blocks and linear state on a rank.
//!
//! An engine integration (or `tether-rank` in simulated mode) hashes each prompt into
//! vLLM-compatible chained block hashes ([`hash`]), parses the gateway's turn markers
//! ([`marker`]), and drives one [`cache::RetentionCache`] per rank through
//! `admit` → `finish_prefill` → `release`. The cache keeps each session's latest
//! prompt end pinned for an interval chosen by the turn kind, evicts in a fixed order
//! (free LRU blocks, expired retentions, least valuable retentions), moves retentions
//! to a host tier under pressure and restores them checksum-verified. Bytes move
//! through a [`payload::Mover`]; the KV-copy backends are the `tether-kvcopy`
//! crate. Pure Rust: no CUDA, no CLI. See `docs/engine.md`.

pub mod cache;
pub mod config;
pub mod fault;
pub mod gaps;
pub mod hash;
pub mod host;
pub mod ledger;
pub mod marker;
pub mod payload;
pub mod pool;
pub mod record;
pub mod rewrite;
pub mod states;
mod victims;

pub use cache::{
    Admission, CacheError, PrefetchSkip, Prefetched, RequestId, RestoreMiss, Retained,
    RetentionCache, Stats,
};
pub use config::{Millis, PolicyConfig};
pub use fault::Fault;
pub use gaps::ReturnGaps;
pub use hash::{BlockHash, BlockHasher, RequestKeys};
pub use host::HostUsage;
pub use ledger::{Ledger, LedgerStats, RetainPlan};
pub use marker::{MarkerError, RetentionKey, TurnKind, TurnMarker};
pub use payload::{MetadataOnly, Mover, Payload, SlotId, StateSlot};
pub use pool::KvEvent;
