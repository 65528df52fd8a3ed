//! TraceLab traces (`uw-syfi/TraceLab`): real Claude Code and Codex sessions,
//! one JSON object per LLM *round* (call), with token accounting, tool calls
//! and timing events but no content and no block ids.
//!
//! Fields read (the rest of a round is ignored): `session_id`, `project`,
//! `round_index`, `provider` (`claude` / `codex`), `model`,
//! `input_tokens_total`, `prefix_tokens` (the cached/prefix portion),
//! `newly_append_tokens`, `output_tokens`, `first_input_event_type`,
//! `tools[]` (a round that called a tool ended with a tool call) and
//! `timing_events[]` (`event_type` `user_message` / `tool_result` are inputs,
//! `reasoning` / `text` / `tool_call` model output; `timestamp` ISO 8601).
//!
//! What the importer has to assume, since TraceLab records no content:
//! - **Sessions.** Rounds with one (`project`, `session_id`) form a session with
//!   one agent, in `round_index` order (file order breaks ties; TraceLab
//!   itself says `(session_id, round_index)` is not unique). Subagents are not
//!   told apart.
//! - **Prompts.** A round's prompt continues the session's previous round for
//!   `prefix_tokens` tokens (what the provider served from its prefix cache, so
//!   at most the shared prefix) and is new after that; without `prefix_tokens`,
//!   for `input_tokens_total − newly_append_tokens`, else for the previous
//!   prompt's length. Block ids (64 tokens) are made up from that: the full
//!   blocks of the shared part repeat the previous round's ids, the rest are
//!   fresh. A compaction (a short prefix) so starts a new chain, as it does in
//!   the engine.
//! - **Times.** A round is sent at its latest input event before its first
//!   output event (else its first timed event); sessions keep the recorded
//!   wall-clock timeline, shifted so the earliest round is at 0. A round with no
//!   timestamp is sent when its predecessor was (counted).
//! - **Turns.** The first round opens with `first`; a round whose first input
//!   event is a tool result (or that has tool results and no user message)
//!   with `tool`; any other with `user`. A round with tool calls ends with
//!   `tool_call`, else `end_turn`.
//! - **API.** Without `--api`: `claude` rounds Anthropic Messages, `codex`
//!   rounds OpenAI Responses, others Chat.

use super::ImportOptions;
use crate::trace::{
    Api, EndReason, Header, RequestSpec, Trace, TraceBuilder, TraceError, TurnKind,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::Path;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Tokens per made-up block id.
pub const BLOCK_SIZE: u32 = 64;

/// Prompts longer than this (2^24 tokens, beyond any model's window) are
/// clamped to it and counted: a corrupt count must not make millions of ids.
pub const MAX_PROMPT_TOKENS: u64 = 1 << 24;

/// One round (LLM call) as TraceLab records it (fields tether reads).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Round {
    /// Session id (not unique across projects).
    pub session_id: String,
    /// Project the session ran in.
    #[serde(default)]
    pub project: Option<String>,
    /// Position in the session.
    #[serde(default)]
    pub round_index: Option<i64>,
    /// `claude` or `codex`.
    #[serde(default)]
    pub provider: Option<String>,
    /// Model.
    #[serde(default)]
    pub model: Option<String>,
    /// Prompt tokens.
    pub input_tokens_total: u64,
    /// Cached / prefix part of the prompt.
    #[serde(default)]
    pub prefix_tokens: Option<u64>,
    /// Newly appended part of the prompt.
    #[serde(default)]
    pub newly_append_tokens: Option<u64>,
    /// Generated tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Type of the round's first input event.
    #[serde(default)]
    pub first_input_event_type: Option<String>,
    /// Tool results in the round's input.
    #[serde(default)]
    pub current_tool_result_count: Option<u64>,
    /// User messages in the round's input.
    #[serde(default)]
    pub current_user_message_count: Option<u64>,
    /// Tool calls the round made.
    #[serde(default)]
    pub tools: Vec<serde_json::Value>,
    /// Timing events.
    #[serde(default)]
    pub timing_events: Vec<TimingEvent>,
}

/// One timing event.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TimingEvent {
    /// `user_message`, `tool_result`, `reasoning`, `text`, `tool_call`, …
    #[serde(default)]
    pub event_type: Option<String>,
    /// ISO 8601.
    #[serde(default)]
    pub timestamp: Option<String>,
}

