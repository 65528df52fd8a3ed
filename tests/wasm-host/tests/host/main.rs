//! Integration tests of the proxy-wasm host: one test binary, a module per area.

mod abi;
mod cli;
mod common;
mod floor;
mod scan;
mod tether;
