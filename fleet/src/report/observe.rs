//! One request's outcome as a replay client (or a simulator) records it: the
//! raw material of a [`Report`](super::Report).

use serde::{Deserialize, Serialize};

/// Where a latency came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// The server's simulated time (`usage.tether.sim_*`, `x-tether-sim-*`):
    /// exact at any `--speedup`, independent of how busy the machine is.
    Simulated,
    /// The client's wall clock (a server that reports no simulated times, e.g.
    /// a real vLLM): includes the network, the proxy and the client.
    Client,
}

impl Clock {
    /// Its name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Clock::Simulated => "simulated",
            Clock::Client => "client",
        }
    }
}

/// Latencies of one served request, milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Where they come from.
    pub clock: Clock,
    /// Arrival → first token.
    pub ttft_ms: f64,
    /// Mean inter-token latency (`None` for a one-token answer).
    pub itl_ms: Option<f64>,
    /// Arrival → last token.
    pub e2e_ms: f64,
    /// Waiting for admission, when the server says.
    pub queue_ms: Option<f64>,
}

/// What a served request reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Served {
    /// Prompt tokens (the API's usage; Anthropic: input + cache reads).
    pub prompt_tokens: u64,
    /// Of those, served from cache.
    pub cached_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Of the cached tokens, found on the device (`usage.tether`), when reported.
    pub device_cached_tokens: Option<u64>,
    /// Of the cached tokens, restored from a host tier, when reported.
    pub restored_tokens: Option<u64>,
    /// The rank that served it (`x-tether-rank`), when reported.
    pub rank: Option<String>,
    /// Its DP rank (`x-tether-rank-dp` / `usage.tether.dp_rank`), when reported.
    pub dp_rank: Option<u32>,
    /// Upstream attempts the gateway made (`x-envoy-attempt-count`; 1 without retries).
    pub attempts: u32,
    /// Latencies.
    pub timing: Timing,
}

impl Served {
    /// The serving engine's name: `rank` plus `#dp` when the rank has DP ranks
    /// reported; `None` when the server does not say.
    pub fn engine(&self) -> Option<String> {
        let r = self.rank.as_ref()?;
        Some(match self.dp_rank {
            Some(d) => format!("{r}#{d}"),
            None => r.clone(),
        })
    }
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No connection to the target.
    Connect,
    /// No complete answer within the request timeout.
    Timeout,
    /// The connection closed before the answer was complete.
    Reset,
    /// An answer that is not what the API returns (unparseable, no usage).
    BadResponse,
    /// A non-2xx status.
    Status(u16),
}

impl ErrorKind {
    /// Its name in reports: `connect`, `timeout`, `reset`, `bad_response`, `http_<status>`.
    pub fn name(&self) -> String {
        match self {
            ErrorKind::Connect => "connect".to_owned(),
            ErrorKind::Timeout => "timeout".to_owned(),
            ErrorKind::Reset => "reset".to_owned(),
            ErrorKind::BadResponse => "bad_response".to_owned(),
            ErrorKind::Status(s) => format!("http_{s}"),
        }
    }
}

/// A request's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered in full.
    Served(Served),
    /// Failed; the message is for people.
    Failed {
        /// Why.
        kind: ErrorKind,
        /// Details (status line, error body, I/O error).
        message: String,
        /// Upstream attempts the gateway reported, when it did.
        attempts: u32,
        /// The rank named in the answer, when there was one.
        rank: Option<String>,
    },
}

/// One request sent during a replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The trace request (index into `Trace::requests`).
    pub request: u32,
    /// When it was sent: ms of trace time since the replay started (wall ms ×
    /// speedup), so buckets line up with the trace's own timeline.
    pub sent_ms: f64,
    /// How far behind its schedule it was sent (trace ms; 0 in live mode).
    pub lag_ms: f64,
    /// What happened.
    pub outcome: Outcome,
}

impl Observation {
    /// The served part, if it was served.
    pub fn served(&self) -> Option<&Served> {
        match &self.outcome {
            Outcome::Served(s) => Some(s),
            Outcome::Failed { .. } => None,
        }
    }
}
