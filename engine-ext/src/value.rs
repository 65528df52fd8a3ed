//! Value of a retained state: recompute cost saved per byte, over expected time to return.
//!
//! When memory runs out among live retentions, the policy gives up the one whose
//! bytes buy the least prefill per unit of time held:
//!
//! `value(now) = cost(tokens) / bytes / expected_gap × exp(−idle / idle_decay)`
//!
//! `cost(t) = t + t² / attention_knee` (prefill is superlinear), `expected_gap` is the
//! turn kind's prior averaged with the key's last observed gap, and `idle` is the time
//! since the last retain or hit. Every record decays at the same rate, so the order of
//! two records never changes while neither is touched: `ln value + now / idle_decay`
//! is a fixed [`priority`] per record (the GreedyDual idea), and the least valuable
//! record is the first of an ordered index — O(log n) per decision, not a scan.

use crate::config::{Millis, PolicyConfig};

/// Prefill cost of recomputing `tokens` of prefix, in token-equivalents (linear + attention term).
pub fn prefill_cost(cfg: &PolicyConfig, tokens: u64) -> f64 {
    let t = tokens as f64;
    t + t * t / cfg.attention_knee_tokens as f64
}

/// Folds an observed gap into the expected gap (EWMA, weight 1/2 on the new gap).
pub fn update_gap(expected_ms: Millis, observed_ms: Millis) -> Millis {
    expected_ms / 2 + observed_ms / 2
}

/// Value at `now` of a record last used at `last_use_ms`; higher is kept longer.
pub fn value(
    cfg: &PolicyConfig,
    tokens: u64,
    bytes: u64,
    expected_gap_ms: Millis,
    idle_ms: Millis,
) -> f64 {
    let base = prefill_cost(cfg, tokens) / bytes.max(1) as f64 / expected_gap_ms.max(1) as f64;
    base * (-(idle_ms as f64) / cfg.idle_decay_ms.max(1) as f64).exp()
}

/// Time-invariant eviction priority: `ln value(now) + now / idle_decay`, the same for
/// every `now`; lower is evicted first.
pub fn priority(
    cfg: &PolicyConfig,
    tokens: u64,
    bytes: u64,
    expected_gap_ms: Millis,
    last_use_ms: Millis,
) -> f64 {
    let base = prefill_cost(cfg, tokens).max(f64::MIN_POSITIVE)
        / bytes.max(1) as f64
        / expected_gap_ms.max(1) as f64;
    base.ln() + last_use_ms as f64 / cfg.idle_decay_ms.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_prefixes_per_byte_and_sooner_returns_are_worth_more() {
        let c = PolicyConfig::default();
        assert!(value(&c, 20_000, 1_000, 10_000, 0) > value(&c, 10_000, 1_000, 10_000, 0));
        // Superlinear prefill: the same bytes per token holding a longer prefix are worth more.
        assert!(value(&c, 64_000, 64, 1_000, 0) > value(&c, 1_000, 1, 1_000, 0));
        assert!(value(&c, 10_000, 1_000, 5_000, 0) > value(&c, 10_000, 1_000, 50_000, 0));
        // The longer a session stays away the less it is worth.
        assert!(value(&c, 10_000, 1_000, 5_000, 20_000) < value(&c, 10_000, 1_000, 5_000, 4_000));
        assert_eq!(update_gap(10_000, 2_000), 6_000);
    }

    #[test]
    fn priority_orders_records_like_value_at_any_time() {
        let c = PolicyConfig::default();
        let recs = [
            (5_000u64, 300u64, 15_000u64, 1_000u64),
            (40_000, 2_500, 120_000, 90_000),
            (900, 60, 60_000, 200_000),
        ];
        for now in [200_000u64, 400_000, 2_000_000] {
            for a in recs {
                for b in recs {
                    let va = value(&c, a.0, a.1, a.2, now - a.3);
                    let vb = value(&c, b.0, b.1, b.2, now - b.3);
                    let (pa, pb) = (
                        priority(&c, a.0, a.1, a.2, a.3),
                        priority(&c, b.0, b.1, b.2, b.3),
                    );
                    if (va - vb).abs() > 1e-12 * va.max(vb) {
                        assert_eq!(va < vb, pa < pb, "now {now}: {a:?} vs {b:?}");
                    }
                }
            }
        }
    }
}
