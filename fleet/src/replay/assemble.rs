//! A replay's outcomes → its [`Report`]: the replay's own settings become
//! `replay.*` configuration keys beside the gateway's and the ranks'.

use super::run::{Options, Outcomes, Route, Schedule};
use crate::report::model::RunInfo;
use crate::report::{BuildInput, Report, ServingConfig, build};
use crate::trace::Trace;
use std::collections::BTreeMap;

/// Where the trace came from.
#[derive(Clone, Debug)]
pub struct Source {
    /// The file, as given.
    pub path: String,
    /// The format it was read as.
    pub format: String,
}

/// The replay's settings as configuration keys (`replay.*`).
pub fn replay_keys(opts: &Options, speedup: f64) -> BTreeMap<String, String> {
    let mut keys = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        keys.insert(format!("replay.{k}"), v);
    };
    put(
        "schedule",
        match opts.schedule {
            Schedule::Fixed => "fixed".to_owned(),
            Schedule::Live(n) => format!("live {n}"),
        },
    );
    put("speedup", format!("{speedup}"));
    put("identity", opts.synth.identity.name().to_owned());
    put(
        "api",
        opts.synth
            .api
            .map_or("trace".to_owned(), |x| x.name().to_owned()),
    );
    put("stream", opts.synth.stream.to_string());
    if opts.synth.exact_output {
        put("exact_output", "true".to_owned());
    }
    put("max_inflight", opts.max_inflight.to_string());
    if let Schedule::Live(_) = opts.schedule {
        put("max_gap_ms", opts.max_gap_ms.to_string());
    }
    if opts.targets.len() > 1 {
        put(
            "route",
            match opts.route {
                Route::Session => "session",
                Route::RoundRobin => "round-robin",
                Route::Resident { .. } => "resident",
            }
            .to_owned(),
        );
    }
    keys
}

/// Builds the report of a finished (or interrupted) replay.
pub fn report(
    trace: &Trace,
    source: &Source,
    opts: &Options,
    out: &Outcomes,
    label: &str,
) -> Report {
    let config = ServingConfig::new(
        out.gateway.clone(),
        out.ranks.clone(),
        replay_keys(opts, out.speedup),
    );
    let run = RunInfo {
        label: label.to_owned(),
        tool: "tether replay".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        targets: opts.targets.iter().map(ToString::to_string).collect(),
        schedule: match opts.schedule {
            Schedule::Fixed => "fixed",
            Schedule::Live(_) => "live",
        }
        .to_owned(),
        live_sessions: match opts.schedule {
            Schedule::Live(n) => Some(n as u64),
            Schedule::Fixed => None,
        },
        max_inflight: opts.max_inflight as u64,
        speedup: out.speedup,
        max_gap_ms: matches!(opts.schedule, Schedule::Live(_)).then_some(opts.max_gap_ms),
        sessions_replayed: out.sessions.len() as u64,
        api: opts.synth.api.map(|x| x.name().to_owned()),
        identity: opts.synth.identity.name().to_owned(),
        stream: opts.synth.stream,
        started_unix_ms: out.started_unix_ms,
        wall_s: out.wall_s,
        trace_s: out.trace_s,
        clock: String::new(),
        lag_ms: Default::default(),
        partial: out.partial.is_some(),
        partial_reason: out.partial.clone(),
    };
    build(BuildInput {
        trace,
        trace_path: source.path.clone(),
        trace_format: source.format.clone(),
        sessions: &out.sessions,
        observations: &out.observations,
        run,
        config,
        busy_s: out.busy_s.clone(),
    })
}
