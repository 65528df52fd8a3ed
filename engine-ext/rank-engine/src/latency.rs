//! The latency model: how long one engine step, one prefill chunk and one host
//! restore take, computed from a [`Profile`]. Pure arithmetic, no clock.
//!
//! - **Prefill** of a request with `n` uncached tokens on top of `c` cached
//!   ones (device hits, restored blocks, KV received) takes
//!   `max(ttft(n), ttft(c + n) − ttft(c))`: the cached tokens are not
//!   recomputed, but the new ones still attend over them, and the part of the
//!   profile's `ttft` curve that grows faster than linearly *is* that attention
//!   — so the marginal cost of the last `n` tokens of a `c + n` prompt is the
//!   profile's own attention term (3 k new tokens on 27 k cached ≈ 1.5× a cold
//!   3 k prefill on the shipped Llama profile). `ttft(n)` bounds it below (the
//!   step's fixed cost). Chunked prefill splits that time in proportion to the
//!   tokens of each chunk, so a request prefilled alone in one chunk takes
//!   exactly its prefill time, and in several chunks the same total. Below the
//!   first profile point the time scales in proportion to `n` (no fixed
//!   overhead is charged twice when short prefills ride in a decode step).
//! - **Decode**: one step over `b` sequences of mean context `c` takes
//!   `itl(b, c)` from the profile's decode surface.
//! - **Mixed step** (decodes and prefill chunks in one batch): the sum of the
//!   decode step time and the chunks' prefill times — prefill is compute-bound,
//!   decode memory-bound, and an engine step runs both kernels in sequence.
//! - **Restore**: `bytes / host_restore_gbps`, on a host link the engine
//!   serializes (see the engine module); it delays the restoring request's
//!   prefill, not the batch.

use crate::profile::Profile;

/// Smallest step the model ever returns, in ms, so simulated time always advances.
pub const MIN_STEP_MS: f64 = 1e-3;

/// Step and transfer times of one engine, from its profile.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyModel {
    profile: Profile,
}

/// What one engine step computes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// Sequences decoding one token each.
    pub decodes: usize,
    /// Mean context (prompt + generated tokens) of the decoding sequences.
    pub mean_context: f64,
    /// Prefill time of the chunks in the step, already summed ([`LatencyModel::chunk_ms`]).
    pub prefill_ms: f64,
}

impl LatencyModel {
    /// A model over `profile`.
    pub fn new(profile: Profile) -> Self {
        Self { profile }
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Prefill rate in tokens/s of a step prefilling `tokens` uncached tokens
    /// (0 for none, or a profile that charges nothing for them).
    pub fn prefill_tokens_per_s(&self, tokens: usize) -> f64 {
        let ms = self.prefill_ms(tokens);
        if tokens == 0 || !(ms.is_finite() && ms > 0.0) {
            return 0.0;
        }
        tokens as f64 / ms * 1e3
    }

    /// Prefill time in ms of a lone request with `uncached` tokens to compute
    /// and nothing cached.
    pub fn prefill_ms(&self, uncached: usize) -> f64 {
        if uncached == 0 {
            return 0.0;
        }
        let n = uncached as f64;
        let curve = &self.profile.prefill_ttft_ms;
        let (x0, y0) = curve.points()[0];
        if n < x0 { y0 * n / x0 } else { curve.at(n) }
    }

    /// Prefill time in ms of a lone request with `uncached` tokens to compute
    /// after `cached` tokens it already holds: the new tokens attend over the
    /// cached ones (module docs).
    pub fn prefill_after_ms(&self, uncached: usize, cached: usize) -> f64 {
        let cold = self.prefill_ms(uncached);
        if cached == 0 || uncached == 0 {
            return cold;
        }
        let marginal = self.prefill_ms(cached + uncached) - self.prefill_ms(cached);
        cold.max(marginal)
    }

    /// Time in ms of a prefill chunk of `chunk` tokens of a request whose
    /// uncached prompt is `total` tokens on top of `cached` ones: its share of
    /// `prefill_after_ms(total, cached)`.
    pub fn chunk_ms(&self, chunk: usize, total: usize, cached: usize) -> f64 {
        if chunk == 0 || total == 0 {
            return 0.0;
        }
        self.prefill_after_ms(total, cached) * chunk as f64 / total as f64
    }

    /// Decode inter-token latency in ms for `batch` sequences of mean context `context`.
    pub fn decode_ms(&self, batch: usize, context: f64) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        self.profile.decode_itl_ms.itl_ms(batch as f64, context)
    }

    /// Duration in ms of one engine step.
    pub fn step_ms(&self, s: &StepShape) -> f64 {
        (self.decode_ms(s.decodes, s.mean_context) + s.prefill_ms).max(MIN_STEP_MS)
    }

