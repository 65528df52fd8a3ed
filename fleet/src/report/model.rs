//! The report document (`docs/report.md` is its one definition): serde types,
//! read and written as JSON.

use super::config::ServingConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub use crate::quantile::Dist;
use crate::sim::Simulation;

/// The `format` member of every report.
pub const FORMAT: &str = "tether-report";
/// The `version` this code writes and reads.
pub const VERSION: u32 = 1;

/// The trace replayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceInfo {
    /// File as given.
    pub path: String,
    /// Header `name`, if any.
    pub name: Option<String>,
    /// Format it was read as (`tether`, `mooncake`, …).
    pub format: String,
    /// `content_hash` of the trace (`docs/trace-format.md`): `compare` refuses
    /// reports whose hashes differ.
    pub content_hash: String,
    /// Tokens per prefix block.
    pub block_size: u32,
    /// Sessions.
    pub sessions: u64,
    /// Agents.
    pub agents: u64,
    /// Requests.
    pub requests: u64,
    /// Prompt tokens over all requests.
    pub input_tokens: u64,
    /// Output tokens over all requests.
    pub output_tokens: u64,
}

/// How the replay ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Free-form label (`--label`), shown as the column name by `compare`.
    pub label: String,
    /// What produced it: `tether replay` or `tether simulate`.
    pub tool: String,
    /// Version of the tool.
    pub version: String,
    /// Where requests went (URLs), or the simulated fleet.
    pub targets: Vec<String>,
    /// `fixed` (trace timestamps) or `live` (N live session trees).
    pub schedule: String,
    /// Live sessions at once (`live` schedule).
    pub live_sessions: Option<u64>,
    /// Most requests in flight at once.
    pub max_inflight: u64,
    /// Trace time runs this many times faster than wall time.
    pub speedup: f64,
    /// Idle gaps are capped at this many trace ms (`live` schedule).
    pub max_gap_ms: Option<u64>,
    /// Sessions of the trace replayed (`--sessions` may cut it short).
    pub sessions_replayed: u64,
    /// Request synthesis: API override, identity mode, streaming.
    pub api: Option<String>,
    /// Identity mode of the synthesized requests.
    pub identity: String,
    /// Whether responses were streamed.
    pub stream: bool,
    /// Unix ms at the start.
    pub started_unix_ms: u64,
    /// Wall seconds the replay took.
    pub wall_s: f64,
    /// Trace seconds the replay covered (wall × speedup).
    pub trace_s: f64,
    /// Where the latencies come from: `simulated`, `client`, or `mixed`.
    pub clock: String,
    /// How far behind its schedule each request was sent, trace ms (fixed
    /// schedule: after its timestamp; a replay that cannot keep up at its
    /// speedup shows here — lower the speedup).
    pub lag_ms: Dist,
    /// The replay stopped before the end (^C, a deadline): the report covers
    /// only what was sent until then.
    pub partial: bool,
    /// Why it is partial.
    pub partial_reason: Option<String>,
}

/// Request counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    /// Requests in the trace (of the sessions replayed).
    pub in_trace: u64,
    /// Sent.
    pub sent: u64,
    /// Answered in full.
    pub completed: u64,
    /// Failed.
    pub errors: u64,
    /// Failures by kind (`connect`, `timeout`, `reset`, `bad_response`, `http_<status>`).
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Never sent (a partial replay, or a session cut short by an error).
    pub not_sent: u64,
    /// Served after more than one upstream attempt (the gateway retried on a fallback).
    pub retried: u64,
}

/// Token totals over completed requests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    /// Prompt tokens.
    pub prompt: u64,
    /// Served from cache (device + host).
    pub cached: u64,
    /// Computed by prefill (`prompt − cached`).
    pub computed: u64,
    /// Generated.
    pub output: u64,
    /// Of `cached`, found on the device (when the server reports it).
    pub device_cached: Option<u64>,
    /// Of `cached`, restored from a host tier (when the server reports it).
    pub restored: Option<u64>,
}

/// Hit ratios (cached ÷ prompt tokens) beside the trace's ideal.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HitRatio {
    /// Over all completed requests.
    pub overall: f64,
    /// Over returning requests (all but each session's first).
    pub returning: f64,
    /// The trace's ideal with perfect affinity: an infinite cache per session.
    pub ideal_session: f64,
    /// The same on returning requests.
    pub ideal_session_returning: f64,
    /// One infinite cache shared by every request (the bound of any placement).
    pub ideal_global: f64,
    /// `overall ÷ ideal_global`: the share of the shared-cache ceiling, the
    /// headline (no placement or policy beats that ceiling at trace-block
    /// granularity).
    #[serde(default)]
    pub of_shared_cache: f64,
    /// `overall ÷ ideal_session`: the share of the session-affinity ceiling,
    /// which sessions that share a prefix (a common system prompt) can beat.
    pub of_ideal: f64,
    /// `returning ÷ ideal_session_returning`.
    pub of_ideal_returning: f64,
}

