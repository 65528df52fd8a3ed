//! The connector's `/load` reply: the residency summary of what the ledger retains
//! (`tether_placement::residency`, the same code as `tether-rank`) beside the
//! scheduler's load, written as the `LoadReport` every router reads (docs/vllm.md,
//! "Residency endpoint").

use crate::CallerError;
use crate::ledger::{Ledger, Marker};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tether_placement::load::report::{LoadReport, RankLoad};
use tether_placement::residency::{MAX_ENTRIES, Resident};
use tether_placement::{BusyAverage, Held, resident_key};

/// How busy the engine core has lately been (the `/load` report's `busy`,
/// `tether_placement::busy`): the connector marks when the core starts having
/// requests in flight and when it has none left; busy is the time between.
#[pyclass(module = "tether_vllm._native")]
pub struct BusyShare {
    avg: BusyAverage,
    busy: bool,
}

#[pymethods]
impl BusyShare {
    #[new]
    fn new() -> Self {
        Self {
            avg: BusyAverage::default(),
            busy: false,
        }
    }

    /// From `now_ms` on (the core's clock, ms) the core has requests in flight
    /// (`busy`) or none. Times that go back are ignored.
    fn set(&mut self, now_ms: f64, busy: bool) {
        self.avg.add(now_ms, self.busy_since(now_ms));
        if now_ms >= self.avg.at_ms() {
            self.busy = busy;
        }
    }

    /// The share (0–1) at `now_ms`.
    fn share(&self, now_ms: f64) -> f64 {
        self.avg.peek(now_ms, self.busy_since(now_ms))
    }
}

impl BusyShare {
    /// Busy ms since the average's last interval ended, up to `now_ms`.
    fn busy_since(&self, now_ms: f64) -> f64 {
        if self.busy {
            now_ms - self.avg.at_ms()
        } else {
            0.0
        }
    }
}

/// The engine core's prefill rate (the `/load` report's `prefill_tokens_per_s`,
/// `tether_placement::load::rate`): the connector feeds it every scheduled
/// step's new prompt tokens, and the rate is those over the time to the next
/// step.
#[pyclass(module = "tether_vllm._native")]
pub struct PrefillRate {
    rate: tether_placement::load::rate::PrefillRate,
}

#[pymethods]
impl PrefillRate {
    #[new]
    fn new() -> Self {
        Self {
            rate: Default::default(),
        }
    }

    /// A step was scheduled at `now_ms` (the core's clock) with `prompt_tokens`
    /// new prompt tokens.
    fn step(&mut self, now_ms: f64, prompt_tokens: u64) {
        self.rate.step(now_ms, prompt_tokens);
    }

    /// Tokens/s; 0 until a step has been measured.
    #[getter]
    fn tokens_per_s(&self) -> f64 {
        self.rate.tokens_per_s()
    }
}

impl Ledger {
    /// What the ledger retains, one entry per retention key: its resident key, its
    /// prompt tokens, and whether the device holds it (tier 1: it usually has a host
    /// copy too) or only the host tier (tier 2).
    pub(crate) fn resident_entries(&self) -> Vec<(u64, Held)> {
        let bs = (self.inner.config().block_size as u64).max(1);
        self.inner
            .resident()
            .map(|(k, tokens, device)| {
                let positions =
                    (tokens / bs).saturating_sub(self.state_groups) / self.attention_groups;
                let tokens = u32::try_from(positions.saturating_mul(bs)).unwrap_or(u32::MAX);
                let key = resident_key(k.tenant.0, k.session.0, k.subagent.0);
                (key, Held { tokens, device })
            })
            .collect()
    }
}

/// Every key once: a key listed twice keeps its largest state, on the device when
/// any copy is (the rule `tether-rank` lists by).
fn merged(entries: impl IntoIterator<Item = (u64, Held)>) -> Vec<(u64, Held)> {
    let mut by_key: std::collections::HashMap<u64, Held> = std::collections::HashMap::new();
    for (k, h) in entries {
        let e = by_key.entry(k).or_insert(h);
        e.tokens = e.tokens.max(h.tokens);
        e.device |= h.device;
    }
    by_key.into_iter().collect()
}

/// The `/load` reply (JSON bytes) of one engine core: `server_load` = `running +
/// waiting`, one `ranks` entry for its DP rank, `sim_ms` = `uptime_ms` (wall time:
/// `speedup` 1), and the residency summary of at most `max_entries` entries (≤
/// `RESIDENCY_MAX_ENTRIES`, else `CallerError`): what the ledger retains and the
/// `admitted` requests — `(marker, prompt tokens)` of requests waiting or running
/// whose prompt end will be retained, listed on the device with their full blocks,
/// so a next turn that arrives before its predecessor's retention finds its holder;
/// `busy`, the core's busy share (`BusyShare.share`); `prefill_tokens_per_s`, its
/// measured prefill rate (`PrefillRate.tokens_per_s`; 0: not measured yet).
#[pyfunction]
#[pyo3(signature = (ledger, *, dp_rank, running, waiting, restoring, queued_prefill_tokens,
    kv_usage, kv_blocks, uptime_ms, max_entries=MAX_ENTRIES, admitted=Vec::new(), busy=0.0,
    prefill_tokens_per_s=0.0))]
