//! The one error of reading, writing and importing traces: what went wrong, in which file, on which line.

use super::model::ModelError;
use std::fmt;
use thiserror::Error;

/// What went wrong.
#[derive(Debug, Error)]
pub enum TraceErrorKind {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A line is not the JSON its format requires.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// The content breaks the model's rules.
    #[error("{0}")]
    Model(#[from] ModelError),
    /// The content breaks the format's rules.
    #[error("{0}")]
    Invalid(String),
}

/// An error naming its file and (when it has one) its 1-based line.
#[derive(Debug, Error)]
pub struct TraceError {
    /// The file (or a name for the stream).
    pub file: String,
    /// 1-based line number.
    pub line: Option<usize>,
    /// What went wrong.
    #[source]
    pub kind: TraceErrorKind,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{}: {}", self.file, l, self.kind),
            None => write!(f, "{}: {}", self.file, self.kind),
        }
    }
}

impl TraceError {
    /// An error at a line of a file.
    pub fn at(file: &str, line: Option<usize>, kind: impl Into<TraceErrorKind>) -> Self {
        Self {
            file: file.to_owned(),
            line,
            kind: kind.into(),
        }
    }

    /// A format-rule error at a line.
    pub fn invalid(file: &str, line: Option<usize>, msg: impl Into<String>) -> Self {
        Self::at(file, line, TraceErrorKind::Invalid(msg.into()))
    }
}