/// What the import found, recorded in the header's `source`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TracelabReport {
    /// Rounds (requests).
    pub rounds: usize,
    /// Sessions.
    pub sessions: usize,
    /// Rounds per provider.
    pub providers: BTreeMap<String, usize>,
    /// Rounds with no parseable timestamp (sent with their predecessor).
    pub untimed: usize,
    /// Rounds whose shared prefix was shorter than the previous round's prompt
    /// by more than a block (compaction, or the provider's cache lost it).
    pub prefix_breaks: usize,
    /// Rounds whose prompt exceeds [`MAX_PROMPT_TOKENS`] or whose prefix claims
    /// more than the prompt (clamped).
    pub clamped: usize,
}

/// Imports a TraceLab JSONL file.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Trace, TraceError> {
    let name = path.display().to_string();
    let rounds = parse(crate::trace::io::open_text(path)?, &name)?;
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
    import_rounds(rounds, opts, &name, file.as_deref())
}

/// Parses JSONL rounds (`(line, round)`); `name` names the source in errors.
pub fn parse(reader: impl BufRead, name: &str) -> Result<Vec<(usize, Round)>, TraceError> {
    let mut rounds = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| TraceError::at(name, Some(i + 1), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: Round = serde_json::from_str(&line).map_err(|e| {
            TraceError::invalid(name, Some(i + 1), format!("not a TraceLab round: {e}"))
        })?;
        rounds.push((i + 1, r));
    }
    Ok(rounds)
}

