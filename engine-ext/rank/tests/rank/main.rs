//! `tether-rank` over real HTTP on loopback: every API streaming and not, the
//! cache policies through the server, DP ranks, metrics, the load endpoint, bad
//! input, and the real binary. One test binary (it links once).

mod apis;
mod bad_input;
mod binary;
mod cache;
mod dp;
mod harness;
mod observe;
mod pd;
mod pull;
mod rebalance;
mod residency;
