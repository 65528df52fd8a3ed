//! The agent-trace model (sessions → agents → requests with prefix-block ids),
//! its JSONL file format and its content hash. The format is defined in
//! `docs/trace-format.md`; this module is its only reader and writer.
//!
//! ```
//! use tether_fleet::trace::{Api, AgentSpec, RequestSpec, SessionSpec, TraceBuilder};
//! use tether_wire::TurnKind;
//!
//! let mut b = TraceBuilder::new(64).unwrap();
//! let s = b.session(SessionSpec { id: "s1".into(), start_ms: Some(0), ..Default::default() }).unwrap();
//! let main = b.agent(s, AgentSpec { id: "main".into(), agent_type: "main".into(), ..Default::default() }).unwrap();
//! b.request(main, RequestSpec::new(0, 100, 20, TurnKind::First), &[1, 2]).unwrap();
//! b.request(main, RequestSpec::new(900, 190, 5, TurnKind::Tool), &[1, 2, 3]).unwrap();
//! let trace = b.build().unwrap();
//! assert_eq!(trace.requests().len(), 2);
//! assert_eq!(trace.requests()[1].api, Api::Chat);
//! ```
//!
//! Memory: a request is ~80 bytes plus its share of the [`blocks::BlockStore`]
//! (a few nodes per turn): 901,513 generated agent requests take 270 MB.

pub mod blocks;
pub mod error;
pub mod io;
pub mod model;
pub mod stats;

pub use blocks::{BlockRef, BlockStore};
pub use error::{TraceError, TraceErrorKind};
pub use io::{IdForm, content_hash, read_trace, read_trace_from, write_trace, write_trace_file};
pub use model::{
    Agent, AgentId, AgentSpec, Api, EndReason, Header, ModelError, Request, RequestId, RequestSpec,
    Session, SessionId, SessionSpec, Trace, TraceBuilder,
};
pub use tether_wire::TurnKind;
