//! `tether-rank`: a simulated engine rank whose KV cache is `tether-engine`.
//!
//! An OpenAI/Anthropic-compatible server (`docs/rank.md`) around the engine
//! model of `tether-rank-engine` (re-exported here: [`engine`], [`latency`],
//! [`profile`], [`prompt`], [`metrics`], [`load`]), which the fleet simulator
//! steps too. This crate is the tokio/hyper shell: [`server`] (with [`pd`], a
//! decode rank's prefill leg, and [`pull`], a migrated key's state pulled from
//! its old holder under a lease, and [`rebalance`], a tool turn's state copied
//! to a cooler rank during the gap), [`request`] and [`reply`] (the wire formats of
//! the four APIs), [`clock`] (simulated time from wall time) and [`config`]
//! (the command line).

pub mod clock;
pub mod config;
pub mod pd;
pub mod pull;
pub mod rebalance;
pub mod reply;
pub mod request;
pub mod server;

pub use tether_rank_engine::{engine, latency, load, metrics, profile, prompt};
