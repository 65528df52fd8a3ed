//! `tether-rank`: a simulated engine rank whose KV cache is `tether-engine`.
//!
//! An OpenAI/Anthropic-compatible server (`docs/rank.md`) around pure parts
//! that the fleet simulator reuses rank by rank:
//! - [`prompt`]: the simulated tokenizer contract — how a request body of each
//!   API becomes token ids (the trace synthesizer in `tether-fleet` builds
//!   requests against it);
//! - [`profile`]: GPU profiles (format-neutral curves; JSON reader, `docs/profile.md`);
//! - [`latency`]: step, prefill-chunk and restore times from a profile;
//! - [`engine`]: continuous batching over a `RetentionCache`, stepped by the
//!   caller's clock (no tokio, no wall time);
//! - [`metrics`], [`load`]: what the engine counted, in vLLM's metric names, and
//!   the load report for load-aware routing.
//!
//! The tokio/hyper shell is [`server`] (with [`pd`], a decode rank's prefill
//! leg); [`request`] and [`reply`] are the wire
//! formats of the four APIs; [`config`] the command line.

pub mod clock;
pub mod config;
pub mod engine;
pub mod latency;
pub mod load;
pub mod metrics;
pub mod pd;
pub mod profile;
pub mod prompt;
pub mod reply;
pub mod request;
pub mod server;
