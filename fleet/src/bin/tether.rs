//! `tether`: agent traces, replay, compare, gateway, simulation and planning.
//! Each subcommand lives in its own module under `tether_fleet::cli`; flags
//! are documented in `docs/cli.md`.

use clap::{Parser, Subcommand};
use tether_fleet::cli;

#[derive(Debug, Parser)]
#[command(
    name = "tether",
    version,
    about = "Agent-aware serving: traces, replay, simulation, planning"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Agent traces: import, generate, stats, synth.
    Trace(cli::trace::Args),
    /// Replay a trace against a serving stack and write its report.
    Replay(cli::replay::Args),
    /// Render a ready Envoy bootstrap for your ranks (and optionally run Envoy).
    Gateway(cli::gateway::Args),
    /// Compare reports of one trace (replays, simulations): configuration changes next to metric changes.
    Compare(cli::compare::Args),
    /// Routing policies and cache modes side by side on a simulated fleet.
    Simulate(Box<cli::simulate::Args>),
    /// Plan prefill and decode replicas against latency objectives and a cost target.
    Plan(Box<cli::plan::Args>),
}

/// Runs the subcommand; an error is the user's to read: printed once with its
/// causes (`error: what: why`), no backtrace, exit status 1.
fn main() -> std::process::ExitCode {
    let done = match Cli::parse().cmd {
        Command::Trace(a) => cli::trace::run(a),
        Command::Replay(a) => cli::replay::run(a),
        Command::Compare(a) => cli::compare::run(a),
        Command::Gateway(a) => cli::gateway::run(a),
        Command::Simulate(a) => cli::simulate::run(*a),
        Command::Plan(a) => cli::plan::run(*a),
    };
    match done {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
