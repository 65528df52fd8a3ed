//! Mooncake FAST'25 traces (`kvcache-ai/Mooncake`, `FAST25-release/traces/`):
//! one JSON object per line with `timestamp` (ms from the trace start),
//! `input_length`, `output_length` and `hash_ids` (ids of 512-token prefix
//! blocks; equal ids mean equal content and equal prefix). The trace records
//! no sessions; conversations are derived ([`super::derive`]) unless every
//! record carries a `session_id` (the AIPerf extension of the format), which
//! is then taken as given.

use super::ImportOptions;
use super::derive::{DerivationReport, Link, derive};
use crate::trace::{
    Api, EndReason, Header, RequestSpec, Trace, TraceBuilder, TraceError, TurnKind,
};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

/// Tokens per Mooncake hash id.
pub const BLOCK_SIZE: u32 = 512;

/// One line of a Mooncake trace (other fields are ignored).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct MooncakeRecord {
    /// Arrival time in ms from the trace start.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Generated tokens.
    pub output_length: u32,
    /// Prefix-block ids.
    #[serde(default)]
    pub hash_ids: Vec<u64>,
    /// Session, when a tool added one (AIPerf's multi-turn form).
    #[serde(default)]
    pub session_id: Option<serde_json::Value>,
}

/// Parses Mooncake JSONL (blank lines skipped); errors name the line.
pub fn parse(reader: impl BufRead, name: &str) -> Result<Vec<(usize, MooncakeRecord)>, TraceError> {
    super::parse_jsonl(reader, name, |r: &MooncakeRecord| {
        super::check_timestamp(r.timestamp)
    })
}

/// Imports a Mooncake file.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Trace, TraceError> {
    let name = path.display().to_string();
    let records = parse(crate::trace::io::open_text(path)?, &name)?;
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
    import_records(records, opts, &name, file.as_deref())
}

fn session_key(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Builds the trace from parsed records (`(line, record)`).
pub fn import_records(
    mut records: Vec<(usize, MooncakeRecord)>,
    opts: &ImportOptions,
    name: &str,
    file: Option<&str>,
) -> Result<Trace, TraceError> {
    if records.is_empty() {
        return Err(TraceError::invalid(name, None, "the trace has no requests"));
    }
    records.sort_by(|a, b| a.1.timestamp.total_cmp(&b.1.timestamp));
    let explicit = records.iter().all(|(_, r)| r.session_id.is_some());
    let mut b = TraceBuilder::with_header(Header {
        block_size: opts.mooncake_block_size,
        name: file.map(str::to_owned),
        source: None,
    })
    .map_err(|e| TraceError::at(name, None, e))?;
    // Insert every record's blocks first: the derivation needs the whole trie.
    let refs: Vec<_> = records
        .iter()
        .map(|(_, r)| (b.insert_blocks(&r.hash_ids), r.input_length))
        .collect();
    let (conversation, link, report): (Vec<usize>, Vec<Link>, Option<DerivationReport>) =
        if explicit {
            let mut first: HashMap<String, usize> = HashMap::new();
            let conv = records
                .iter()
                .enumerate()
                .map(|(i, (_, r))| {
                    let key = r.session_id.as_ref().map(session_key).unwrap_or_default();
                    *first.entry(key).or_insert(i)
                })
                .collect::<Vec<_>>();
            let mut prev: HashMap<usize, usize> = HashMap::new();
            let link = conv
                .iter()
                .enumerate()
                .map(|(i, &c)| match prev.insert(c, i) {
                    Some(p) => Link::Continuation(p),
                    None => Link::NewNoSharedBlock,
                })
                .collect();
            (conv, link, None)
        } else {
            let d = derive(b.blocks(), &refs, opts.head_fanout);
            (d.conversation, d.link, Some(d.report))
        };

    // Kinds: first request of a conversation `first`; a continuation within
    // `tool_gap_ms` of its predecessor `tool`; everything else `user`.
    let ts = |i: usize| records[i].1.timestamp.round() as u64;
    let kinds: Vec<TurnKind> = link
        .iter()
        .enumerate()
        .map(|(i, l)| match l {
            Link::Continuation(p) if ts(i).saturating_sub(ts(*p)) <= opts.tool_gap_ms => {
                TurnKind::Tool
            }
            Link::Continuation(_) | Link::Regeneration(_) | Link::Fork(_) => TurnKind::User,
            _ => TurnKind::First,
        })
        .collect();
    // How each response ended, from what the conversation did next.
    let mut next_in_conv: Vec<Option<usize>> = vec![None; records.len()];
    let mut last_of: HashMap<usize, usize> = HashMap::new();
    for (i, &c) in conversation.iter().enumerate() {
        if let Some(p) = last_of.insert(c, i) {
            next_in_conv[p] = Some(i);
        }
    }
    let mut agents = HashMap::new();
    let mut tool_turns = 0;
    for (i, (line, r)) in records.iter().enumerate() {
        let c = conversation[i];
        let aid = match agents.get(&c) {
            Some(&a) => a,
            None => {
                let id = if explicit {
                    r.session_id.as_ref().map(session_key).unwrap_or_default()
                } else {
                    format!("conv-{}", agents.len())
                };
                let a = b
                    .chat_session(id, Some(ts(c)))
                    .map_err(|e| TraceError::at(name, Some(*line), e))?;
                agents.insert(c, a);
                a
            }
        };
        if kinds[i] == TurnKind::Tool {
            tool_turns += 1;
        }
        let ended_by = match next_in_conv[i] {
            Some(n) if kinds[n] == TurnKind::Tool => EndReason::ToolCall,
            _ => EndReason::EndTurn,
        };
        let spec = RequestSpec {
            ended_by: Some(ended_by),
            api: opts.api.unwrap_or(Api::Chat),
            ..RequestSpec::new(ts(i) - ts(c), r.input_length, r.output_length, kinds[i])
        };
        b.request_at(aid, spec, refs[i].0)
            .map_err(|e| TraceError::at(name, Some(*line), e))?;
    }
    let mut source = serde_json::json!({
        "format": "mooncake",
        "file": file,
        "block_size": opts.mooncake_block_size,
        "tool_gap_ms": opts.tool_gap_ms,
        "tool_turns": tool_turns,
    });
    match &report {
        Some(rep) => {
            source["derivation"] = serde_json::to_value(rep).unwrap_or_default();
        }
        None => {
            source["sessions"] = serde_json::Value::from("explicit session_id");
        }
    }
    b.header_mut().source = Some(source);
    b.build().map_err(|e| TraceError::at(name, None, e))
}

/// The derivation report recorded in a trace imported from Mooncake, if any.
pub fn derivation_of(trace: &Trace) -> Option<DerivationReport> {
    let d = trace.header().source.as_ref()?.get("derivation")?;
    serde_json::from_value(d.clone()).ok()
}

#[cfg(test)]
pub(crate) mod tests;
