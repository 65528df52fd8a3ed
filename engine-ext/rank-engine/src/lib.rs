//! `tether-rank-engine`: the engine model of a simulated rank, with no server around it.
//!
//! Pure parts that the rank server (`tether-rank`) and the fleet simulator
//! (`tether-fleet`) both step, so a simulated fleet and a fleet of rank processes
//! run the same code:
//! - [`prompt`]: the simulated tokenizer contract — how a request body of each
//!   API becomes token ids (the trace synthesizer in `tether-fleet` builds
//!   requests against it);
//! - [`profile`]: GPU profiles (format-neutral curves; JSON reader, `docs/profile.md`);
//! - [`latency`]: step, prefill-chunk and restore times from a profile;
//! - [`engine`]: continuous batching over a `RetentionCache`, stepped by the
//!   caller's clock (no tokio, no wall time);
//! - [`metrics`], [`load`]: what the engine counted, in vLLM's metric names, and
//!   the load report for load-aware routing.
#![forbid(unsafe_code)]

pub mod engine;
pub mod latency;
pub mod load;
pub mod metrics;
pub mod profile;
pub mod prompt;