/// Prefill the configuration could have avoided, fleet-wide and at the
/// placement the run saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reprefill {
    /// Prompt tokens one infinite prefix cache shared by the whole fleet
    /// would have served (each served request, in send order, reads and fills
    /// it; trace blocks): what no placement and no eviction can beat.
    pub reusable_tokens: u64,
    /// Of those, recomputed: Σ max(0, reusable − cached) per request — prefill
    /// the configuration (routing and retention together) lost, fleet-wide.
    pub avoidable_tokens: u64,
    /// `fleet`.
    pub basis: String,
    /// Prompt tokens an infinite cache on each engine would have served at the
    /// placement the run saw (per session without engine identity).
    #[serde(default)]
    pub reusable_at_placement_tokens: u64,
    /// Of those, recomputed: what eviction lost given the routing (the
    /// retention benchmarks' measure: routing held fixed).
    #[serde(default)]
    pub avoidable_at_placement_tokens: u64,
    /// `per_rank` when engine identity was reported, else `per_session`.
    #[serde(default)]
    pub placement_basis: String,
}

/// Latency and throughput distributions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Time to first token, ms.
    pub ttft_ms: Dist,
    /// Mean inter-token latency per request, ms.
    pub itl_ms: Dist,
    /// End to end, ms.
    pub e2e_ms: Dist,
    /// Waiting for admission, ms (when reported).
    pub queue_ms: Dist,
    /// Output tokens per second per stream: `(output − 1) ÷ (e2e − ttft)`.
    pub output_tokens_per_s: Dist,
}

/// Work one engine did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineLoad {
    /// `rank` or `rank#dp`.
    pub engine: String,
    /// Requests served.
    pub requests: u64,
    /// Prompt tokens served.
    pub prompt_tokens: u64,
    /// Prompt tokens computed.
    pub computed_tokens: u64,
    /// Simulated busy seconds during the replay (rank `/metrics`), when scraped.
    pub busy_s: Option<f64>,
}

/// Per-engine load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// One entry per engine seen, sorted by name.
    pub engines: Vec<EngineLoad>,
    /// Engines the configuration has (ranks × DP ranks), when known; engines
    /// that served nothing count in the mean.
    pub engines_configured: Option<u64>,
    /// max ÷ mean of requests per engine.
    pub max_over_mean_requests: Option<f64>,
    /// max ÷ mean of prompt tokens per engine (the headline: work offered).
    pub max_over_mean_prompt_tokens: Option<f64>,
    /// max ÷ mean of computed tokens per engine.
    pub max_over_mean_computed_tokens: Option<f64>,
    /// Completed requests whose engine was not reported.
    pub unattributed: u64,
}

/// What the replay cost on the profile's price.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// `busy`: engines' simulated busy seconds (scraped) × their price;
    /// `fleet_time`: every engine for the whole replay; absent: no price known.
    pub basis: Option<String>,
    /// Engine-hours priced.
    pub engine_hours: f64,
    /// US dollars.
    pub usd: f64,
    /// Dollars per million tokens (prompt + output of completed requests).
    pub usd_per_mtok: Option<f64>,
}

/// One bucket of the hit-ratio timeline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Start of the bucket, trace seconds since the replay started.
    pub t_s: f64,
    /// Requests completed that were sent in it.
    pub requests: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Their cached tokens.
    pub cached_tokens: u64,
}

/// Series for the plots (kept in the JSON so plots can be redrawn from it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// TTFT CDF: `[ms, fraction]` at 100 quantiles plus the extremes.
    pub ttft_cdf: Vec<(f64, f64)>,
    /// Hit ratio over time.
    pub hit_over_time: Vec<Bucket>,
    /// Bucket width, trace seconds.
    pub bucket_s: f64,
}

/// A replay report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `tether-report`.
    pub format: String,
    /// Always 1.
    pub version: u32,
    /// The trace.
    pub trace: TraceInfo,
    /// The run.
    pub run: RunInfo,
    /// The serving configuration in force, with hashes.
    pub config: ServingConfig,
    /// Counts.
    pub requests: Requests,
    /// Tokens.
    pub tokens: Tokens,
    /// Hit ratios.
    pub hit_ratio: HitRatio,
    /// Avoidable re-prefill.
    pub reprefill: Reprefill,
    /// Latencies.
    pub latency: Latency,
    /// Per-engine load.
    pub load: Load,
    /// Cost.
    pub cost: Cost,
    /// Plot series.
    pub series: Series,
    /// What only a simulation measures (`tether simulate --out`): the one
    /// extension point for simulator figures; absent from a replay's report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulation: Option<Simulation>,
}

/// A report file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// I/O.
    #[error("{path}: {why}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// Not a report of this version.
    #[error("{path}: not a tether report: {why}")]
    Format {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

impl Report {
    /// Reads a report written by [`Report::write_json`].
    pub fn read(path: &Path) -> Result<Report, ReadError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ReadError::Io {
            path: p.clone(),
            why: e.to_string(),
        })?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ReadError::Format {
            path: p.clone(),
            why: e.to_string(),
        })?;
        let fmt = v.get("format").and_then(|f| f.as_str());
        if fmt != Some(FORMAT) {
            return Err(ReadError::Format {
                path: p,
                why: format!("`format` is {fmt:?}, expected \"{FORMAT}\""),
            });
        }
        let ver = v.get("version").and_then(|f| f.as_u64());
        if ver != Some(u64::from(VERSION)) {
            return Err(ReadError::Format {
                path: p,
                why: format!("`version` is {ver:?}, this tether reads {VERSION}"),
            });
        }
        serde_json::from_value(v).map_err(|e| ReadError::Format {
            path: p,
            why: e.to_string(),
        })
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}
