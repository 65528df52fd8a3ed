//! `tether trace import`: a trace in a format users have, written as a tether trace.

use crate::import::{Format, ImportOptions, import, report_text};
use crate::name::{UnknownName, pick};
use crate::trace::{Api, IdForm, content_hash, write_trace_file};
use anyhow::Result;
use clap::Args as ClapArgs;
use std::path::PathBuf;

/// `tether trace import`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Source format: mooncake, bailian, agentx (or tether, to re-write one).
    #[arg(long, value_parser = Format::parse)]
    pub format: Format,
    /// Source file (AgentX: a .json trace, a JSONL file of traces, or a directory of .json files).
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the tether trace (JSONL).
    #[arg(long)]
    pub output: PathBuf,
    /// API the requests are sent with: chat, responses, messages, completions
    /// (default: chat; AgentX: the API the trace's models imply).
    #[arg(long, value_parser = parse_api)]
    pub api: Option<Api>,
    /// Mooncake: tokens per hash id.
    #[arg(long, default_value_t = ImportOptions::default().mooncake_block_size)]
    pub block_size: u32,
    /// Mooncake, Bailian: a continuation arriving within this many ms of its
    /// predecessor opens with a tool result (else with a user reply).
    #[arg(long, default_value_t = ImportOptions::default().tool_gap_ms)]
    pub tool_gap_ms: u64,
    /// Mooncake: a prefix after which this many distinct contents continue is a
    /// common head shared by unrelated conversations.
    #[arg(long, default_value_t = ImportOptions::default().head_fanout)]
    pub head_fanout: u32,
    /// AgentX: start session i at i × this many ms (default: no shared timeline).
    #[arg(long)]
    pub stagger_ms: Option<u64>,
    /// Write `hash_ids` as flat lists instead of compact `hash_runs`.
    #[arg(long)]
    pub flat_hash_ids: bool,
}

/// Parses an `--api` value.
pub fn parse_api(s: &str) -> Result<Api, UnknownName> {
    pick(&Api::ALL, Api::name, s, "API")
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let opts = ImportOptions {
        api: a.api,
        mooncake_block_size: a.block_size,
        tool_gap_ms: a.tool_gap_ms,
        head_fanout: a.head_fanout,
        agentx_stagger_ms: a.stagger_ms,
    };
    let trace = import(a.format, &a.input, &opts)?;
    let form = if a.flat_hash_ids {
        IdForm::Flat
    } else {
        IdForm::Runs
    };
    write_trace_file(&trace, form, &a.output)?;
    println!(
        "imported {} ({}): {} requests in {} sessions, {} agents -> {}",
        a.input.display(),
        a.format.title(),
        trace.requests().len(),
        trace.sessions().len(),
        trace.agents().len(),
        a.output.display()
    );
    if let Some(r) = report_text(&trace) {
        println!("{r}");
    }
    println!("content hash {}", content_hash(&trace));
    Ok(())
}
