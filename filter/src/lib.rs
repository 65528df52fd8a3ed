//! tether's gateway filter: a proxy-wasm HTTP filter for an unmodified Envoy
//! that gives every turn of one agent run — and of each subagent — a stable
//! routing key, places it (Envoy hash policy, or the filter's own weighted
//! rendezvous pick of endpoint and DP rank, load-aware and P/D), and tells
//! the engine where the prompt ended and why.
//!
//! The decision is one pure pipeline, [`decide`]: read → place → emit, each
//! stage a folder of plain Rust, testable natively:
//! - [`read`]: headers and the body's two ends into a [`read::Reading`] — the
//!   head/tail body scanner ([`read::scan`], on [`json`] and [`api`]), the
//!   conversation head, identity and routing key, turn markers;
//! - [`place`]: a pure function of (key, configuration, load-view snapshot,
//!   now) into a [`place::Placed`] — rendezvous pick, ejection, load-aware
//!   spill, P/D;
//!   the fleet simulator can call it too;
//! - [`emit`]: both into the [`emit::Plan`] — headers, filter state, body
//!   edit, counters, or a refusal.
//!
//! [`config`] parses the plugin configuration once. The wasm build adds a
//! thin host shell (`shell`: the proxy-wasm contexts, raw host calls, load
//! polling, phase timing) that hands over bytes, the view snapshot and the
//! clock, and applies the plan. The contract is `docs/gateway.md`.
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
pub mod emit;
pub mod header_pairs;
pub mod json;
pub mod place;
pub use tether_placement as placement;
pub mod read;
pub mod step;

pub use read::Reason;

#[cfg(target_arch = "wasm32")]
mod shell;

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::new(shell::glue::Root::new()));
}}

#[cfg(test)]
mod testkit;
