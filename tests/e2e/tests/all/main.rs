//! All end-to-end tests in one binary (links once): real Envoy, real echo-rank
//! processes, the tether filter and the floor filter. See docs/e2e.md.

mod bad_input;
mod body_scan;
mod buffering;
mod compressed_bodies;
mod config;
mod failover;
mod floor;
mod harness_headers;
mod long_answers;
mod oci;
mod pd;
mod pick;
mod rebalance;
mod removal;
mod replay;
mod residency;
mod residency_admission;
mod responses_chains;
mod support;
mod topology;
mod vllm_markers;
