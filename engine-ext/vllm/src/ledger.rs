//! The scheduler side: turn markers from `kv_transfer_params["tether"]` and the
//! retention [`tether_engine::Ledger`] over vLLM's block pool.

use crate::{CallerError, fault_err, hash_id};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::net::SocketAddr;
use tether_engine::{BlockHash, Fault, Ledger as Inner, PolicyConfig, TurnMarker};
use tether_wire::RetentionMs;

/// Members and value length a `kv_transfer_params["tether"]` object may have: the
/// gateway writes 7 short strings; anything far larger is refused before parsing.
const MAX_MEMBERS: usize = 32;
const MAX_VALUE_CHARS: usize = 256;

/// A parsed turn marker (read-only), with the connector's own member beside it.
#[pyclass(frozen, module = "tether_vllm._native")]
#[derive(Clone, Copy)]
pub struct Marker {
    pub(crate) inner: TurnMarker,
    /// `pull_from`: the API address of the engine holding this key's state, which a
    /// gateway names when it migrates the key (docs/vllm.md, "State pull (NIXL)").
    pub(crate) pull_from: Option<SocketAddr>,
}

#[pymethods]
impl Marker {
    /// True when this request's prompt end is to be retained.
    #[getter]
    fn prompt_end(&self) -> bool {
        self.inner.prompt_end
    }

    /// `first`, `user`, `tool` or `handoff`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind.name()
    }

    /// The 64-bit key a residency summary lists this marker's retention under
    /// (`tether_placement::resident_key`).
    #[getter]
    fn resident_key(&self) -> u64 {
        let k = self.inner.key;
        tether_placement::resident_key(k.tenant.0, k.session.0, k.subagent.0)
    }

    /// The retention key as `tenant:session:subagent` (hex).
    #[getter]
    fn key(&self) -> String {
        let k = self.inner.key;
        format!("{:x}:{:x}:{:x}", k.tenant.0, k.session.0, k.subagent.0)
    }

    /// The explicit interval, when the gateway sent one.
    #[getter]
    fn retention_ms(&self) -> Option<u64> {
        self.inner.retention_ms
    }

    /// `(ip, port)` of `pull_from`, when the gateway sent one.
    #[getter]
    fn pull_from(&self) -> Option<(String, u16)> {
        self.pull_from.map(|a| (a.ip().to_string(), a.port()))
    }

    fn __repr__(&self) -> String {
        format!(
            "Marker(key={}, prompt_end={}, kind={})",
            self.key(),
            self.inner.prompt_end,
            self.kind()
        )
    }
}

/// Parses `kv_transfer_params["tether"]`: `None` → `None` (not a tracked turn); an
/// object of string members in the wire grammar → a `Marker` (or `None` when it names
/// no session); anything else — another type, non-string members, more than 32
/// members, values over 256 characters, values outside the grammar, a `pull_from` that
/// is not an IP socket address with a port — raises `CallerError` naming the problem.
#[pyfunction]
pub fn parse_marker(params: &Bound<'_, PyAny>) -> PyResult<Option<Marker>> {
    if params.is_none() {
        return Ok(None);
    }
    let dict = params
        .cast::<PyDict>()
        .map_err(|_| CallerError::new_err("kv_transfer_params.tether must be an object"))?;
    if dict.len() > MAX_MEMBERS {
        return Err(CallerError::new_err(format!(
            "kv_transfer_params.tether has {} members (at most {MAX_MEMBERS})",
            dict.len()
        )));
    }
    let mut fields: Vec<(String, String)> = Vec::with_capacity(dict.len());
    for (k, v) in dict.iter() {
        let k: String = k.extract().map_err(|_| {
            CallerError::new_err("kv_transfer_params.tether: a member name is not a string")
        })?;
        let v: String = v.extract().map_err(|_| {
            CallerError::new_err(format!(
                "kv_transfer_params.tether.{k}: value is not a string"
            ))
        })?;
        if v.chars().count() > MAX_VALUE_CHARS {
            return Err(CallerError::new_err(format!(
                "kv_transfer_params.tether.{k}: value longer than {MAX_VALUE_CHARS} characters"
            )));
        }
        fields.push((k, v));
    }
    let pull_from = fields
        .iter()
        .find(|(k, _)| k == tether_wire::params::PULL_FROM)
        .map(|(_, v)| parse_pull_from(v))
        .transpose()?;
    TurnMarker::from_fields(fields.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map(|m| m.map(|inner| Marker { inner, pull_from }))
        .map_err(|e| CallerError::new_err(format!("kv_transfer_params.tether: {e}")))
}

/// `pull_from`: `ip:port` or `[ipv6]:port`, port not 0.
fn parse_pull_from(v: &str) -> PyResult<SocketAddr> {
    match v.trim().parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(a),
        _ => Err(CallerError::new_err(format!(
            "kv_transfer_params.tether.{}: {v:?} is not an ip:port address",
            tether_wire::params::PULL_FROM
        ))),
    }
}

