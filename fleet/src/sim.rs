//! The fleet simulator: a trace served by 1–4096 simulated ranks, each a
//! `tether_rank_engine::engine::Engine` (continuous batching timed by a GPU profile)
//! on `tether-engine`'s real retention policy, placed by `tether-placement` —
//! the code the gateway and the ranks run, not a model of it.
//!
//! - [`config`]: policies, cache modes, fleet shape (aggregated or prefill +
//!   decode pools, scaled over time), engine settings;
//! - [`identity`]: the identity each policy sees (routing key, user, client address);
//! - [`prompt`]: a request's engine block ids from the trace's block tree;
//! - [`route`], [`prefix`]: the routing policies and SGLang-style approximate tree;
//! - [`run`]: the discrete-event loop ([`simulate`]);
//! - [`assemble`]: a run's observations → the same [`Report`](crate::report::Report) a replay writes;
//! - [`report`]: what a run measured; [`plot`]: the throughput-per-GPU vs
//!   interactivity chart.
//!
//! Method, assumptions and outputs: `docs/planning.md`.

pub mod assemble;
pub mod config;
pub mod identity;
pub mod plot;
pub mod prefix;
pub mod prompt;
pub mod report;
pub mod route;
pub mod run;
#[cfg(test)]
pub(crate) mod testkit;

pub use config::{CacheMode, FleetShape, Migrate, PdOptions, Policy, SimConfig, Step};
pub use identity::request_key;
pub use report::{RunReport, Simulation};
pub use run::{RunOutput, SimError, engine_name, oracle_hits, oracle_hits_within, simulate};
/// `SimConfig::rebalance`: its settings type (the rule ranks share).
pub use tether_placement::Rebalance;
