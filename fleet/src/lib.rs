//! tether's fleet tools: agent traces (model, importers, generator, request
//! synthesis), replay and compare, the fleet simulator and the P/D planner —
//! the `tether` CLI.
//!
//! Everything here runs the *same* placement ([`tether_placement`]) and
//! retention policy ([`tether_engine`]) as the gateway and the ranks; nothing
//! is re-implemented.
//!
//! - [`trace`]: the agent-trace model, its JSONL format (`docs/trace-format.md`)
//!   and content hash;
//! - [`import`]: Mooncake, Qwen-Bailian and AgentX/WEKA importers, with the
//!   conversation derivation for session-less traces;
//! - [`generate`]: seeded agent-trace generator;
//! - [`synth`]: the HTTP request of a trace request, in every API, with
//!   harness identities;
//! - [`replay`]: `tether replay`, a trace sent to a serving stack and measured;
//! - [`report`]: replay reports (JSON, markdown, SVG plots) and `compare`;
//! - [`quantile`]: the one quantile definition (nearest rank) and its
//!   histogram form, used by every report, plan, summary and benchmark;
//! - [`name`]: names from closed lists (formats, policies, modes) and their typed error;
//! - [`profile`]: GPU profiles from tether JSON or Dynamo's profiling NPZ;
//! - [`plan`]: the P/D planner (replica counts per interval against
//!   objectives and a cost target, verified by simulation);
//! - [`sim`]: the fleet simulator — a trace on simulated ranks (the rank's
//!   engine on the real retention policy) placed by the gateway's placement.

pub mod cli;
pub mod generate;
pub mod import;
pub mod name;
pub mod plan;
pub mod profile;
pub mod quantile;
pub mod replay;
pub mod report;
pub mod sim;
pub mod synth;
pub mod trace;