fn hashes(list: &[Bound<'_, PyBytes>]) -> Vec<BlockHash> {
    list.iter().map(|b| hash_id(b.as_bytes())).collect()
}

/// Retention decisions over vLLM's block pool (see `tether_engine::ledger`).
#[pyclass(module = "tether_vllm._native")]
pub struct Ledger {
    pub(crate) inner: Inner,
    /// KV cache groups whose blocks one retained block position holds: every
    /// attention group's block, and (hybrid) one snapshot block per state group per
    /// record — what turns a record's block count back into prompt tokens.
    pub(crate) attention_groups: u64,
    pub(crate) state_groups: u64,
}

#[pymethods]
impl Ledger {
    /// `block_bytes`: bytes of one block across all layers (host accounting);
    /// `host_bytes`: host-tier capacity (0 = none); interval overrides in ms (None =
    /// the wire contract's defaults); `max_interval_ms` clamps every interval;
    /// `attention_groups` / `state_groups`: the KV cache groups a record spans (a
    /// hybrid record holds each attention group's blocks and one state block per
    /// state group), so the residency summary counts prompt tokens, not blocks.
    #[new]
    #[pyo3(signature = (block_size, num_blocks, block_bytes, host_bytes, retention=true,
        max_interval_ms=3_600_000, first_ms=None, user_ms=None, tool_ms=None, handoff_ms=None,
        attention_groups=1, state_groups=0))]
    #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new(
        block_size: usize,
        num_blocks: usize,
        block_bytes: u64,
        host_bytes: u64,
        retention: bool,
        max_interval_ms: u64,
        first_ms: Option<u64>,
        user_ms: Option<u64>,
        tool_ms: Option<u64>,
        handoff_ms: Option<u64>,
        attention_groups: u64,
        state_groups: u64,
    ) -> PyResult<Self> {
        if attention_groups == 0 {
            return Err(CallerError::new_err(
                "Ledger: attention_groups must be >= 1",
            ));
        }
        let d = RetentionMs::DEFAULT;
        let intervals = RetentionMs {
            first: first_ms.unwrap_or(d.first),
            user: user_ms.unwrap_or(d.user),
            tool: tool_ms.unwrap_or(d.tool),
            handoff: handoff_ms.unwrap_or(d.handoff),
        };
        let cfg = PolicyConfig {
            block_size,
            device_blocks: num_blocks,
            block_bytes,
            host_bytes,
            retention,
            max_interval_ms,
            intervals,
            ..PolicyConfig::default()
        };
        let inner = Inner::try_new(cfg).map_err(|e| fault_err(Fault::Caller, e))?;
        Ok(Self {
            inner,
            attention_groups,
            state_groups,
        })
    }

    /// A turn of the marker's key arrived: refresh its retention on either tier.
    fn touch(&mut self, marker: &Marker, now_ms: u64) {
        self.inner.touch(&marker.inner.key, now_ms);
    }

    /// A prompt end: returns `(hold, release, store, on_host)` — block ids to reference,
    /// superseded ids to release (after holding), indices of the blocks to copy to host,
    /// and whether the host tier took the turn.
    fn retain(
        &mut self,
        marker: &Marker,
        block_hashes: Vec<Bound<'_, PyBytes>>,
        block_ids: Vec<u32>,
        now_ms: u64,
    ) -> (Vec<u32>, Vec<u32>, Vec<usize>, bool) {
        let plan = self
            .inner
            .retain(&marker.inner, &hashes(&block_hashes), &block_ids, now_ms);
        (plan.hold, plan.release, plan.store, plan.on_host)
    }

    /// Leading blocks of the chain the host tier holds.
    fn host_prefix(&self, block_hashes: Vec<Bound<'_, PyBytes>>) -> usize {
        self.inner.host_prefix(&hashes(&block_hashes))
    }

    /// Block ids of device retentions whose interval ran out (release one reference each).
    fn release_expired(&mut self, now_ms: u64) -> Vec<u32> {
        self.inner.release_expired(now_ms)
    }

    /// Device pressure: block ids to release, at least `need` if there are enough
    /// retentions, never those of `spare`'s key.
    #[pyo3(signature = (need, now_ms, spare=None))]
    fn yield_blocks(&mut self, need: usize, now_ms: u64, spare: Option<&Marker>) -> Vec<u32> {
        self.inner
            .yield_blocks(need, now_ms, spare.map(|m| m.inner.key))
    }

    /// A worker found a host payload corrupt: forget it and the records needing it.
    fn host_payload_lost(&mut self, block_hash: &Bound<'_, PyBytes>) {
        self.inner.host_payload_lost(hash_id(block_hash.as_bytes()));
    }

    /// 16-byte ids of host payloads freed since the last call (workers free them).
    fn take_freed<'py>(&mut self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.inner
            .take_freed()
            .into_iter()
            .map(|h| PyBytes::new(py, &h.0.to_le_bytes()))
            .collect()
    }

    /// Block references held by device retentions.
    #[getter]
    fn held_blocks(&self) -> usize {
        self.inner.held_blocks()
    }

    /// Host-tier bytes in use (logical).
    #[getter]
    fn host_used(&self) -> u64 {
        self.inner.host().used()
    }

    /// Counters (retained, superseded, refreshed, expired, yielded_to_host, dropped,
    /// host_blocks_stored, host_evicted, device_records, held_blocks, host_used).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("retained", s.retained)?;
        d.set_item("superseded", s.superseded)?;
        d.set_item("refreshed", s.refreshed)?;
        d.set_item("expired", s.expired)?;
        d.set_item("yielded_to_host", s.yielded_to_host)?;
        d.set_item("dropped", s.dropped)?;
        d.set_item("host_blocks_stored", s.host_blocks_stored)?;
        d.set_item("host_evicted", s.host_evicted)?;
        d.set_item("device_records", self.inner.device_records())?;
        d.set_item("held_blocks", self.inner.held_blocks())?;
        d.set_item("host_used", self.inner.host().used())?;
        Ok(d)
    }

    /// Checks the ledger's accounting (tests).
    fn check(&self) -> PyResult<()> {
        self.inner.check().map_err(|e| fault_err(Fault::Device, e))
    }
}
