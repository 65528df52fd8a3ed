//! tether's fleet tools: agent traces (model, importers, generator), replay and
//! compare, the fleet simulator and the P/D planner — the `tether` CLI.
//!
//! Everything here runs the *same* placement ([`tether_placement`]) and
//! retention policy ([`tether_engine`]) as the gateway and the ranks; nothing
//! is re-implemented.

pub mod sim;
pub mod trace;
