//! `tether_vllm._native`: the Python face of tether's retention ledger and KV-copy engine,
//! and of the `/load` report with the residency summary the connector serves.
//!
//! Only block hashes, block ids, tensor addresses, strides and sizes cross this
//! boundary, never per-element loops; copies run with the GIL released. Errors carry
//! who failed (`tether_engine::Fault`) as their Python class: `CallerError` (bad input:
//! fail the request), `DeviceError` (memory or driver: recompute), `TransientError`
//! (no room now: recompute or retry), all subclasses of `TetherError`.

mod arena;
mod copier;
mod http;
mod ledger;
mod pull;
mod residency;

use pyo3::create_exception;
use pyo3::prelude::*;
use tether_engine::Fault;

create_exception!(_native, TetherError, pyo3::exceptions::PyException);
create_exception!(_native, CallerError, TetherError);
create_exception!(_native, DeviceError, TetherError);
create_exception!(_native, TransientError, TetherError);

/// The Python exception of a failure class, with `msg`.
pub(crate) fn fault_err(fault: Fault, msg: impl std::fmt::Display) -> PyErr {
    let msg = msg.to_string();
    match fault {
        Fault::Caller => CallerError::new_err(msg),
        Fault::Device => DeviceError::new_err(msg),
        Fault::Transient => TransientError::new_err(msg),
    }
}

/// 128-bit id of a vLLM block hash: its first 16 bytes, little endian (vLLM's hashes
/// are sha256 digests, uniformly distributed; shorter ones are zero-padded).
pub(crate) fn hash_id(bytes: &[u8]) -> tether_engine::BlockHash {
    let mut b = [0u8; 16];
    let n = bytes.len().min(16);
    b[..n].copy_from_slice(&bytes[..n]);
    tether_engine::BlockHash(u128::from_le_bytes(b))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TetherError", py.get_type::<TetherError>())?;
    m.add("CallerError", py.get_type::<CallerError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("TransientError", py.get_type::<TransientError>())?;
    m.add_class::<ledger::Marker>()?;
    m.add_class::<ledger::Ledger>()?;
    m.add_class::<copier::KvCopier>()?;
    m.add_class::<pull::PullSource>()?;
    m.add_class::<residency::BusyShare>()?;
    m.add_class::<residency::PrefillRate>()?;
    m.add_function(wrap_pyfunction!(pull::pull_chain, m)?)?;
    m.add_function(wrap_pyfunction!(http::http_post, m)?)?;
    m.add_function(wrap_pyfunction!(ledger::parse_marker, m)?)?;
    m.add_function(wrap_pyfunction!(copier::cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(residency::load_report, m)?)?;
    m.add_function(wrap_pyfunction!(residency::read_load_report, m)?)?;
    m.add(
        "RESIDENCY_MAX_ENTRIES",
        tether_placement::residency::MAX_ENTRIES,
    )?;
    m.add("MARKER_KEY", tether_wire::params::KEY)?;
    m.add("PULL_FROM", tether_wire::params::PULL_FROM)?;
    Ok(())
}
