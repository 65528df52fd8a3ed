//! The wire contract between tether's gateway filter and everything behind it.
//!
//! One place for every name and format the two halves must agree on:
//! [`Api`] (the request APIs, their names and paths), [`headers`] (every `x-tether-*` name, the engine-native and mesh headers, the
//! internal-header list a client may never send), [`TurnKind`], the hex id format
//! ([`hex`]), the one table of retention defaults ([`RetentionMs::DEFAULT`]) and
//! the typed [`TurnMarker`] the engine reads back from a request.
//!
//! The crate has no dependencies, so the filter's wasm module, the engine
//! policy, the ranks, the vLLM binding and the fleet tools all link it.
//! Documented for users in `docs/wire.md`.
#![forbid(unsafe_code)]

pub mod api;
pub mod headers;
pub mod hex;
pub mod marker;
pub mod params;
pub mod retention;
pub mod turn;

pub use api::Api;
pub use marker::{HexId, MarkerError, RetentionKey, TurnMarker};
pub use retention::RetentionMs;
pub use turn::TurnKind;
