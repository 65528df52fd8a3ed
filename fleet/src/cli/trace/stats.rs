//! `tether trace stats`: what a trace holds and what an infinite cache would hit.

use crate::import::{Format, ImportOptions, import, report_text};
use crate::trace::content_hash;
use crate::trace::stats::stats;
use anyhow::Result;
use clap::Args as ClapArgs;
use std::path::PathBuf;

/// `tether trace stats`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The trace.
    pub trace: PathBuf,
    /// Its format (a foreign trace is imported in memory with default options).
    #[arg(long, default_value = "tether", value_parser = Format::parse)]
    pub format: Format,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let trace = import(a.format, &a.trace, &ImportOptions::default())?;
    let s = stats(&trace);
    let report = report_text(&trace);
    let hash = content_hash(&trace);
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["content_hash"] = hash.into();
        v["source"] = trace.header().source.clone().unwrap_or_default();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("trace        {} ({hash})", a.trace.display());
    print!("{s}");
    if let Some(r) = report {
        println!("{r}");
    }
    Ok(())
}
