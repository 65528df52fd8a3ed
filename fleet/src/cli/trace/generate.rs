//! `tether trace generate`: a seeded synthetic agent trace.

use super::import::parse_api;
use crate::generate::{GenerateOptions, Preset, generate};
use crate::trace::stats::stats;
use crate::trace::{Api, IdForm, content_hash, write_trace_file};
use anyhow::{Result, bail};
use clap::Args as ClapArgs;
use std::path::PathBuf;

/// `tether trace generate`: a preset, then the flags given, each overriding
/// its option (defaults per preset: `docs/trace-format.md`, "Generated traces").
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Where to write the trace (JSONL).
    #[arg(long)]
    pub output: PathBuf,
    /// Options to start from: `demo` (small) or `coding-agent` (published statistics).
    #[arg(long, value_enum, default_value_t = Preset::Demo)]
    pub preset: Preset,
    /// PRNG seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Sessions.
    #[arg(long)]
    pub sessions: Option<u32>,
    /// Mean gap between session starts, ms (Poisson arrivals).
    #[arg(long, conflicts_with = "span_s")]
    pub session_gap_ms: Option<f64>,
    /// Sessions start uniformly at random over this span, s.
    #[arg(long)]
    pub span_s: Option<f64>,
    /// Tokens per block.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// API of every request: chat, responses, messages, completions.
    #[arg(long, value_parser = parse_api)]
    pub api: Option<Api>,
    /// Model name recorded on every request.
    #[arg(long)]
    pub model: Option<String>,
    /// Spread sessions round-robin over this many tenants (0 = none).
    #[arg(long)]
    pub tenants: Option<u32>,
    /// Give every session its own system prompt and tools (default: shared).
    #[arg(long)]
    pub own_system_prompts: bool,
    /// Distinct harness preambles shared across sessions (harness k has weight 1/(k+1)).
    #[arg(long)]
    pub harnesses: Option<u32>,
    /// Planner system prompt, tokens.
    #[arg(long)]
    pub system_tokens: Option<u32>,
    /// Planner tool schemas, tokens.
    #[arg(long)]
    pub tool_tokens: Option<u32>,
    /// Median requests per session (planner and subagents; log-normal), drawn first.
    #[arg(long)]
    pub session_requests: Option<f64>,
    /// σ of the log of the requests per session.
    #[arg(long)]
    pub session_requests_sigma: Option<f64>,
    /// Share of a subagent-using session's requests its subagents make.
    #[arg(long)]
    pub subagent_request_share: Option<f64>,
    /// Mean user turns per session (sessions not sized by --session-requests).
    #[arg(long)]
    pub user_turns: Option<f64>,
    /// Mean model calls per user turn (the tool loop).
    #[arg(long)]
    pub calls_per_turn: Option<f64>,
    /// Share of sessions that use subagents.
    #[arg(long)]
    pub subagent_share: Option<f64>,
    /// Mean subagents of a session that uses them.
    #[arg(long)]
    pub subagents: Option<f64>,
    /// Mean model calls of a subagent (sessions not sized by --session-requests).
    #[arg(long)]
    pub subagent_calls: Option<f64>,
    /// Subagent system prompt, tokens.
    #[arg(long)]
    pub subagent_system_tokens: Option<u32>,
    /// Subagent tool schemas, tokens.
    #[arg(long)]
    pub subagent_tool_tokens: Option<u32>,
    /// Median first user message, tokens.
    #[arg(long)]
    pub first_message_tokens: Option<f64>,
    /// Median later user message, tokens.
    #[arg(long)]
    pub user_message_tokens: Option<f64>,
    /// Median tool result, tokens.
    #[arg(long)]
    pub tool_result_tokens: Option<f64>,
    /// A tool result's median is at least this share of the room left in the context.
    #[arg(long)]
    pub tool_result_headroom: Option<f64>,
    /// Median subagent task message, tokens.
    #[arg(long)]
    pub task_tokens: Option<f64>,
    /// Median output, tokens.
    #[arg(long)]
    pub output_tokens: Option<f64>,
    /// σ of the log of every token-count distribution (log-normal).
    #[arg(long)]
    pub sigma: Option<f64>,
    /// Median tool time, ms.
    #[arg(long)]
    pub tool_ms: Option<f64>,
    /// Median user think time between turns, ms.
    #[arg(long)]
    pub think_ms: Option<f64>,
    /// σ of the log of the user think time.
    #[arg(long)]
    pub think_sigma: Option<f64>,
    /// Compact the context when a prompt would exceed this many tokens.
    #[arg(long)]
    pub max_context_tokens: Option<u32>,
    /// Median summary after a compaction, tokens.
    #[arg(long)]
    pub summary_tokens: Option<f64>,
    /// Assumed response time per output token, ms (lays out arrivals only).
    #[arg(long)]
    pub response_ms_per_token: Option<f64>,
    /// Assumed fixed response time, ms.
    #[arg(long)]
    pub response_ms_fixed: Option<f64>,
    /// Write `hash_ids` as flat lists instead of compact `hash_runs`.
    #[arg(long)]
    pub flat_hash_ids: bool,
}

impl Args {
    /// The generator options these flags say: the preset's, overridden by
    /// every flag given.
    pub fn options(&self) -> Result<GenerateOptions> {
        let mut o = self.preset.options();
        macro_rules! set {
            ($($field:ident = $flag:ident),* $(,)?) => {
                $(if let Some(v) = self.$flag.clone() { o.$field = v; })*
            };
        }
        set!(
            seed = seed,
            sessions = sessions,
            block_size = block_size,
            api = api,
            tenants = tenants,
            harnesses = harnesses,
            system_tokens = system_tokens,
            tool_tokens = tool_tokens,
            session_requests_sigma = session_requests_sigma,
            subagent_request_share = subagent_request_share,
            user_turns_mean = user_turns,
            calls_per_turn_mean = calls_per_turn,
            subagent_share = subagent_share,
            subagents_mean = subagents,
            subagent_calls_mean = subagent_calls,
            subagent_system_tokens = subagent_system_tokens,
            subagent_tool_tokens = subagent_tool_tokens,
            first_message_tokens = first_message_tokens,
            user_message_tokens = user_message_tokens,
            tool_result_tokens = tool_result_tokens,
            tool_result_headroom = tool_result_headroom,
            task_tokens = task_tokens,
            output_tokens = output_tokens,
            sigma = sigma,
            tool_ms = tool_ms,
            think_ms = think_ms,
            think_sigma = think_sigma,
            max_context_tokens = max_context_tokens,
            summary_tokens = summary_tokens,
            response_ms_per_token = response_ms_per_token,
            response_ms_fixed = response_ms_fixed,
        );
        if self.model.is_some() {
            o.model = self.model.clone();
        }
        if self.own_system_prompts {
            o.shared_system_prompt = false;
        }
        if let Some(gap) = self.session_gap_ms {
            o.session_gap_ms = gap;
            o.session_span_ms = None;
        }
        if let Some(span) = self.span_s {
            o.session_span_ms = Some(span * 1000.0);
        }
        if self.session_requests.is_some() {
            o.session_requests_median = self.session_requests;
        }
        if o.session_requests_median.is_some() {
            for (flag, given) in [
                ("--user-turns", self.user_turns.is_some()),
                ("--subagent-calls", self.subagent_calls.is_some()),
            ] {
                if given {
                    bail!(
                        "{flag} does not apply when sessions are sized by --session-requests \
                         (as in the coding-agent preset): turns and subagent calls follow from the size"
                    );
                }
            }
        }
        o.check()?;
        Ok(o)
    }
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    let trace = generate(&a.options()?)?;
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
