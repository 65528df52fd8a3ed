//! End-to-end harness for tether: a real Envoy, real upstream processes, a client.
//!
//! Used by this crate's tests (`tests/all`), the demo (`tether-demo`), the
//! gateway benchmark and the wasm-host conformance tests. Everything is a
//! guard: dropping it kills the process it owns.
//!
//! # API
//!
//! - [`Envoy::start(bootstrap_yaml)`](Envoy::start) / [`Envoy::builder()`](Envoy::builder)
//!   `.var(name, value).plugin_config(&json).concurrency(n).log_level(l).start(yaml)`:
//!   renders the bootstrap template, runs Envoy with `--use-dynamic-base-id`
//!   (several can run at once) and `--admin-address-path`, polls the admin
//!   `/ready` against a deadline, then reads every listener's bound port from
//!   `/listeners?format=json`. Envoy's stdout/stderr go to a log file:
//!   [`Envoy::log`], [`Envoy::wait_for_log`]. Ports: [`Envoy::listen_addr`],
//!   [`Envoy::listener`], [`Envoy::admin_addr`]; admin: [`Envoy::admin`],
//!   [`Envoy::prometheus`] (parsed `/stats/prometheus`, see [`prometheus::Metrics`]).
//!   [`EnvoyBuilder::validate`] / [`Envoy::validate`] run `envoy --mode validate`.
//! - Templates ([`template`]): bootstraps contain `${NAME}` or `${NAME:-default}`.
//!   The harness fills `ADMIN_PORT` and `LISTEN_PORT` with `0` (ephemeral; the
//!   real port is read back from the admin), `FILTER_WASM` and `FLOOR_WASM`
//!   with the module paths; callers set the rest (`RANK_<i>_PORT` /
//!   `RANK_<i>_IP`: the upstreams, see [`bootstrap::rank_vars`];
//!   `PLUGIN_CONFIG`: the filter's JSON configuration quoted by
//!   [`EnvoyBuilder::plugin_config`]; optional `BUFFER_LIMIT`, …). An unresolved placeholder is an error
//!   naming it. The bootstraps are in `envoy/` ([`bootstrap`] loads them).
//! - [`EchoRank::start(name)`](EchoRank::start): a `tether-echo-rank` process on an
//!   ephemeral port ([`EchoRank::addr`]); it answers any request with JSON
//!   [`EchoReply`] `{"rank","port","method","path","headers" (lower-case),
//!   "body_bytes","body" (≤ 64 KiB UTF-8, else null)}`; request header
//!   [`echo::DELAY_HEADER`] holds the answer (to keep requests in flight).
//! - [`SimRank::start(args)`](SimRank::start): a real `tether-rank` process;
//!   [`Stack`]: `n` of them behind an Envoy rendered by `tether_envoy::render`
//!   (the replay tests, the demo and the replay benchmark run on it).
//! - [`HttpClient`]: `post_json(addr, path, headers, json)`, `send(addr, Request)`
//!   with raw header bytes, chunked bodies ([`Request::chunked`]), keep-alive
//!   [`Connection`]s, and [`HttpClient::bind`] to a source IP (127.0.0.2 is a
//!   real client IP change on Linux loopback).
//! - [`agent::Conversation`]: Anthropic Messages / Chat Completions / Responses
//!   bodies growing turn by turn (tool calls and results), keys in SDK order.
//! - [`paths`]: where Envoy and the modules are (`TETHER_ENVOY`,
//!   `TETHER_FILTER_WASM`, `TETHER_FLOOR_WASM`, else the `make` defaults), and
//!   `require_*` checks that fail with the command that builds what is missing.

pub mod agent;
pub mod bootstrap;
pub mod client;
pub mod echo;
pub mod envoy;
mod error;
pub mod paths;
pub mod prometheus;
pub mod rank;
pub mod sim_rank;
pub mod stack;
pub mod template;

pub use client::{Body, Connection, HttpClient, Request, Response};
pub use echo::EchoReply;
pub use envoy::{Envoy, EnvoyBuilder};
pub use error::HarnessError;
pub use rank::EchoRank;
pub use sim_rank::SimRank;
pub use stack::{Stack, StackSpec};
