//! The traffic mix over time: per planning interval, the prefill work that
//! remains after the cache hits of the chosen routing and retention, the
//! decode work, and how bursty arrivals are.

use crate::report::Observation;
use serde::Serialize;

/// One request as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Work {
    /// Its index in the trace.
    pub request: u32,
    /// Arrival, ms.
    pub arrival_ms: f64,
    /// Prompt tokens.
    pub prompt: u32,
    /// Prompt tokens prefill must compute (prompt − expected cache hits).
    pub uncached: u32,
    /// Output tokens.
    pub output: u32,
}

impl Work {
    /// From a simulated (or replayed) request: its observed hits; `None` when
    /// it was not served.
    pub fn from_observation(o: &Observation) -> Option<Self> {
        let s = o.served()?;
        let prompt = u32::try_from(s.prompt_tokens).unwrap_or(u32::MAX);
        let hits = u32::try_from(s.cached_tokens).unwrap_or(u32::MAX);
        Some(Self {
            request: o.request,
            arrival_ms: o.sent_ms,
            prompt,
            uncached: prompt - hits.min(prompt),
            output: u32::try_from(s.output_tokens).unwrap_or(u32::MAX),
        })
    }

    /// The same request with cache reuse ignored (every prompt token computed):
    /// the demand a no-reuse planner provisions for.
    pub fn without_reuse(self) -> Self {
        Self {
            uncached: self.prompt,
            ..self
        }
    }
}

/// The demand of one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Interval {
    /// Start, ms.
    pub start_ms: f64,
    /// Length, ms.
    pub len_ms: f64,
    /// Requests arriving in it.
    pub requests: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens to compute.
    pub uncached_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Output-token-weighted mean context of the decoding sequences
    /// (prompt + half the output).
    pub decode_context: f64,
    /// Squared coefficient of variation of inter-arrival times (1 = Poisson).
    pub arrival_cv2: f64,
    /// Uncached prompt sizes of its requests (for prefill service times).
    #[serde(skip)]
    pub uncached: Vec<u32>,
    /// Cached prompt sizes of the same requests (their prefill attends over them).
    #[serde(skip)]
    pub cached: Vec<u32>,
}

/// Buckets `work` (any order) into intervals of `interval_ms` from `start_ms`
/// to the last arrival.
pub fn intervals(work: &[Work], start_ms: f64, interval_ms: f64) -> Vec<Interval> {
    let mut sorted: Vec<Work> = work.to_vec();
    sorted.sort_by(|a, b| a.arrival_ms.total_cmp(&b.arrival_ms));
    let last = sorted.last().map_or(start_ms, |w| w.arrival_ms);
    let n = (((last - start_ms) / interval_ms).floor() as usize + 1).max(1);
    let mut out: Vec<Interval> = (0..n)
        .map(|k| Interval {
            start_ms: start_ms + k as f64 * interval_ms,
            len_ms: interval_ms,
            ..Interval::default()
        })
        .collect();
    let mut ctx_weight = vec![0.0f64; n];
    let mut arrivals: Vec<Vec<f64>> = vec![Vec::new(); n];
    for w in &sorted {
        let k = (((w.arrival_ms - start_ms) / interval_ms).floor().max(0.0) as usize).min(n - 1);
        let i = &mut out[k];
        i.requests += 1;
        i.prompt_tokens += u64::from(w.prompt);
        i.uncached_tokens += u64::from(w.uncached);
        i.output_tokens += u64::from(w.output);
        i.uncached.push(w.uncached);
        i.cached.push(w.prompt - w.uncached.min(w.prompt));
        ctx_weight[k] += (f64::from(w.prompt) + f64::from(w.output) / 2.0) * f64::from(w.output);
        arrivals[k].push(w.arrival_ms);
    }
    for (k, i) in out.iter_mut().enumerate() {
        i.decode_context = if i.output_tokens > 0 {
            ctx_weight[k] / i.output_tokens as f64
        } else {
            0.0
        };
        i.arrival_cv2 = cv2(&arrivals[k]);
    }
    out
}

/// Squared coefficient of variation of the gaps between sorted times (1 with
/// fewer than three: no evidence against Poisson).
fn cv2(times: &[f64]) -> f64 {
    if times.len() < 3 {
        return 1.0;
    }
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    if mean <= 0.0 {
        return 1.0;
    }
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    var / (mean * mean)
}
