//! The polled load view of load-aware pick: per endpoint (decode endpoints,
//! then prefill endpoints), the requests in flight and the queued prefill
//! tokens of its last `/load` report and when that came. Pure: parsing a
//! reply, ageing samples out, and the byte encoding the glue keeps in
//! proxy-wasm shared data so every worker of one Envoy sees one view.

use tether_placement::load::report::LoadReport;

/// Largest `/load` reply parsed; longer replies are bad replies.
pub const MAX_REPLY_BYTES: usize = 256 * 1024;

/// One endpoint's last report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// `server_load`: running + waiting over all DP ranks.
    pub requests: f64,
    /// Queued prefill tokens over all DP ranks.
    pub prefill_tokens: f64,
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
        Ok(Self {
            requests: r.server_load as f64,
            prefill_tokens: r.queued_prefill_tokens() as f64,
            at_ms,
        })
    }
}

/// Per endpoint, its last sample, if any.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadView {
    samples: Vec<Option<Sample>>,
}

/// Bytes per endpoint in the encoding: flag, requests, prefill tokens, time.
const REC: usize = 1 + 8 + 8 + 8;

impl LoadView {
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

    /// Requests in flight of the endpoints in `range`; a missing or stale
    /// sample counts as 0 (unknown load never pushes a key away).
    pub fn requests(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
    ) -> Vec<f64> {
        self.values(range, now_ms, max_age_ms, |s| s.requests)
    }

    /// Queued prefill tokens of the endpoints in `range` (0 when unknown or stale).
    pub fn prefill_tokens(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
    ) -> Vec<f64> {
        self.values(range, now_ms, max_age_ms, |s| s.prefill_tokens)
    }

    fn values(
        &self,
        range: std::ops::Range<usize>,
        now_ms: u64,
        max_age_ms: u64,
        f: impl Fn(&Sample) -> f64,
    ) -> Vec<f64> {
        range
            .map(|i| {
                self.samples
                    .get(i)
                    .and_then(|s| fresh(s, now_ms, max_age_ms))
                    .map_or(0.0, &f)
            })
            .collect()
    }

    /// Little-endian bytes: per endpoint a presence flag, requests and prefill
    /// tokens (f64 bits), arrival ms (u64).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.samples.len() * REC);
        for s in &self.samples {
            let s_ = s.unwrap_or(Sample {
                requests: 0.0,
                prefill_tokens: 0.0,
                at_ms: 0,
            });
            out.push(u8::from(s.is_some()));
            out.extend_from_slice(&s_.requests.to_le_bytes());
            out.extend_from_slice(&s_.prefill_tokens.to_le_bytes());
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
                    at_ms: u64::from_le_bytes(word(2)?),
                };
                let ok = s.requests.is_finite() && s.prefill_tokens.is_finite();
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

/// The `load` configuration: load-aware pick.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// Envoy cluster that holds every endpoint and honours
    /// `x-gateway-destination-endpoint` (`override_host`): where polls go.
    pub cluster: String,
    /// Poll period (the root context's tick), ms.
    pub poll_ms: u64,
    /// Timeout of one poll, ms.
    pub timeout_ms: u64,
    /// A sample older than this counts as unknown (load 0), ms.
    pub max_age_ms: u64,
    /// Bounded-load factor `c` (> 1): a primary over `c` times its share spills.
    pub factor: f64,
    /// Below this many requests in flight an endpoint never spills (≥ 1).
    pub floor: f64,
}

impl Default for LoadConfig {
    /// The fleet simulator's defaults (`tether simulate --balance-factor 2
    /// --balance-floor 8 --load-poll-ms 200`), so a simulated plan and the
    /// gateway spill alike.
    fn default() -> Self {
        Self {
            cluster: "ranks".to_owned(),
            poll_ms: 200,
            timeout_ms: 200,
            max_age_ms: 1000,
            factor: 2.0,
            floor: 8.0,
        }
    }
}

impl LoadConfig {
    /// The bound of [`tether_placement::Placement::pick_bounded`].
    pub fn bound(&self) -> tether_placement::LoadBound {
        tether_placement::LoadBound {
            factor: self.factor,
            floor: self.floor,
        }
    }

    /// Parses the `load` object; every error names its field.
    pub fn parse(v: &serde_json::Value) -> Result<Self, crate::config::ConfigError> {
        use crate::config::ConfigError;
        let err = |f: &str, why: &str| ConfigError {
            field: format!("load.{f}"),
            why: why.to_owned(),
        };
        let obj = v.as_object().ok_or_else(|| ConfigError {
            field: "load".into(),
            why: "must be an object".into(),
        })?;
        let mut c = Self::default();
        let mut age_set = false;
        for (k, v) in obj {
            let num = || v.as_f64().ok_or_else(|| err(k, "must be a number"));
            let ms = || {
                v.as_u64()
                    .ok_or_else(|| err(k, "must be a whole number of milliseconds"))
            };
            match k.as_str() {
                "cluster" => {
                    c.cluster = v
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .ok_or_else(|| err(k, "must be a non-empty cluster name"))?
                        .to_owned()
                }
                "poll_ms" => c.poll_ms = ms()?,
                "timeout_ms" => c.timeout_ms = ms()?,
                "max_age_ms" => {
                    c.max_age_ms = ms()?;
                    age_set = true;
                }
                "factor" => c.factor = num()?,
                "floor" => c.floor = num()?,
                _ => return Err(err(k, "unknown field")),
            }
        }
        if !(10..=60_000).contains(&c.poll_ms) {
            return Err(err("poll_ms", "must be between 10 and 60000"));
        }
        if !(1..=60_000).contains(&c.timeout_ms) {
            return Err(err("timeout_ms", "must be between 1 and 60000"));
        }
        if !age_set {
            c.max_age_ms = c.max_age_ms.max(5 * c.poll_ms);
        }
        if c.max_age_ms < c.poll_ms {
            return Err(err("max_age_ms", "must be at least poll_ms"));
        }
        if !(c.factor.is_finite() && c.factor > 1.0) {
            return Err(err("factor", "must be a number above 1"));
        }
        if !(c.floor.is_finite() && c.floor >= 1.0) {
            return Err(err("floor", "must be a number of at least 1"));
        }
        Ok(c)
    }
}

/// Whether this VM should poll now: the last poll any worker claimed (its
/// time in shared data) is at least most of a period old. Every worker's
/// root context ticks; the first to claim a period by compare-and-swap polls.
pub fn due(last_poll_ms: Option<u64>, now_ms: u64, poll_ms: u64) -> bool {
    last_poll_ms.is_none_or(|last| now_ms.saturating_sub(last) >= poll_ms - poll_ms / 4)
}
