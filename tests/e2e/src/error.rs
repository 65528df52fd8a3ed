//! The harness's one error type: every variant reads as a sentence naming what failed.

use std::path::PathBuf;

/// Why a harness operation failed. Messages carry enough context (paths, log
/// tails) to diagnose a failing end-to-end test without re-running it.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{what} not found at {path}: {hint}")]
    MissingArtifact {
        what: &'static str,
        path: PathBuf,
        hint: &'static str,
    },
    #[error("bootstrap template has unresolved placeholders: {0:?}")]
    Unresolved(Vec<String>),
    #[error("could not start {what}: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} exited before it was ready ({status}); log tail:\n{log}")]
    ExitedEarly {
        what: String,
        status: String,
        log: String,
    },
    #[error("{what} was not ready within {secs} s; log tail:\n{log}")]
    NotReady {
        what: String,
        secs: u64,
        log: String,
    },
    #[error("envoy rejected the bootstrap ({status}); log tail:\n{log}")]
    Invalid { status: String, log: String },
    #[error("I/O error during {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("HTTP exchange with {addr} failed: {why}")]
    Http { addr: String, why: String },
    #[error("HTTP exchange with {addr} timed out after {secs} s")]
    Timeout { addr: String, secs: u64 },
    #[error("unexpected reply from {what}: {why}")]
    Protocol { what: String, why: String },
    #[error("the chain around the tether filter does not match its outputs:\n  {}", .0.join("\n  "))]
    Outputs(Vec<String>),
}

/// Attach a "during <what>" context to an I/O error.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
}
