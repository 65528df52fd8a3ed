//! Replay reports: what one run of a trace against one serving configuration
//! measured, in a JSON document (`docs/report.md` defines every field) that
//! `tether compare` reads back, plus its markdown and SVG renderings.
//!
//! - [`model`]: the document ([`Report`]) and its parts;
//! - [`observe`]: one request's outcome ([`Observation`]) as a replay client or
//!   a simulator records it;
//! - [`build`]: observations + trace + serving configuration → [`Report`]
//!   (hit ratios beside the trace's ideal, latency quantiles, per-rank load,
//!   avoidable re-prefill, cost);
//! - [`config`]: the serving configuration in force, flattened to keys and hashed;
//! - [`markdown`], [`plot`]: renderings; [`compare`]: reports side by side.

pub mod build;
pub mod compare;
pub mod config;
pub mod markdown;
pub mod model;
pub mod observe;
pub mod plot;

pub use build::{BuildInput, build};
pub use config::ServingConfig;
pub use model::{Dist, Report};
pub use observe::{Clock, ErrorKind, Observation, Outcome, Served};
