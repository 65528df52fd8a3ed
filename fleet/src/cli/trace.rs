//! `tether trace`: import, generate, inspect and synthesize agent traces.

pub mod generate;
pub mod import;
pub mod stats;
pub mod synth;

use clap::{Args as ClapArgs, Subcommand};

/// `tether trace …`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Convert a Mooncake, Qwen-Bailian or AgentX/WEKA trace into a tether trace.
    Import(import::Args),
    /// Generate a seeded synthetic agent trace (planner, subagents, tool loops).
    Generate(Box<generate::Args>),
    /// Summarize a trace: sessions, agents, requests, tokens, derivation, ideal hit ratio.
    Stats(stats::Args),
    /// Print the HTTP requests a replay sends for a trace (JSONL), for inspection.
    Synth(synth::Args),
}

/// Runs `tether trace …`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Import(a) => import::run(a),
        Cmd::Generate(a) => generate::run(*a),
        Cmd::Stats(a) => stats::run(a),
        Cmd::Synth(a) => synth::run(a),
    }
}
