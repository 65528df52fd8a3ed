//! The polled load view of load-aware pick: per endpoint (decode endpoints,
//! then prefill endpoints), the requests in flight and the queued prefill
//! tokens of its last `/load` report and when that came. Pure: parsing a
//! reply, ageing samples out, and the byte encoding the glue keeps in
//! proxy-wasm shared data so every worker of one Envoy sees one view.

use tether_placement::load::report::LoadReport;
use tether_placement::residency::Summary;

/// Largest `/load` reply parsed; longer replies are bad replies. Fits a
/// residency summary of [`tether_placement::residency::MAX_ENTRIES`] (410 KB)
/// beside the per-DP-rank loads of a large process.
pub const MAX_REPLY_BYTES: usize = 1024 * 1024;

/// One endpoint's last report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// `server_load`: running + waiting over all DP ranks.
    pub requests: f64,
    /// Queued prefill tokens over all DP ranks.
    pub prefill_tokens: f64,
    /// Busy share, the mean over its DP ranks (0–1; 0 when the report has
    /// none: `tether_placement::busy`).
    pub busy: f64,
    /// Prefill rate over its DP ranks, tokens/s (0: not reported, or not by
    /// every DP rank).
    pub prefill_tokens_per_s: f64,
    /// When the reply arrived (host clock, ms since the epoch).
    pub at_ms: u64,
}

/// Why a `/load` reply was not used (counted, logged, never a panic).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReply {
    #[error("status {0:?} (want 200)")]
    Status(Option<String>),
    #[error("body of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("not a load report: {0}")]
    Parse(String),
}

impl Sample {
    /// Reads a `/load` reply (`tether_placement::load::report::LoadReport`).
    pub fn from_reply(status: Option<&str>, body: &[u8], at_ms: u64) -> Result<Self, BadReply> {
        Self::with_residency(status, body, at_ms).map(|(s, _)| s)
    }

    /// Reads a `/load` reply and its residency summary, when it has one
    /// (not yet checked: [`tether_placement::Resident::decode`]).
    pub fn with_residency(
        status: Option<&str>,
        body: &[u8],
        at_ms: u64,
    ) -> Result<(Self, Option<Summary>), BadReply> {
        if status != Some("200") {
            return Err(BadReply::Status(
                status.map(|s| s.chars().take(8).collect()),
            ));
        }
        if body.len() > MAX_REPLY_BYTES {
            return Err(BadReply::TooLarge(body.len()));
        }
        let r: LoadReport = serde_json::from_slice(body).map_err(|e| {
            let mut m = e.to_string();
            m.truncate(120);
            BadReply::Parse(m)
        })?;
        let s = Self {
            requests: r.server_load as f64,
            prefill_tokens: r.queued_prefill_tokens() as f64,
            busy: r.busy(),
            prefill_tokens_per_s: r.prefill_tokens_per_s().unwrap_or(0.0),
            at_ms,
        };
        Ok((s, r.residency))
    }
}

/// How a range of the view reads ([`LoadView::freshness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// No sample within `max_age_ms`: no view (every value reads 0).
    NoView,
    /// Some sample fresh and none stale (an endpoint never sampled reads 0).
    Fresh,
    /// Some sample fresh and some older than `max_age_ms`: the stale ones
    /// keep their last report.
    Holds,
}

/// Per endpoint, its last sample, if any.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadView {
    samples: Vec<Option<Sample>>,
}

/// Bytes per endpoint in the encoding: flag, requests, prefill tokens, busy
/// share, prefill rate, time.
const REC: usize = 1 + 8 + 8 + 8 + 8 + 8;

impl LoadView {
    /// A view of no endpoints.
    pub const EMPTY: LoadView = LoadView {
        samples: Vec::new(),
    };

