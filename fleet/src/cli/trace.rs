//! `tether trace`: import, generate, inspect and synthesize agent traces.

pub mod import;
pub mod stats;

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
    /// Summarize a trace: sessions, agents, requests, tokens, derivation, ideal hit ratio.
    Stats(stats::Args),
}

/// Runs `tether trace …`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Import(a) => import::run(a),
        Cmd::Stats(a) => stats::run(a),
    }
}
