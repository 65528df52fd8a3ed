//! `tether`: agent traces, replay, compare, gateway, simulation and planning.
//! Each subcommand lives in its own module under `tether_fleet::cli`; flags
//! are documented in `docs/cli.md`.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
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
    /// Compare replay reports of one trace: configuration changes next to metric changes.
    Compare(cli::compare::Args),
    /// Routing policies and cache modes side by side on a simulated fleet.
    Simulate(Box<cli::simulate::Args>),
    /// Plan prefill and decode replicas against latency objectives and a cost target.
    Plan(Box<cli::plan::Args>),
}

fn main() -> ExitCode {
    let result = match Cli::parse().cmd {
        Command::Trace(a) => cli::trace::run(a),
        Command::Replay(a) => cli::replay::run(a),
        Command::Compare(a) => cli::compare::run(a),
        Command::Gateway(a) => cli::gateway::run(a),
        Command::Simulate(a) => cli::simulate::run(*a),
        Command::Plan(a) => cli::plan::run(*a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// A user error as one line: the message and each cause that adds something
/// (an error that already quotes its source is not followed by it again). No
/// backtrace: errors are the user's to fix; bugs panic, and panics keep theirs.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}
