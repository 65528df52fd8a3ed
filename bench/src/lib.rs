//! What several benchmark drivers share: the workspace root and the recorded
//! traces the routing benchmarks (`fleet-bench`, `resident-bench`) run on.

pub mod fleets;

use anyhow::Result;
use std::path::{Path, PathBuf};
use tether_fleet::import::{Format, ImportOptions, import};
use tether_fleet::trace::Trace;

/// The workspace root (the bench crate's parent).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The bundled agent traces and the Mooncake synthetic trace, by name, then
/// a real Mooncake conversation trace when `real` names one.
pub fn recorded_traces(real: Option<&Path>) -> Result<Vec<(String, Trace)>> {
    let mut traces: Vec<(String, Trace)> = Vec::new();
    for t in ["agent-demo", "agent-subagents", "agent-tenants"] {
        let p = root().join(format!("examples/traces/{t}.jsonl"));
        traces.push((
            t.into(),
            import(Format::Tether, &p, &ImportOptions::default())?,
        ));
    }
    let syn = root().join("examples/traces/mooncake_synthetic_trace.jsonl");
    traces.push((
        "mooncake-synthetic".into(),
        import(Format::Mooncake, &syn, &ImportOptions::default())?,
    ));
    if let Some(p) = real {
        traces.push((
            "mooncake-conversation (real)".into(),
            import(Format::Mooncake, p, &ImportOptions::default())?,
        ));
    }
    Ok(traces)
}

/// The median of `v` (the mean of the two middle values when even; NaN when
/// empty): benchmarks report medians over runs.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