/// Milliseconds since the Unix epoch of an ISO 8601 / RFC 3339 timestamp; a
/// timestamp without an offset is UTC (as TraceLab normalizes them).
pub fn parse_ms(ts: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(ts, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(&format!("{ts}Z"), &Rfc3339))
        .ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// When a round was sent: its latest input event at or before its first
/// output event, else its first timed event.
fn sent_ms(r: &Round) -> Option<i64> {
    let timed = || {
        r.timing_events.iter().filter_map(|e| {
            Some((
                e.event_type.as_deref().unwrap_or(""),
                parse_ms(e.timestamp.as_deref()?)?,
            ))
        })
    };
    let first_output = timed()
        .filter(|(k, _)| matches!(*k, "reasoning" | "text" | "tool_call"))
        .map(|(_, t)| t)
        .min();
    let input = timed()
        .filter(|(k, t)| {
            matches!(*k, "user_message" | "tool_result") && first_output.is_none_or(|o| *t <= o)
        })
        .map(|(_, t)| t)
        .max();
    input.or_else(|| timed().map(|(_, t)| t).min())
}

fn opened_by(r: &Round, first: bool) -> TurnKind {
    if first {
        return TurnKind::First;
    }
    let tools = r.current_tool_result_count.unwrap_or(0);
    let users = r.current_user_message_count.unwrap_or(0);
    match r.first_input_event_type.as_deref() {
        Some("tool_result") => TurnKind::Tool,
        Some("user_message") => TurnKind::User,
        _ if tools > 0 && users == 0 => TurnKind::Tool,
        _ => TurnKind::User,
    }
}

fn api_of(r: &Round, opts: &ImportOptions) -> Api {
    opts.api.unwrap_or(match r.provider.as_deref() {
        Some("claude") => Api::Messages,
        Some("codex") => Api::Responses,
        _ => Api::Chat,
    })
}

/// A session's rounds in order: `(line, round, send time in Unix ms)`.
type SessionRounds = Vec<(usize, Round, Option<i64>)>;

/// Builds the trace from parsed rounds (`(line, round)`).
pub fn import_rounds(
    rounds: Vec<(usize, Round)>,
    opts: &ImportOptions,
    name: &str,
    file: Option<&str>,
) -> Result<Trace, TraceError> {
    if rounds.is_empty() {
        return Err(TraceError::invalid(name, None, "the trace has no rounds"));
    }
    let mut rep = TracelabReport {
        rounds: rounds.len(),
        ..TracelabReport::default()
    };
    // Sessions in order of first appearance, rounds by (round_index, file order).
    let mut order: Vec<(String, String)> = Vec::new();
    let mut sessions: HashMap<(String, String), Vec<(usize, Round)>> = HashMap::new();
    for (line, r) in rounds {
        *rep.providers
            .entry(r.provider.clone().unwrap_or_else(|| "unknown".to_owned()))
            .or_default() += 1;
        let key = (r.project.clone().unwrap_or_default(), r.session_id.clone());
        let v = sessions.entry(key.clone()).or_default();
        if v.is_empty() {
            order.push(key);
        }
        v.push((line, r));
    }
    // Send times, carried forward over untimed rounds.
    let mut timed: Vec<(String, SessionRounds)> = Vec::new();
    for key in order {
        let mut v = sessions.remove(&key).unwrap_or_default();
        v.sort_by_key(|(line, r)| (r.round_index.unwrap_or(i64::MAX), *line));
        let mut last = None;
        let v = v
            .into_iter()
            .map(|(line, r)| {
                let t = sent_ms(&r).or_else(|| {
                    rep.untimed += 1;
                    last
                });
                last = t.or(last);
                (line, r, t)
            })
            .collect();
        let id = if key.0.is_empty() {
            key.1
        } else {
            format!("{}/{}", key.0, key.1)
        };
        timed.push((id, v));
    }
    let origin = timed
        .iter()
        .flat_map(|(_, v)| v.iter().filter_map(|(_, _, t)| *t))
        .min()
        .unwrap_or(0);
    let mut b = TraceBuilder::with_header(Header {
        block_size: BLOCK_SIZE,
        name: file.map(str::to_owned),
        source: None,
    })
    .map_err(|e| TraceError::at(name, None, e))?;
    let bs = u64::from(BLOCK_SIZE);
    let mut next_id = 0u64;
    for (id, rounds) in timed {
        let start = rounds.iter().find_map(|(_, _, t)| *t).unwrap_or(origin);
        let aid = b
            .chat_session(id, Some(ms_between(origin, start)))
            .map_err(|e| TraceError::at(name, rounds.first().map(|r| r.0), e))?;
        rep.sessions += 1;
        let mut prev: Vec<u64> = Vec::new();
        let mut prev_input = 0u64;
        let mut prev_end: Option<i64> = None;
        for (k, (line, r, t)) in rounds.iter().enumerate() {
            let input = r.input_tokens_total.min(MAX_PROMPT_TOKENS);
            let shared = r
                .prefix_tokens
                .or_else(|| r.newly_append_tokens.map(|n| input.saturating_sub(n)))
                .unwrap_or(prev_input);
            if shared > input || r.input_tokens_total > MAX_PROMPT_TOKENS {
                rep.clamped += 1;
            }
            let shared = shared.min(input).min(prev_input);
            let keep = ((shared / bs) as usize).min(prev.len());
            if k > 0 && prev_input >= shared + bs {
                rep.prefix_breaks += 1;
            }
            let blocks = input.div_ceil(bs) as usize;
            let mut ids: Vec<u64> = prev.get(..keep).unwrap_or_default().to_vec();
            while ids.len() < blocks {
                ids.push(next_id);
                next_id += 1;
            }
            let at = t.unwrap_or(start);
            let spec = RequestSpec {
                gap_ms: prev_end.map(|e| ms_between(e, at)),
                ended_by: Some(if r.tools.is_empty() {
                    EndReason::EndTurn
                } else {
                    EndReason::ToolCall
                }),
                api: api_of(r, opts),
                model: r.model.clone(),
                ..RequestSpec::new(
                    ms_between(start, at),
                    u32::try_from(input).unwrap_or(u32::MAX),
                    u32::try_from(r.output_tokens).unwrap_or(u32::MAX),
                    opened_by(r, k == 0),
                )
            };
            b.request(aid, spec, &ids)
                .map_err(|e| TraceError::at(name, Some(*line), e))?;
            prev_end = last_output_ms(r).or(Some(at));
            prev = ids;
            prev_input = input;
        }
    }
    b.header_mut().source = Some(serde_json::json!({
        "format": "tracelab",
        "file": file,
        "report": rep,
    }));
    b.build().map_err(|e| TraceError::at(name, None, e))
}

/// `to − from` in ms, 0 when `to` is earlier.
fn ms_between(from: i64, to: i64) -> u64 {
    u64::try_from(to.saturating_sub(from)).unwrap_or(0)
}

/// The round's last model output.
fn last_output_ms(r: &Round) -> Option<i64> {
    r.timing_events
        .iter()
        .filter(|e| {
            matches!(
                e.event_type.as_deref(),
                Some("reasoning" | "text" | "tool_call")
            )
        })
        .filter_map(|e| parse_ms(e.timestamp.as_deref()?))
        .max()
}

/// The import report recorded in a trace imported from TraceLab, if any.
pub fn report_of(trace: &Trace) -> Option<TracelabReport> {
    super::recorded_report(trace, super::Format::Tracelab)
}

impl std::fmt::Display for TracelabReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let providers = self
            .providers
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        write!(
            f,
            "{} TraceLab rounds ({providers}) in {} sessions; prompts continue the previous round for its prefix tokens (block ids made up, {BLOCK_SIZE} tokens); {} prefix breaks (compaction or lost cache); {} untimed rounds sent with their predecessor; {} clamped",
            self.rounds, self.sessions, self.prefix_breaks, self.untimed, self.clamped
        )
    }
}

#[cfg(test)]
pub(crate) mod tests;
