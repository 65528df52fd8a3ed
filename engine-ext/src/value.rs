//! Value of a retained state: recompute cost saved per byte, over expected time to return.
//!
//! When memory runs out among live retentions, the policy gives up the one whose
//! bytes buy the least prefill per unit of time held. The expected return time starts
//! from the turn kind's prior, then follows the key's own observed gaps (an EWMA), and
//! once a session has stayed away longer than expected, the time already waited
//! becomes the estimate (a Lindy rule: the longer gone, the less likely soon back).

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

/// Value per byte per millisecond of expected wait; higher is kept longer.
pub fn value(
    cfg: &PolicyConfig,
    tokens: u64,
    bytes: u64,
    expected_gap_ms: Millis,
    idle_ms: Millis,
) -> f64 {
    let wait = expected_gap_ms.max(idle_ms).max(1) as f64;
    prefill_cost(cfg, tokens) / bytes.max(1) as f64 / wait
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_prefixes_per_byte_and_sooner_returns_are_worth_more() {
        let c = PolicyConfig::default();
        assert!(value(&c, 20_000, 1_000, 10_000, 0) > value(&c, 10_000, 1_000, 10_000, 0));
        // Superlinear prefill: the same bytes holding a longer prefix are worth more per byte.
        assert!(value(&c, 64_000, 64, 1_000, 0) > value(&c, 1_000, 1, 1_000, 0));
        assert!(value(&c, 10_000, 1_000, 5_000, 0) > value(&c, 10_000, 1_000, 50_000, 0));
        // Past its expected gap, the longer a session stays away the less it is worth.
        assert!(value(&c, 10_000, 1_000, 5_000, 20_000) < value(&c, 10_000, 1_000, 5_000, 4_000));
        assert_eq!(update_gap(10_000, 2_000), 6_000);
    }
}
