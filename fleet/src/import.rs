//! Importers: the trace formats users already have, turned into the agent-trace model.
//!
//! Each importer states what its source records and what it has to assume
//! (`docs/trace-format.md`, "Importers"); what it derived is recorded in the
//! trace header's `source` so `tether trace stats` can show it.

pub mod agentx;
pub mod bailian;
pub mod derive;
mod fuzz;
pub mod mooncake;
pub mod tracelab;

use crate::name::{UnknownName, pick};
use crate::trace::{Api, Trace, TraceError};
use std::path::Path;

/// A source format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// tether's own JSONL (`docs/trace-format.md`).
    Tether,
    /// Mooncake FAST'25 JSONL (`timestamp`, `input_length`, `output_length`, `hash_ids`).
    Mooncake,
    /// Qwen-Bailian JSONL (`chat_id`, `parent_chat_id`, `turn`, …).
    Bailian,
    /// AgentX / WEKA agent traces (one JSON object per trace).
    Agentx,
    /// TraceLab rounds (`session_id`, `round_index`, `input_tokens_total`, …; no block ids).
    Tracelab,
}

impl Format {
    /// Every format.
    pub const ALL: [Format; 5] = [
        Format::Tether,
        Format::Mooncake,
        Format::Bailian,
        Format::Agentx,
        Format::Tracelab,
    ];

    /// The `--format` name.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Tether => "tether",
            Format::Mooncake => "mooncake",
            Format::Bailian => "bailian",
            Format::Agentx => "agentx",
            Format::Tracelab => "tracelab",
        }
    }

    /// A human name.
    pub const fn title(self) -> &'static str {
        match self {
            Format::Tether => "tether",
            Format::Mooncake => "Mooncake",
            Format::Bailian => "Qwen-Bailian",
            Format::Agentx => "AgentX/WEKA",
            Format::Tracelab => "TraceLab",
        }
    }

    /// Parses a `--format` name; an unknown name is refused with the known ones.
    /// Case and surrounding blanks do not matter.
    pub fn parse(s: &str) -> Result<Format, UnknownName> {
        pick(
            &Self::ALL,
            Format::name,
            &s.trim().to_ascii_lowercase(),
            "trace format",
        )
        .map_err(|e| UnknownName {
            given: s.to_owned(),
            ..e
        })
    }
}

/// Guesses the format of a file from its first line (for error messages).
pub fn sniff(first_line: &str) -> Option<Format> {
    let v: serde_json::Value = serde_json::from_str(first_line.trim()).ok()?;
    let o = v.as_object()?;
    let has = |k: &str| o.contains_key(k);
    if o.get("type").and_then(|t| t.as_str()) == Some("trace") {
        Some(Format::Tether)
    } else if has("chat_id") && has("parent_chat_id") {
        Some(Format::Bailian)
    } else if has("session_id") && has("round_index") && has("input_tokens_total") {
        Some(Format::Tracelab)
    } else if has("requests") && (has("hash_id_scope") || has("block_size")) {
        Some(Format::Agentx)
    } else if has("input_length") && has("output_length") {
        Some(Format::Mooncake)
    } else {
        None
    }
}

/// Options shared by the importers.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// API every imported request is sent with; `None`: the importer's default
    /// (Mooncake and Bailian record none: Chat; AgentX: the API its `models`
    /// imply — Anthropic Messages for Claude models — stated in its report).
    pub api: Option<Api>,
    /// Mooncake: tokens per hash id.
    pub mooncake_block_size: u32,
    /// Mooncake, Bailian: a continuation arriving within this many ms of its
    /// predecessor's arrival opens with a tool result, else with a user reply.
    pub tool_gap_ms: u64,
    /// Mooncake: a block after which at least this many distinct contents
    /// continue is a common head shared by unrelated conversations.
    pub head_fanout: u32,
    /// AgentX: session `i` starts at `i × stagger_ms` on the trace's timeline
    /// (`None`: sessions keep no shared timeline).
    pub agentx_stagger_ms: Option<u64>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        Self {
            api: None,
            mooncake_block_size: mooncake::BLOCK_SIZE,
            tool_gap_ms: 30_000,
            head_fanout: derive::DEFAULT_HEAD_FANOUT,
            agentx_stagger_ms: None,
        }
    }
}

/// Imports a file (AgentX: a `.json` file, a JSONL file of traces, or a directory of `.json` files).
pub fn import(format: Format, input: &Path, opts: &ImportOptions) -> Result<Trace, TraceError> {
    match format {
        Format::Tether => crate::trace::read_trace(input),
        Format::Mooncake => mooncake::import_file(input, opts),
        Format::Bailian => bailian::import_file(input, opts),
        Format::Agentx => agentx::import_path(input, opts),
        Format::Tracelab => tracelab::import_file(input, opts),
    }
}

/// The import report a `format` importer recorded in `trace`'s header
/// (`source.report`), if `trace` came from that importer.
pub(crate) fn recorded_report<T: serde::de::DeserializeOwned>(
    trace: &Trace,
    format: Format,
) -> Option<T> {
    let src = trace.header().source.as_ref()?;
    if src.get("format")?.as_str()? != format.name() {
        return None;
    }
    serde_json::from_value(src.get("report")?.clone()).ok()
}

/// What the importer of `trace` derived or found (Mooncake derivation,
/// Bailian parent chains, AgentX scopes), as printed by `tether trace import`
/// and `tether trace stats`.
pub fn report_text(trace: &Trace) -> Option<String> {
    if let Some(d) = mooncake::derivation_of(trace) {
        return Some(d.to_string());
    }
    if let Some(r) = bailian::report_of(trace) {
        return Some(r.to_string());
    }
    if let Some(r) = tracelab::report_of(trace) {
        return Some(r.to_string());
    }
    agentx::report_of(trace).map(|r| r.to_string())
}

/// Parses JSONL records (blank lines skipped), each checked by `check`;
/// errors name the file and line. Returns `(line, record)` pairs.
pub(crate) fn parse_jsonl<T: serde::de::DeserializeOwned>(
    reader: impl std::io::BufRead,
    name: &str,
    check: impl Fn(&T) -> Result<(), String>,
) -> Result<Vec<(usize, T)>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| TraceError::at(name, Some(i + 1), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: T = serde_json::from_str(&line).map_err(|e| {
            TraceError::at(name, Some(i + 1), crate::trace::TraceErrorKind::Json(e))
        })?;
        check(&r).map_err(|msg| TraceError::invalid(name, Some(i + 1), msg))?;
        out.push((i + 1, r));
    }
    Ok(out)
}

/// A timestamp importers accept: finite and not negative.
pub(crate) fn check_timestamp(t: f64) -> Result<(), String> {
    if t.is_finite() && t >= 0.0 {
        Ok(())
    } else {
        Err(format!("`timestamp` must be a finite number ≥ 0, got {t}"))
    }
}
