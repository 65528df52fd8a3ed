//! The plot series kept in the report: the TTFT CDF and the hit ratio over
//! time, bucketed by send time.

use super::super::model::{Bucket, Series};
use super::super::observe::Observation;
use crate::quantile;

/// The series of a run whose served requests had `ttft` (ms).
pub(super) fn series(ttft: &[f64], observations: &[Observation]) -> Series {
    let sorted = quantile::sorted(ttft.to_vec());
    let ttft_cdf = if sorted.is_empty() {
        Vec::new()
    } else {
        (0..=100)
            .filter_map(|i| {
                let q = f64::from(i) / 100.0;
                quantile::nearest_rank(&sorted, q).map(|v| (v, q))
            })
            .collect()
    };
    let span_s = observations.iter().map(|o| o.sent_ms).fold(0.0, f64::max) / 1000.0;
    let bucket_s = (span_s / 60.0).ceil().max(1.0);
    let mut buckets: Vec<Bucket> = (0..=(span_s / bucket_s) as usize)
        .map(|i| Bucket {
            t_s: i as f64 * bucket_s,
            ..Default::default()
        })
        .collect();
    let last = buckets.len() - 1;
    for o in observations {
        if let Some(s) = o.served() {
            let i = ((o.sent_ms / 1000.0 / bucket_s) as usize).min(last);
            if let Some(b) = buckets.get_mut(i) {
                b.requests += 1;
                b.prompt_tokens += s.prompt_tokens;
                b.cached_tokens += s.cached_tokens.min(s.prompt_tokens);
            }
        }
    }
    Series {
        ttft_cdf,
        hit_over_time: buckets,
        bucket_s,
        session_hit_ratios: Vec::new(),
    }
}
