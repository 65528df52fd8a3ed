//! Integration tests of the proxy-wasm host: one test binary, a module per area.

mod abi;
mod cli;
mod common;
mod floor;
mod harness_identity;
mod load;
mod residency;
mod scan;
mod tether;
