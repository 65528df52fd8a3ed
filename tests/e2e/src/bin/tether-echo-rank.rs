//! `tether-echo-rank`: a stand-in inference rank that echoes which rank it is
//! and what it received. Prints `READY <ip:port>` on stdout once listening.

use anyhow::Context;
use clap::Parser;
use std::io::Write;

#[derive(Parser)]
#[command(about = "Answer every request with JSON naming this rank and echoing headers and body")]
struct Args {
    /// Rank name reported in every answer.
    #[arg(long)]
    name: String,
    /// Address to listen on; port 0 picks an ephemeral port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Also write the bound address to this file (for scripts).
    #[arg(long)]
    ready_file: Option<std::path::PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    if let Some(f) = &args.ready_file {
        std::fs::write(f, addr.to_string()).with_context(|| format!("writing {}", f.display()))?;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {addr}")?;
    out.flush()?;
    drop(out);
    tether_e2e::echo::serve(listener, args.name)
        .await
        .context("serving")
}
