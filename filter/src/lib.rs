//! tether's gateway filter: a proxy-wasm HTTP filter for an unmodified Envoy
//! that gives every turn of one agent run — and of each subagent — a stable
//! routing key, places it (Envoy hash policy, or the filter's own weighted
//! rendezvous pick of endpoint and DP rank), and tells the engine where the
//! prompt ended and why.
//!
//! The logic is plain Rust, testable natively: [`api`] (formats), [`json`] and
//! [`scan`] (the head/tail body scanner), [`identity`], [`head`], [`turn`],
//! [`placement`], [`config`], [`outputs`], [`rewrite`], [`markers`], [`metrics`], and
//! [`decide`] which ties them together. The wasm build adds a thin host shell
//! (`glue`, `host`). The contract is `docs/gateway.md`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

pub mod api;
pub mod config;
pub mod decide;
pub mod eject;
pub mod head;
pub mod header_pairs;
pub mod identity;
pub mod json;
pub mod kv_params;
pub mod load_view;
pub mod markers;
pub mod metrics;
pub mod outputs;
pub mod pd;
pub mod placer;
pub mod preamble;
pub use tether_placement as placement;
pub mod rewrite;
pub mod scan;
pub mod turn;

pub use decide::Reason;

#[cfg(target_arch = "wasm32")]
mod glue;
#[cfg(target_arch = "wasm32")]
mod host;
#[cfg(target_arch = "wasm32")]
mod poller;
#[cfg(all(target_arch = "wasm32", feature = "phase-timing"))]
mod timing;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(glue::Root::new()));
}}

#[cfg(test)]
mod testkit;
