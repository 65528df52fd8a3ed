//! The resume anchor: a hybrid retention also keeps the snapshot its own turn resumed from.
//!
//! A hybrid model resumes only at a boundary that has a state snapshot, and the
//! prompt end is not always on the next turn's chain: a turn that rewrites the tail
//! of the previous prompt (a re-tokenised partial block, a stripped `<think>`, a
//! regenerated answer) diverges before it. Then the deepest boundary the next turn can
//! still resume from is an *older* one — and superseding drops it. The snapshot this
//! turn resumed from is exactly that boundary: it lies on this prompt's chain (the
//! request matched it), below the new prompt end, so any later turn that keeps this
//! turn's stable prefix passes through it. Keeping it costs one snapshot
//! (`state_bytes`); the KV up to it is already in the record's chain.
//!
//! Measured (docs/engine.md, "Hybrid models"): with a host tier the anchor is what lets
//! an offloaded conversation be resumed when its prompt end was rewritten; on the
//! device alone the extra pinned snapshot displaces what plain LRU keeps, so without
//! a host tier it is not pinned (it stays cached, unpinned, in LRU order).

use super::RetentionCache;
use crate::hash::BlockHash;
use crate::payload::StateSlot;

/// The boundary a retention of `chain` should keep beside its prompt end: the
/// snapshot its request resumed from (`resumed`), when it lies on `chain` strictly
/// before the prompt end and is not already kept.
pub(crate) fn anchor_of(
    resumed: Option<BlockHash>,
    chain: &[BlockHash],
    kept: &[(BlockHash, StateSlot)],
) -> Option<BlockHash> {
    let a = resumed?;
    let before_end = chain.split_last().map_or(&[][..], |(_, rest)| rest);
    (before_end.contains(&a) && !kept.iter().any(|(h, _)| *h == a)).then_some(a)
}

impl RetentionCache {
    /// Pins the resume anchor of a retention being made of `chain` into `states`
    /// (hybrid models with a host tier; see the module docs).
    pub(super) fn keep_anchor(
        &mut self,
        resumed: Option<BlockHash>,
        chain: &[BlockHash],
        states: &mut Vec<(BlockHash, StateSlot)>,
    ) {
        if !self.cfg.hybrid() || self.host.capacity() == 0 {
            return;
        }
        if let Some(a) = anchor_of(resumed, chain, states)
            && let Some(slot) = self.states.pin(a)
        {
            states.push((a, slot));
            self.stats.anchors += 1;
        }
    }
}
