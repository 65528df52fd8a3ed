//! `tether replay`: an agent trace sent to a serving stack (Envoy + the
//! tether filter + ranks, ranks directly, or any OpenAI-compatible server),
//! session by session with its think and tool gaps, and measured into a
//! [`Report`](crate::report::Report).
//!
//! - [`plan`]: each session's dependencies and release times (pure);
//! - [`response`]: reading answers per API, streaming or not (pure);
//! - [`client`]: the HTTP client (hyper);
//! - [`scrape`]: rank configuration and busy time, the gateway's configuration;
//! - [`run`]: the driver (schedules, concurrency, progress, cancellation);
//! - [`assemble`]: its outcomes → the report.

pub mod assemble;
pub mod client;
pub mod plan;
pub mod resident;
pub mod response;
pub mod run;
pub mod scrape;

pub use client::Target;
pub use run::{Options, Outcomes, Route, Schedule, StartError, replay};
