//! Observations + trace + serving configuration → a [`Report`], one idea per
//! part:
//! - [`scope`]: the requests in scope and the trace's ideal hit ratios;
//! - [`tally`]: the observations counted — requests, tokens, latency samples,
//!   each engine's work, the clock;
//! - [`placement`]: avoidable re-prefill, fleet-wide and at the placement the run saw;
//! - [`sessions`]: per-session and per-subagent figures;
//! - [`fleet`]: per-engine load and cost;
//! - [`series`]: the plot series.

mod fleet;
mod placement;
mod scope;
mod series;
mod sessions;
mod tally;

pub use scope::infinite_cache_hits;

use super::config::ServingConfig;
use super::model::{FORMAT, Report, RunInfo, VERSION};
use super::observe::Observation;
use crate::quantile::Dist;
use crate::trace::{SessionId, Trace};
use std::collections::BTreeMap;

/// What [`build`] needs besides the observations.
#[derive(Debug)]
pub struct BuildInput<'a> {
    /// The trace replayed.
    pub trace: &'a Trace,
    /// Its file, as given.
    pub trace_path: String,
    /// The format it was read as.
    pub trace_format: String,
    /// The sessions replayed (all, unless the replay was limited).
    pub sessions: &'a [SessionId],
    /// One per request sent, in any order.
    pub observations: &'a [Observation],
    /// How the run went (`clock` and `lag_ms` are filled in here).
    pub run: RunInfo,
    /// The configuration in force.
    pub config: ServingConfig,
    /// Simulated busy seconds per engine during the run (`rank#dp`), scraped
    /// from the ranks' `/metrics` (or the simulator's own); empty when not known.
    pub busy_s: BTreeMap<String, f64>,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Builds the report.
pub fn build(input: BuildInput<'_>) -> Report {
    let BuildInput {
        trace,
        trace_path,
        trace_format,
        sessions,
        observations,
        mut run,
        config,
        busy_s,
    } = input;
    let scope = scope::Scope::of(trace, sessions);
    let ideal = scope.ideal(trace);
    let mut tally = tally::Tally::of(observations, &scope.first, scope.requests.len() as u64);
    run.lag_ms = Dist::of(observations.iter().map(|o| o.lag_ms).collect());
    run.clock = tally.clock().to_owned();
    let mut series = series::series(&tally.ttft, observations);
    let latency = tally.latency();
    let tokens = std::mem::take(&mut tally.tokens);
    let (load, n_engines) = fleet::load(
        std::mem::take(&mut tally.per_engine),
        tally.unattributed,
        &config,
        &busy_s,
    );
    let cost = fleet::cost(
        &config,
        &busy_s,
        n_engines,
        run.trace_s,
        tokens.prompt + tokens.output,
    );
    let (per_session, session_hit_ratios) =
        sessions::sessions(trace, observations, &scope.first, run.speedup);
    series.session_hit_ratios = session_hit_ratios;
    let hit_ratio = ideal.hit_ratio(
        ratio(tokens.cached, tokens.prompt),
        ratio(tally.returning_cached, tally.returning_prompt),
    );
    Report {
        format: FORMAT.to_owned(),
        version: VERSION,
        trace: scope.trace_info(trace, trace_path, trace_format, sessions.len()),
        run,
        config,
        requests: tally.requests,
        tokens,
        hit_ratio,
        reprefill: placement::reprefill(trace, observations),
        sessions: per_session,
        latency,
        load,
        cost,
        series,
        simulation: None,
    }
}

#[cfg(test)]
pub(crate) mod tests;