#[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
pub fn load_report<'py>(
    py: Python<'py>,
    ledger: PyRef<'_, Ledger>,
    dp_rank: usize,
    running: usize,
    waiting: usize,
    restoring: usize,
    queued_prefill_tokens: u64,
    kv_usage: f64,
    kv_blocks: usize,
    uptime_ms: f64,
    max_entries: usize,
    admitted: Vec<(Bound<'py, Marker>, u64)>,
    busy: f64,
    prefill_tokens_per_s: f64,
) -> PyResult<Bound<'py, PyBytes>> {
    if max_entries > MAX_ENTRIES {
        return Err(CallerError::new_err(format!(
            "load_report: max_entries {max_entries} over the wire limit {MAX_ENTRIES}"
        )));
    }
    // Under the GIL only the snapshot: the scheduler thread runs on while the summary
    // is sorted, encoded and written.
    let bs = (ledger.inner.config().block_size as u64).max(1);
    let in_flight = admitted
        .into_iter()
        .map(|(m, tokens)| (m.get().inner, tokens))
        .filter(|(m, _)| m.prompt_end)
        .map(|(m, tokens)| {
            let k = m.key;
            let tokens = u32::try_from(tokens / bs * bs).unwrap_or(u32::MAX);
            let key = resident_key(k.tenant.0, k.session.0, k.subagent.0);
            (
                key,
                Held {
                    tokens,
                    device: true,
                },
            )
        });
    let entries = merged(ledger.resident_entries().into_iter().chain(in_flight));
    let retentions = ledger.inner.device_records();
    drop(ledger);
    let body = py
        .detach(|| {
            let (resident, omitted) = Resident::from_entries(entries, max_entries);
            // JSON has no NaN: a non-finite figure would make the reply unreadable.
            let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
            serde_json::to_vec(&LoadReport {
                server_load: running + waiting,
                sim_ms: finite(uptime_ms),
                speedup: 1.0,
                ranks: vec![RankLoad {
                    dp_rank,
                    running,
                    waiting,
                    restoring,
                    queued_prefill_tokens,
                    kv_usage: finite(kv_usage).clamp(0.0, 1.0),
                    kv_blocks,
                    retentions,
                    busy: finite(busy).clamp(0.0, 1.0),
                    prefill_tokens_per_s: finite(prefill_tokens_per_s).max(0.0).round(),
                }],
                residency: Some(resident.encode(omitted)),
            })
        })
        .map_err(|e| CallerError::new_err(format!("load_report: {e}")))?;
    Ok(PyBytes::new(py, &body))
}

/// Reads a `/load` reply as a router does (`LoadReport`, then the summary decoded
/// and checked by `Resident::decode`): the report as a dict, its `residency` None or
/// `version`, `omitted` and `entries` (resident key → `(tokens, "device" | "host")`).
/// A reply a router would refuse raises `CallerError` saying why. For tests and tools.
#[pyfunction]
pub fn read_load_report<'py>(py: Python<'py>, body: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let r: LoadReport = serde_json::from_slice(body)
        .map_err(|e| CallerError::new_err(format!("not a load report: {e}")))?;
    let residency = r
        .residency
        .as_ref()
        .map(|s| Resident::decode(s).map(|d| (s, d)))
        .transpose()
        .map_err(|e| CallerError::new_err(format!("residency: {e}")))?;
    // Every member as the router's type holds it, through one JSON round trip.
    let text = serde_json::to_string(&LoadReport {
        residency: None,
        ..r
    })
    .map_err(|e| CallerError::new_err(format!("load report: {e}")))?;
    let d = py.import("json")?.call_method1("loads", (text,))?;
    let Some((summary, resident)) = residency else {
        d.set_item("residency", py.None())?;
        return Ok(d);
    };
    let entries = PyDict::new(py);
    for (key, held) in resident.iter() {
        let tier = if held.device { "device" } else { "host" };
        entries.set_item(key, (held.tokens, tier))?;
    }
    let x = PyDict::new(py);
    x.set_item("version", summary.version)?;
    x.set_item("omitted", summary.omitted)?;
    x.set_item("entries", entries)?;
    d.set_item("residency", x)?;
    Ok(d)
}
