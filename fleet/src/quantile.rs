//! Quantiles and distribution summaries, the one implementation every report,
//! planner, trace summary and benchmark of tether uses.
//!
//! Two ways in, one definition:
//! - exact samples ([`nearest_rank`], [`Dist::of`]): the **nearest-rank**
//!   quantile — the ⌈q·n⌉-th smallest value (the first for q = 0), always a
//!   value of the sample, never interpolated;
//! - streams too long to keep (the simulator's millions of latencies, the
//!   engines' per-token gaps): an [`hdrhistogram`] of microseconds at 2
//!   significant digits ([`histogram`], [`record_ms`], [`Dist::of_us`]), whose
//!   `value_at_quantile` is the same nearest-rank quantile over 1 %-wide
//!   buckets (it reports the bucket's highest value, so a figure may sit up to
//!   1 % above the exact one).
//!
//! [`median`] is the one exception, kept for benchmark rounds: the mean of the
//! middle two values of an even count (the usual "median of N runs").

use serde::{Deserialize, Serialize};

/// The nearest-rank `q`-quantile of a sorted sample: its ⌈q·n⌉-th value;
/// `None` when it is empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    let rank = (q * n as f64).ceil() as usize;
    sorted.get(rank.clamp(1, n.max(1)) - 1).copied()
}

/// The finite values of `v`, sorted ascending.
pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v
}

/// The nearest-rank `q`-quantile of an unsorted sample (non-finite values
/// ignored); `None` when nothing is left.
pub fn of(v: &[f64], q: f64) -> Option<f64> {
    nearest_rank(&sorted(v.to_vec()), q)
}

/// The median of benchmark rounds: the middle value, or the mean of the middle
/// two for an even count (non-finite values ignored); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let v = sorted(values.to_vec());
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => v.get(mid).copied(),
        _ => Some((v.get(mid - 1)? + v.get(mid)?) / 2.0),
    }
}

/// A distribution's summary (milliseconds, tokens/s, …). Empty sample →
/// `count` 0, zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// Values summarized.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: f64,
}

impl Dist {
    /// Of an exact sample (nearest-rank quantiles); non-finite values are ignored.
    pub fn of(v: Vec<f64>) -> Self {
        let v = sorted(v);
        let at = |q| nearest_rank(&v, q).unwrap_or(0.0);
        if v.is_empty() {
            return Self::default();
        }
        Self {
            count: v.len() as u64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            max: at(1.0),
        }
    }

    /// Of a [`histogram`] of microseconds, in milliseconds.
    pub fn of_us(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |v: u64| v as f64 / 1000.0;
        Self {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            mean: h.mean() / 1000.0,
            max: ms(h.max()),
        }
    }
}

/// A new histogram of µs at 2 significant digits (1 % resolution).
pub fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new(2).unwrap_or_else(|_| unreachable!("2 digits is valid"))
}

/// Records `ms` into a µs histogram (negative or non-finite values as 0).
pub fn record_ms(h: &mut hdrhistogram::Histogram<u64>, ms: f64) {
    let us = if ms.is_finite() && ms > 0.0 {
        (ms * 1000.0).round() as u64
    } else {
        0
    };
    // Saturates at the histogram's auto-resized range; a failure would be a
    // value above u64, impossible from a finite f64 ms rounded to µs.
    let _ = h.record(us);
}

#[cfg(test)]
mod tests;
