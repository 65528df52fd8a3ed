//! Named starting points for the generator: the small demo shape and a corpus
//! with the published statistics of coding-agent traffic.

use super::GenerateOptions;
use crate::trace::Api;

/// Options a generation starts from before its flags override them
/// (`docs/trace-format.md`, "Generated traces", gives every value's source).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// A few small sessions: examples, tests and demos.
    #[default]
    Demo,
    /// Coding-agent traffic as published (AgentX: median 43 requests a
    /// session, 142 K input and 444 output tokens a request, subagents in
    /// 44 % of sessions, prompts up to 200 K; heavy-tailed sessions and think
    /// times; a few harness preambles shared by every user).
    CodingAgent,
}

impl Preset {
    /// The options this preset names.
    pub fn options(self) -> GenerateOptions {
        match self {
            Self::Demo => GenerateOptions::default(),
            Self::CodingAgent => coding_agent(),
        }
    }
}

/// The coding-agent corpus. Each value's source or assumption is in
/// `docs/trace-format.md` (one table); the statistics test in
/// `generate/tests.rs` holds the result to the published figures.
fn coding_agent() -> GenerateOptions {
    GenerateOptions {
        sessions: 200,
        session_span_ms: Some(2.0 * 3_600_000.0),
        api: Api::Messages,
        harnesses: 4,
        system_tokens: 4_000,
        tool_tokens: 16_000,
        session_requests_median: Some(43.0),
        session_requests_sigma: 0.82,
        subagent_request_share: 0.35,
        calls_per_turn_mean: 7.83,
        subagent_share: 0.44,
        subagents_mean: 2.0,
        subagent_system_tokens: 2_000,
        subagent_tool_tokens: 10_000,
        first_message_tokens: 3_000.0,
        user_message_tokens: 150.0,
        tool_result_tokens: 300.0,
        tool_result_headroom: 0.05,
        task_tokens: 400.0,
        output_tokens: 444.0,
        sigma: 1.0,
        tool_ms: 1_500.0,
        think_ms: 60_000.0,
        think_sigma: 1.5,
        max_context_tokens: 190_000,
        summary_tokens: 40_000.0,
        ..GenerateOptions::default()
    }
}