    /// A view of `n` endpoints with no samples.
    pub fn new(n: usize) -> Self {
        Self {
            samples: vec![None; n],
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Records endpoint `i`'s sample unless an equally new one is there.
    pub fn record(&mut self, i: usize, s: Sample) {
        if let Some(slot) = self.samples.get_mut(i)
            && slot.is_none_or(|old| old.at_ms <= s.at_ms)
        {
            *slot = Some(s);
        }
    }

    /// Whether any endpoint in `range` has a sample no older than `max_age_ms`.
    pub fn any_fresh(&self, range: std::ops::Range<usize>, now_ms: u64, max_age_ms: u64) -> bool {
        self.samples
            .get(range)
            .is_some_and(|s| s.iter().any(|s| fresh(s, now_ms, max_age_ms).is_some()))
    }

    /// How the samples of `range` read at `now_ms`, in one pass.
    pub fn freshness(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
    ) -> Freshness {
        let (mut any_fresh, mut any_stale) = (false, false);
        for s in self.samples.get(range).unwrap_or_default() {
            match (s, fresh(s, now_ms, max_age_ms)) {
                (_, Some(_)) => any_fresh = true,
                (Some(_), None) => any_stale = true,
                (None, None) => {}
            }
        }
        match (any_fresh, any_stale) {
            (false, _) => Freshness::NoView,
            (true, false) => Freshness::Fresh,
            (true, true) => Freshness::Holds,
        }
    }

    /// Whether the view of `range` is live (some sample fresh) and holds some
    /// endpoint's sample older than `max_age_ms`: that endpoint's polls are
    /// failing or late, and [`Self::requests`] reads its last report.
    pub fn holds_stale(&self, range: std::ops::Range<usize>, now_ms: u64, max_age_ms: u64) -> bool {
        self.freshness(range, now_ms, max_age_ms) == Freshness::Holds
    }

    /// Requests in flight of the endpoints in `range`. With no fresh sample
    /// in `range` there is no view: all 0 (unknown load never pushes a key
    /// away). Otherwise each endpoint reads its last report, however old: the
    /// endpoint whose `/load` stops answering in time is most often the
    /// busiest, and reading it as idle would send it more keys. One never
    /// sampled reads 0.
    pub fn requests(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
    ) -> Vec<f64> {
        self.values(range, now_ms, max_age_ms, |s| s.requests)
    }

    /// How long each endpoint's prefill backlog in `range` would hold a new
    /// prefill back, ms: `wait(queued tokens, its reported rate)` (0 when it
    /// reports none, which `wait` reads as unknown, as
    /// [`tether_placement::MoveCost::wait_ms`] does), read as
    /// [`Self::requests`] reads requests.
    pub fn prefill_waits_ms(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
        wait: impl Fn(f64, Option<f64>) -> f64,
    ) -> Vec<f64> {
        self.values(range, now_ms, max_age_ms, |s| {
            wait(s.prefill_tokens, Some(s.prefill_tokens_per_s))
        })
    }

    /// Residency placement's load of the endpoints in `range`: requests in
    /// flight plus `busy_weight` × the busy share
    /// ([`tether_placement::resident_load`]), read as [`Self::requests`]
    /// reads requests.
    pub fn resident_loads(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
        busy_weight: f64,
    ) -> Vec<f64> {
        self.values(range, now_ms, max_age_ms, |s| {
            tether_placement::resident_load(s.requests, s.busy, busy_weight)
        })
    }

    fn values(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
        f: impl Fn(&Sample) -> f64,
    ) -> Vec<f64> {
        let live = self.any_fresh(range.clone(), now_ms, max_age_ms);
        range
            .map(|i| {
                self.samples
                    .get(i)
                    .and_then(Option::as_ref)
                    .filter(|_| live)
                    .map_or(0.0, &f)
            })
            .collect()
    }

    /// Little-endian bytes: per endpoint a presence flag, requests, prefill
    /// tokens, busy share and prefill rate (f64 bits), arrival ms (u64).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.samples.len() * REC);
        for s in &self.samples {
            let s_ = s.unwrap_or(Sample {
                requests: 0.0,
                prefill_tokens: 0.0,
                busy: 0.0,
                prefill_tokens_per_s: 0.0,
                at_ms: 0,
            });
            out.push(u8::from(s.is_some()));
            out.extend_from_slice(&s_.requests.to_le_bytes());
            out.extend_from_slice(&s_.prefill_tokens.to_le_bytes());
            out.extend_from_slice(&s_.busy.to_le_bytes());
            out.extend_from_slice(&s_.prefill_tokens_per_s.to_le_bytes());
            out.extend_from_slice(&s_.at_ms.to_le_bytes());
        }
        out
    }

    /// The view of `n` endpoints from [`LoadView::encode`]'s bytes; `None` when
    /// they are not `n` records (another configuration wrote them).
    pub fn decode(bytes: &[u8], n: usize) -> Option<Self> {
        if bytes.len() != n.checked_mul(REC)? {
            return None;
        }
        let samples = bytes
            .chunks_exact(REC)
            .map(|r| {
                let (flag, rest) = r.split_first()?;
                let word =
                    |k: usize| -> Option<[u8; 8]> { rest.get(k * 8..k * 8 + 8)?.try_into().ok() };
                let s = Sample {
                    requests: f64::from_le_bytes(word(0)?),
                    prefill_tokens: f64::from_le_bytes(word(1)?),
                    busy: f64::from_le_bytes(word(2)?),
                    prefill_tokens_per_s: f64::from_le_bytes(word(3)?),
                    at_ms: u64::from_le_bytes(word(4)?),
                };
                let ok = [s.requests, s.prefill_tokens, s.busy, s.prefill_tokens_per_s]
                    .iter()
                    .all(|v| v.is_finite());
                Some((*flag == 1 && ok).then_some(s))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self { samples })
    }
}

fn fresh(s: &Option<Sample>, now_ms: u64, max_age_ms: u64) -> Option<&Sample> {
    s.as_ref()
        .filter(|s| now_ms.saturating_sub(s.at_ms) <= max_age_ms)
}

#[cfg(test)]
mod tests;

/// Whether this VM should poll now: the last poll any worker claimed (its
/// time in shared data) is at least most of a period old. Every worker's
/// root context ticks; the first to claim a period by compare-and-swap polls.
pub fn due(last_poll_ms: Option<u64>, now_ms: u64, poll_ms: u64) -> bool {
    last_poll_ms.is_none_or(|last| now_ms.saturating_sub(last) >= poll_ms - poll_ms / 4)
}
