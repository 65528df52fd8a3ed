//! The proxy-wasm shell around the pure pipeline (wasm only): the root and
//! HTTP contexts, the raw host calls, load polling and phase timing.

pub mod answer;
pub mod chain_store;
pub mod glue;
pub mod host;
pub mod poller;
pub mod timing;
