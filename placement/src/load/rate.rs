//! A rank's prefill rate measured on its own steps (the `/load` report's
//! `prefill_tokens_per_s` from an engine that has no profile to read it from:
//! `TetherConnector`). The router turns a rank's queued prefill tokens into a
//! wait with it, so it should be what the rank does, not a configured guess.
//!
//! A step that scheduled `tokens` new prompt tokens at `t0` ran until the next
//! step was scheduled at `t1`: one sample `tokens / (t1 - t0)`. Steps that
//! also decode count whole, so the figure is how fast this rank drains a
//! backlog under its real mix, which is the wait a turn queued there sees.
//! The samples are averaged with weight [`RATE_WEIGHT`] on the newest.

/// Fewest new prompt tokens a step must schedule to be a sample: a step of a
/// few tokens is all fixed cost and would read as a slow rank.
pub const RATE_MIN_TOKENS: u64 = 256;

/// A gap between two steps longer than this, ms, is not a step's duration
/// (the engine idled, or was stopped) and is not a sample.
pub const RATE_MAX_STEP_MS: f64 = 2_000.0;

/// Weight of the newest sample in the average.
pub const RATE_WEIGHT: f64 = 0.2;

/// The measured rate: fed each scheduled step's new prompt tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefillRate {
    /// The previous step: when it was scheduled (ms) and its prompt tokens.
    last: Option<(f64, u64)>,
    /// Tokens/s; 0 until a sample.
    rate: f64,
}

impl PrefillRate {
    /// A step was scheduled at `now_ms` (a monotonic clock) with
    /// `prompt_tokens` new prompt tokens to compute. A time that is not
    /// finite or goes back is ignored.
    pub fn step(&mut self, now_ms: f64, prompt_tokens: u64) {
        if !now_ms.is_finite() {
            return;
        }
        if let Some((t0, tokens)) = self.last {
            if now_ms < t0 {
                return;
            }
            let gap = now_ms - t0;
            if tokens >= RATE_MIN_TOKENS && gap > 0.0 && gap <= RATE_MAX_STEP_MS {
                let sample = tokens as f64 / gap * 1e3;
                self.rate = if self.rate > 0.0 {
                    self.rate + RATE_WEIGHT * (sample - self.rate)
                } else {
                    sample
                };
            }
        }
        self.last = Some((now_ms, prompt_tokens));
    }

    /// Tokens/s; 0 until a step has been measured.
    pub fn tokens_per_s(&self) -> f64 {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_its_tokens_over_the_time_to_the_next_step() {
        let mut r = PrefillRate::default();
        r.step(0.0, 8192);
        assert_eq!(r.tokens_per_s(), 0.0, "one step is no sample yet");
        r.step(100.0, 8192);
        assert!((r.tokens_per_s() - 81_920.0).abs() < 1e-6);
        // A slower step moves the average part of the way.
        r.step(300.0, 0);
        let expected = 81_920.0 + RATE_WEIGHT * (40_960.0 - 81_920.0);
        assert!((r.tokens_per_s() - expected).abs() < 1e-6);
    }

    #[test]
    fn decode_steps_idle_gaps_and_bad_clocks_are_not_samples() {
        let mut r = PrefillRate::default();
        r.step(0.0, 8192);
        r.step(50.0, 10); // a decode step follows
        let rate = r.tokens_per_s();
        assert!((rate - 163_840.0).abs() < 1e-6);
        r.step(60.0, 4096); // the decode step (10 tokens) was no sample
        assert_eq!(r.tokens_per_s(), rate);
        r.step(60.0 + RATE_MAX_STEP_MS + 1.0, 0); // idle after the 4096-token step
        assert_eq!(r.tokens_per_s(), rate);
        for bad in [f64::NAN, f64::INFINITY, 10.0] {
            r.step(bad, 4096); // not finite, or back in time
            assert_eq!(r.tokens_per_s(), rate, "{bad}");
        }
        r.step(6000.0, 4096);
        r.step(6000.0, 4096); // no time between: no sample
        assert_eq!(r.tokens_per_s(), rate);
    }
}
