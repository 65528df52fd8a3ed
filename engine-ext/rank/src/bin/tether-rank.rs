//! `tether-rank`: a simulated OpenAI/Anthropic-compatible engine rank whose KV
//! cache is tether's retention policy. Flags: `docs/rank.md`. Prints
//! `READY <ip:port>` on stdout once listening.

use anyhow::Context;
use clap::Parser;
use std::io::Write;
use tether_rank::config::{Args, RankConfig};
use tether_rank::server::{Rank, serve};

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut cfg = RankConfig::from_args(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.args.threads)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.args.listen)
            .await
            .with_context(|| format!("--listen {}: cannot bind", cfg.args.listen))?;
        let addr = listener.local_addr()?;
        cfg.args.rank_id.get_or_insert_with(|| addr.to_string());
        if let Some(f) = &cfg.args.ready_file {
            std::fs::write(f, addr.to_string())
                .with_context(|| format!("--ready-file {}: cannot write", f.display()))?;
        }
        let rank = Rank::new(cfg)?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY {addr}")?;
        out.flush()?;
        drop(out);
        serve(listener, rank).await.context("serving")
    })
}
