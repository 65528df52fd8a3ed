//! tether's placement, as a plain library: the same code places a request in
//! the gateway filter (wasm), in the ranks, in replay and in the fleet simulator.
//!
//! - [`keys`]: the routing key and the hashes the gateway sends
//!   (`xxh3(tenant ‖ session ‖ subagent)`, fixed seed, so every gateway replica
//!   agrees without shared state);
//! - [`rendezvous`]: weighted rendezvous hashing of a key onto endpoints, with
//!   an ordered fallback list (removing an endpoint moves only its own keys);
//! - [`busy`]: how busy a rank has been lately (an average its `/load`
//!   report carries) and how residency placement weighs it beside requests
//!   in flight;
//! - [`dp`]: the data-parallel rank on the chosen endpoint, from a hash
//!   independent of the endpoint choice;
//! - [`load`]: load-aware choices given a load view — bounded-load spill down a
//!   key's rendezvous order, the least-loaded endpoint of a pool (a P/D prefill
//!   pool), and the P/D decision by uncached prompt tokens; [`load::report`]
//!   is the rank's `/load` report those views are polled from;
//! - [`residency`]: the residency summary a rank adds to that report (which
//!   retained keys it holds, how many tokens, which tier);
//! - [`resident`]: placement by residency and load among a key's first *d*
//!   rendezvous candidates, with the migrate-or-recompute rule.
//!
//! Pure and deterministic; no allocation on the per-key path except the pick's
//! order list. Documented for users in `docs/gateway.md` ("Placement").
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

pub mod busy;
pub mod dp;
pub mod keys;
pub mod load;
pub mod rebalance;
pub mod rendezvous;
pub mod residency;
pub mod resident;

pub use busy::{BUSY_TAU_MS, BUSY_WEIGHT, BusyAverage, resident_load};
pub use dp::dp_rank;
pub use keys::{SEED, hash_parts};
pub use load::{LoadBound, disaggregate, first_under_bound, load_bound};
pub use rebalance::{Loads, Rebalance};
pub use rendezvous::{Endpoint, Pick, Placement};
pub use residency::{Held, Resident, resident_key};
pub use resident::{
    Choice, DEFAULT_CANDIDATES, FALLBACK_PREFILL_TOKENS_PER_S, How, Knows, MoveCost, OverBound,
    Rule, Unseen, WAIT_MARGIN_MS,
};