    /// Durations of decode-only steps of `batch` sequences, by mean context:
    /// the same values as [`LatencyModel::step_ms`] with no prefill, the batch
    /// interpolation done once.
    pub fn decode_steps(&self, batch: usize) -> DecodeSteps {
        DecodeSteps {
            curve: (batch > 0).then(|| self.profile.decode_itl_ms.at_batch(batch as f64)),
        }
    }

    /// Host → device transfer time in ms of `bytes`.
    pub fn restore_ms(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.profile.host_restore_gbps * 1e6)
    }
}

/// Decode-only step times at one batch size ([`LatencyModel::decode_steps`]).
#[derive(Debug, Clone)]
pub struct DecodeSteps {
    curve: Option<crate::profile::BatchCurve>,
}

impl DecodeSteps {
    /// Duration in ms of a decode-only step at mean context `context`.
    pub fn step_ms(&self, context: f64) -> f64 {
        (self.curve.as_ref().map_or(0.0, |c| c.itl_ms(context)) + 0.0).max(MIN_STEP_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::test_profile;

    fn profile() -> Profile {
        test_profile(
            &[(1000.0, 10.0), (3000.0, 40.0)],
            &[
                (1000.0, &[(1.0, 4.0), (101.0, 8.0)]),
                (3000.0, &[(1.0, 5.0), (101.0, 14.0)]),
            ],
            1 << 17,
            50.0,
        )
    }

    #[test]
    fn prefill_follows_the_curve_and_scales_below_it() {
        let m = LatencyModel::new(profile());
        assert_eq!(m.prefill_ms(0), 0.0);
        assert_eq!(m.prefill_ms(500), 5.0);
        assert_eq!(m.prefill_ms(1000), 10.0);
        assert_eq!(m.prefill_ms(2000), 25.0);
        // Extended beyond the last point along the last segment.
        assert_eq!(m.prefill_ms(5000), 70.0);
        // Chunks add up to the whole.
        let whole = m.prefill_ms(3000);
        let parts = m.chunk_ms(1000, 3000, 0) + m.chunk_ms(2000, 3000, 0);
        assert!((whole - parts).abs() < 1e-9);
    }

    #[test]
    fn new_tokens_attend_over_the_cached_context() {
        let m = LatencyModel::new(profile());
        // Nothing cached: the cold prefill.
        assert_eq!(m.prefill_after_ms(1000, 0), m.prefill_ms(1000));
        // 1000 new tokens after 2000 cached: ttft(3000) − ttft(2000) = 40 − 25.
        assert_eq!(m.prefill_after_ms(1000, 2000), 15.0);
        assert!(m.prefill_after_ms(1000, 2000) > m.prefill_ms(1000));
        // Never below the cold prefill of the same tokens (its fixed cost).
        assert_eq!(m.prefill_after_ms(500, 100), m.prefill_ms(500));
        // Chunks of a request with a cached context add up to its prefill.
        let parts = m.chunk_ms(400, 1000, 2000) + m.chunk_ms(600, 1000, 2000);
        assert!((parts - 15.0).abs() < 1e-9);
    }

    #[test]
    fn decode_interpolates_in_batch_and_context() {
        let m = LatencyModel::new(profile());
        assert_eq!(m.decode_ms(0, 1000.0), 0.0);
        assert_eq!(m.decode_ms(1, 1000.0), 4.0);
        assert_eq!(m.decode_ms(51, 1000.0), 6.0);
        assert_eq!(m.decode_ms(51, 3000.0), 9.5);
        assert_eq!(m.decode_ms(51, 2000.0), 7.75);
        // More load, longer steps.
        assert!(m.decode_ms(200, 3000.0) > m.decode_ms(100, 3000.0));
        assert!(m.decode_ms(50, 8000.0) > m.decode_ms(50, 3000.0));
        let mixed = m.step_ms(&StepShape {
            decodes: 51,
            mean_context: 1000.0,
            prefill_ms: 3.0,
        });
        assert_eq!(mixed, 9.0);
        assert_eq!(m.step_ms(&StepShape::default()), MIN_STEP_MS);
    }

    #[test]
    fn decode_steps_at_a_batch_equal_single_steps() {
        let m = LatencyModel::new(profile());
        for b in [1usize, 7, 51, 300] {
            let fast = m.decode_steps(b);
            for c in [10.0, 999.5, 1000.0, 1777.25, 3000.0, 9000.0] {
                let slow = m.step_ms(&StepShape {
                    decodes: b,
                    mean_context: c,
                    prefill_ms: 0.0,
                });
                assert_eq!(fast.step_ms(c).to_bits(), slow.to_bits(), "b {b} c {c}");
            }
        }
    }

    #[test]
    fn restore_is_bytes_over_bandwidth() {
        let m = LatencyModel::new(profile());
        // 50 GB/s: 1 GB in 20 ms.
        assert!((m.restore_ms(1_000_000_000) - 20.0).abs() < 1e-9);
    }
}
