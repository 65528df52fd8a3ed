//! `tether trace generate`: a seeded synthetic agent trace.

use super::import::parse_api;
use crate::generate::{GenerateOptions, generate};
use crate::trace::stats::stats;
use crate::trace::{Api, IdForm, content_hash, write_trace_file};
use anyhow::Result;
use clap::Args as ClapArgs;
use std::path::PathBuf;

fn d() -> GenerateOptions {
    GenerateOptions::default()
}

/// `tether trace generate` (defaults: `docs/trace-format.md`, "Generated traces").
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Where to write the trace (JSONL).
    #[arg(long)]
    pub output: PathBuf,
    /// PRNG seed.
    #[arg(long, default_value_t = d().seed)]
    pub seed: u64,
    /// Sessions.
    #[arg(long, default_value_t = d().sessions)]
    pub sessions: u32,
    /// Mean gap between session starts, ms (Poisson arrivals).
    #[arg(long, default_value_t = d().session_gap_ms)]
    pub session_gap_ms: f64,
    /// Tokens per block.
    #[arg(long, default_value_t = d().block_size)]
    pub block_size: u32,
    /// API of every request: chat, responses, messages, completions.
    #[arg(long, default_value = "chat", value_parser = parse_api)]
    pub api: Api,
    /// Model name recorded on every request.
    #[arg(long)]
    pub model: Option<String>,
    /// Spread sessions round-robin over this many tenants (0 = none).
    #[arg(long, default_value_t = d().tenants)]
    pub tenants: u32,
    /// Give every session its own system prompt and tools (default: one shared by all).
    #[arg(long)]
    pub own_system_prompts: bool,
    /// Planner system prompt, tokens.
    #[arg(long, default_value_t = d().system_tokens)]
    pub system_tokens: u32,
    /// Planner tool schemas, tokens.
    #[arg(long, default_value_t = d().tool_tokens)]
    pub tool_tokens: u32,
    /// Mean user turns per session.
    #[arg(long, default_value_t = d().user_turns_mean)]
    pub user_turns: f64,
    /// Mean model calls per user turn (the tool loop).
    #[arg(long, default_value_t = d().calls_per_turn_mean)]
    pub calls_per_turn: f64,
    /// Share of sessions that use subagents.
    #[arg(long, default_value_t = d().subagent_share)]
    pub subagent_share: f64,
    /// Mean subagents of a session that uses them.
    #[arg(long, default_value_t = d().subagents_mean)]
    pub subagents: f64,
    /// Mean model calls of a subagent.
    #[arg(long, default_value_t = d().subagent_calls_mean)]
    pub subagent_calls: f64,
    /// Subagent system prompt, tokens.
    #[arg(long, default_value_t = d().subagent_system_tokens)]
    pub subagent_system_tokens: u32,
    /// Subagent tool schemas, tokens.
    #[arg(long, default_value_t = d().subagent_tool_tokens)]
    pub subagent_tool_tokens: u32,
    /// Median first user message, tokens.
    #[arg(long, default_value_t = d().first_message_tokens)]
    pub first_message_tokens: f64,
    /// Median later user message, tokens.
    #[arg(long, default_value_t = d().user_message_tokens)]
    pub user_message_tokens: f64,
    /// Median tool result, tokens.
    #[arg(long, default_value_t = d().tool_result_tokens)]
    pub tool_result_tokens: f64,
    /// Median subagent task message, tokens.
    #[arg(long, default_value_t = d().task_tokens)]
    pub task_tokens: f64,
    /// Median output, tokens.
    #[arg(long, default_value_t = d().output_tokens)]
    pub output_tokens: f64,
    /// σ of the log of every token-count distribution (log-normal).
    #[arg(long, default_value_t = d().sigma)]
    pub sigma: f64,
    /// Median tool time, ms.
    #[arg(long, default_value_t = d().tool_ms)]
    pub tool_ms: f64,
    /// Median user think time between turns, ms.
    #[arg(long, default_value_t = d().think_ms)]
    pub think_ms: f64,
    /// Compact the context when a prompt would exceed this many tokens.
    #[arg(long, default_value_t = d().max_context_tokens)]
    pub max_context_tokens: u32,
    /// Median summary after a compaction, tokens.
    #[arg(long, default_value_t = d().summary_tokens)]
    pub summary_tokens: f64,
    /// Assumed response time per output token, ms (lays out arrivals only).
    #[arg(long, default_value_t = d().response_ms_per_token)]
    pub response_ms_per_token: f64,
    /// Assumed fixed response time, ms.
    #[arg(long, default_value_t = d().response_ms_fixed)]
    pub response_ms_fixed: f64,
    /// Write `hash_ids` as flat lists instead of compact `hash_runs`.
    #[arg(long)]
    pub flat_hash_ids: bool,
}

impl Args {
    /// The generator options these flags say.
    pub fn options(&self) -> GenerateOptions {
        GenerateOptions {
            seed: self.seed,
            sessions: self.sessions,
            session_gap_ms: self.session_gap_ms,
            block_size: self.block_size,
            api: self.api,
            model: self.model.clone(),
            tenants: self.tenants,
            shared_system_prompt: !self.own_system_prompts,
            system_tokens: self.system_tokens,
            tool_tokens: self.tool_tokens,
            user_turns_mean: self.user_turns,
            calls_per_turn_mean: self.calls_per_turn,
            subagent_share: self.subagent_share,
            subagents_mean: self.subagents,
            subagent_calls_mean: self.subagent_calls,
            subagent_system_tokens: self.subagent_system_tokens,
            subagent_tool_tokens: self.subagent_tool_tokens,
            first_message_tokens: self.first_message_tokens,
            user_message_tokens: self.user_message_tokens,
            tool_result_tokens: self.tool_result_tokens,
            task_tokens: self.task_tokens,
            output_tokens: self.output_tokens,
            sigma: self.sigma,
            tool_ms: self.tool_ms,
            think_ms: self.think_ms,
            max_context_tokens: self.max_context_tokens,
            summary_tokens: self.summary_tokens,
            response_ms_per_token: self.response_ms_per_token,
            response_ms_fixed: self.response_ms_fixed,
        }
    }
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let trace = generate(&a.options())?;
    let form = if a.flat_hash_ids {
        IdForm::Flat
    } else {
        IdForm::Runs
    };
    write_trace_file(&trace, form, &a.output)?;
    let s = stats(&trace);
    println!(
        "generated {} requests in {} sessions ({} subagents) -> {}; content hash {}",
        s.requests,
        s.sessions,
        s.subagents,
        a.output.display(),
        content_hash(&trace)
    );
    Ok(())
}
