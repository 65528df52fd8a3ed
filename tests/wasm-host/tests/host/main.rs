//! Integration tests of the proxy-wasm host: one test binary, a module per area.

mod abi;
mod cli;
mod common;
mod floor;
mod load;
mod scan;
mod tether;
