//! Return gaps: when a session comes back after a tool call or a handoff, estimated per turn kind.
//!
//! The prefetch rule (`docs/engine.md`, "Prefetch") needs to know how long after a
//! turn ends the session's next request arrives. Gaps are measured from the end of
//! the turn (its last output token) to the key's next arrival, and smoothed per turn
//! kind of the retained prompt end as TCP smooths round-trip times (RFC 6298): a
//! mean `m ← m + (g − m)/8` and a mean deviation `d ← d + (|g − m| − d)/4`, the
//! first gap setting `m = g`, `d = g/2`. A prefetch aims to have the state back by
//! the *early* return `m − 2d` (floored at 0): arriving early costs device room
//! nobody else wanted, arriving late saves nothing. Per kind, not per key: the
//! estimate stays bounded (four kinds) however many sessions a rank sees, and a
//! session's first gap already has one.

use crate::config::Millis;
use crate::marker::TurnKind;

/// Smoothed mean and mean deviation of one kind's gaps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Smoothed {
    mean: f64,
    dev: f64,
    samples: u64,
}

/// Observed return gaps per turn kind, and the early return they predict.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReturnGaps {
    by_kind: [Smoothed; 4],
}

fn slot(kind: TurnKind) -> usize {
    match kind {
        TurnKind::First => 0,
        TurnKind::User => 1,
        TurnKind::Tool => 2,
        TurnKind::Handoff => 3,
    }
}

impl ReturnGaps {
    /// Records that a session whose prompt end was of `kind` came back `gap_ms` after its turn ended.
    pub fn observe(&mut self, kind: TurnKind, gap_ms: Millis) {
        let g = gap_ms as f64;
        let s = &mut self.by_kind[slot(kind)];
        if s.samples == 0 {
            s.mean = g;
            s.dev = g / 2.0;
        } else {
            s.dev += ((g - s.mean).abs() - s.dev) / 4.0;
            s.mean += (g - s.mean) / 8.0;
        }
        s.samples += 1;
    }

    /// Gaps observed for `kind`.
    pub fn samples(&self, kind: TurnKind) -> u64 {
        self.by_kind[slot(kind)].samples
    }

    /// The smoothed mean gap of `kind`, once one has been observed.
    pub fn mean_ms(&self, kind: TurnKind) -> Option<Millis> {
        let s = self.by_kind[slot(kind)];
        (s.samples > 0).then(|| s.mean.round() as Millis)
    }

    /// When a session of `kind` is overdue: mean + 4 × deviation (RFC 6298's
    /// retransmission timeout); `None` before any gap of that kind was observed.
    /// One not back by then is, on the evidence, not coming back soon.
    pub fn overdue_ms(&self, kind: TurnKind) -> Option<Millis> {
        let s = self.by_kind[slot(kind)];
        (s.samples > 0).then(|| (s.mean + 4.0 * s.dev).round() as Millis)
    }

    /// The early return of `kind`: mean − 2 × deviation, at least 0; `None` before
    /// any gap of that kind was observed (no evidence, no prefetch).
    pub fn early_return_ms(&self, kind: TurnKind) -> Option<Millis> {
        let s = self.by_kind[slot(kind)];
        (s.samples > 0).then(|| (s.mean - 2.0 * s.dev).max(0.0).round() as Millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_observed_predicts_nothing() {
        let g = ReturnGaps::default();
        assert_eq!(g.early_return_ms(TurnKind::Tool), None);
        assert_eq!(g.mean_ms(TurnKind::Tool), None);
    }

    #[test]
    fn steady_gaps_converge_on_the_gap_and_kinds_stay_apart() {
        let mut g = ReturnGaps::default();
        for _ in 0..60 {
            g.observe(TurnKind::Tool, 4_000);
        }
        g.observe(TurnKind::Handoff, 30_000);
        assert_eq!(g.mean_ms(TurnKind::Tool), Some(4_000));
        // The deviation decays geometrically from 2 s: after 60 samples it is gone.
        assert_eq!(g.early_return_ms(TurnKind::Tool), Some(4_000));
        assert_eq!(g.samples(TurnKind::Tool), 60);
        // One sample: deviation g/2, so the early return is 0 (prefetch at once).
        assert_eq!(g.early_return_ms(TurnKind::Handoff), Some(0));
        assert_eq!(g.early_return_ms(TurnKind::User), None);
        assert_eq!(g.overdue_ms(TurnKind::Handoff), Some(90_000));
    }

    #[test]
    fn spread_gaps_pull_the_early_return_below_the_mean() {
        let mut g = ReturnGaps::default();
        for i in 0..200 {
            g.observe(TurnKind::Tool, if i % 2 == 0 { 2_000 } else { 10_000 });
        }
        let mean = g.mean_ms(TurnKind::Tool).expect("observed");
        let early = g.early_return_ms(TurnKind::Tool).expect("observed");
        assert!((5_000..=7_000).contains(&mean), "mean {mean}");
        assert!(
            early < 2_000,
            "early return {early} should lead the short gaps"
        );
    }
}
