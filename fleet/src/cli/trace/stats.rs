//! `tether trace stats`: what a trace holds and what an infinite cache would hit.

use crate::cli::input::TraceArgs;
use crate::import::report_text;
use crate::trace::content_hash;
use crate::trace::stats::stats;
use anyhow::Result;
use clap::Args as ClapArgs;

/// `tether trace stats`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The trace and its format.
    #[command(flatten)]
    pub input: TraceArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let trace = a.input.read()?;
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
    println!("trace        {} ({hash})", a.input.path().display());
    print!("{s}");
    if let Some(r) = report {
        println!("{r}");
    }
    Ok(())
}
