//! The trace a subcommand reads (`TRACE` or `--trace`, `--format`): one clap
//! struct every subcommand flattens, so each takes its trace the same way.

use crate::import::{Format, ImportOptions, import};
use crate::replay::assemble::Source;
use crate::trace::Trace;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::path::{Path, PathBuf};

/// The trace and its format.
#[derive(Debug, Clone, ClapArgs)]
pub struct TraceArgs {
    /// The trace.
    #[arg(value_name = "TRACE", required_unless_present = "trace_flag")]
    trace: Option<PathBuf>,
    /// The trace, given as a flag instead (same as TRACE).
    #[arg(
        long = "trace",
        id = "trace_flag",
        value_name = "TRACE",
        conflicts_with = "trace"
    )]
    trace_flag: Option<PathBuf>,
    /// Its format (a foreign trace is imported in memory with default options).
    #[arg(long, default_value = "tether", value_parser = Format::parse)]
    pub format: Format,
}

impl TraceArgs {
    /// The file, as given (clap requires one of the two spellings).
    pub fn path(&self) -> &Path {
        self.trace
            .as_deref()
            .or(self.trace_flag.as_deref())
            .unwrap_or(Path::new(""))
    }

    /// Reads it (a foreign format imported with default options).
    pub fn read(&self) -> Result<Trace> {
        Ok(import(self.format, self.path(), &ImportOptions::default())?)
    }

    /// Where it came from, for reports.
    pub fn source(&self) -> Source {
        Source {
            path: self.path().display().to_string(),
            format: self.format.name().to_owned(),
        }
    }
}
