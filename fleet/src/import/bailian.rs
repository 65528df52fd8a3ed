//! Qwen-Bailian traces (`alibaba-edu/qwen-bailian-usagetraces-anon`, ATC'25):
//! one JSON object per line with `chat_id`, `parent_chat_id` (−1 for a root),
//! `timestamp` (seconds, float, from the trace start), `input_length`,
//! `output_length`, `type` (text / search / image / file), `turn` and
//! `hash_ids` (16-token blocks, salted SipHash remapped to integers).
//!
//! Sessions are explicit: a root request starts one, every other request
//! joins its parent's. Two things the trace's Q&A page describes are expected
//! and kept as recorded: the last input block of a turn may carry padding, so
//! its hash differs in the next turn (a child shares its parent's blocks but
//! the last), and `<think>` tokens are stripped from the output before the
//! next turn (a child's prompt can be shorter than its parent's prompt plus
//! output). The import report counts both.

use super::ImportOptions;
use crate::trace::{
    Api, EndReason, Header, RequestSpec, Trace, TraceBuilder, TraceError, TurnKind,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::Path;

/// Tokens per Bailian hash id.
pub const BLOCK_SIZE: u32 = 16;

/// One line of a Bailian trace (other fields are ignored).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct BailianRecord {
    /// Request id.
    pub chat_id: i64,
    /// The previous turn's `chat_id`, or −1 for a root.
    pub parent_chat_id: i64,
    /// Arrival, seconds from the trace start.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Generated tokens.
    pub output_length: u32,
    /// text / search / image / file.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// Turn number in the conversation (1 = first).
    #[serde(default)]
    pub turn: Option<u32>,
    /// Prefix-block ids.
    #[serde(default)]
    pub hash_ids: Vec<u64>,
}

/// What the import found, recorded in the header's `source`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BailianReport {
    /// Requests.
    pub requests: usize,
    /// Sessions (roots, plus orphans whose parent is outside the trace).
    pub sessions: usize,
    /// Requests whose parent is not in the trace, or not before them (its
    /// earlier turns fell before the trace window): each starts a session as
    /// a `user` turn.
    pub orphans: usize,
    /// Children keeping all of their parent's blocks.
    pub children_keep_all: usize,
    /// Children keeping all of their parent's blocks but the last (padding re-hashed).
    pub children_rehash_last: usize,
    /// Children keeping less (context edited or truncated).
    pub children_keep_less: usize,
    /// Children whose prompt is shorter than parent prompt + output
    /// (`<think>` stripped, or output not carried over).
    pub children_shorter_than_parent_context: usize,
    /// Requests by `type`.
    pub types: BTreeMap<String, usize>,
}

/// Parses Bailian JSONL (blank lines skipped); errors name the line.
pub fn parse(reader: impl BufRead, name: &str) -> Result<Vec<(usize, BailianRecord)>, TraceError> {
    super::parse_jsonl(reader, name, |r: &BailianRecord| {
        super::check_timestamp(r.timestamp)
    })
}

/// Imports a Bailian file.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Trace, TraceError> {
    let name = path.display().to_string();
    let records = parse(crate::trace::io::open_text(path)?, &name)?;
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
    import_records(records, opts, &name, file.as_deref())
}

fn ms(seconds: f64) -> u64 {
    (seconds * 1000.0).round() as u64
}

/// Builds the trace from parsed records (`(line, record)`).
pub fn import_records(
    mut records: Vec<(usize, BailianRecord)>,
    opts: &ImportOptions,
    name: &str,
    file: Option<&str>,
) -> Result<Trace, TraceError> {
    if records.is_empty() {
        return Err(TraceError::invalid(name, None, "the trace has no requests"));
    }
    records.sort_by(|a, b| a.1.timestamp.total_cmp(&b.1.timestamp));
    let mut index: HashMap<i64, usize> = HashMap::new();
    for (i, (line, r)) in records.iter().enumerate() {
        if index.insert(r.chat_id, i).is_some() {
            return Err(TraceError::invalid(
                name,
                Some(*line),
                format!("`chat_id` {} appears twice", r.chat_id),
            ));
        }
    }
    let mut b = TraceBuilder::with_header(Header {
        block_size: BLOCK_SIZE,
        name: file.map(str::to_owned),
        source: None,
    })
    .map_err(|e| TraceError::at(name, None, e))?;
    let refs: Vec<_> = records
        .iter()
        .map(|(_, r)| b.insert_blocks(&r.hash_ids))
        .collect();
    let mut rep = BailianReport {
        requests: records.len(),
        ..BailianReport::default()
    };
    // Parent of each request (an index), when it is in the trace and earlier.
    let parent: Vec<Option<usize>> = records
        .iter()
        .enumerate()
        .map(|(i, (_, r))| {
            (r.parent_chat_id >= 0)
                .then(|| index.get(&r.parent_chat_id).copied())
                .flatten()
                .filter(|&p| p < i)
        })
        .collect();
    let mut root = vec![0usize; records.len()];
    let mut has_tool_child = vec![false; records.len()];
    let mut kinds = Vec::with_capacity(records.len());
    for (i, (_, r)) in records.iter().enumerate() {
        *rep.types
            .entry(r.kind.clone().unwrap_or_else(|| "unknown".to_owned()))
            .or_default() += 1;
        let kind = match parent[i] {
            Some(p) => {
                root[i] = root[p];
                let (pr, pref) = (&records[p].1, refs[p]);
                let keep = b.blocks().common_prefix(pref, refs[i]);
                let plen = b.blocks().len(pref);
                if keep >= plen {
                    rep.children_keep_all += 1;
                } else if keep + 1 == plen {
                    rep.children_rehash_last += 1;
                } else {
                    rep.children_keep_less += 1;
                }
                if u64::from(r.input_length)
                    < u64::from(pr.input_length) + u64::from(pr.output_length)
                {
                    rep.children_shorter_than_parent_context += 1;
                }
                if ms(r.timestamp).saturating_sub(ms(pr.timestamp)) <= opts.tool_gap_ms {
                    has_tool_child[p] = true;
                    TurnKind::Tool
                } else {
                    TurnKind::User
                }
            }
            None => {
                root[i] = i;
                if r.parent_chat_id >= 0 {
                    rep.orphans += 1;
                    TurnKind::User
                } else {
                    TurnKind::First
                }
            }
        };
        kinds.push(kind);
    }
    let mut agents = HashMap::new();
    for (i, (line, r)) in records.iter().enumerate() {
        let at = |e| TraceError::at(name, Some(*line), e);
        let s = root[i];
        let aid = match agents.get(&s) {
            Some(&a) => a,
            None => {
                let a = b
                    .chat_session(
                        format!("chat-{}", records[s].1.chat_id),
                        Some(ms(records[s].1.timestamp)),
                    )
                    .map_err(at)?;
                agents.insert(s, a);
                a
            }
        };
        let spec = RequestSpec {
            ended_by: Some(if has_tool_child[i] {
                EndReason::ToolCall
            } else {
                EndReason::EndTurn
            }),
            api: opts.api.unwrap_or(Api::Chat),
            ..RequestSpec::new(
                ms(r.timestamp) - ms(records[s].1.timestamp),
                r.input_length,
                r.output_length,
                kinds[i],
            )
        };
        b.request_at(aid, spec, refs[i]).map_err(at)?;
    }
    rep.sessions = agents.len();
    b.header_mut().source = Some(serde_json::json!({
        "format": "bailian",
        "file": file,
        "tool_gap_ms": opts.tool_gap_ms,
        "report": rep,
    }));
    b.build().map_err(|e| TraceError::at(name, None, e))
}

/// The import report recorded in a trace imported from Bailian, if any.
pub fn report_of(trace: &Trace) -> Option<BailianReport> {
    super::recorded_report(trace, super::Format::Bailian)
}

impl std::fmt::Display for BailianReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} sessions by parent chain from {} requests ({} orphans whose parent is outside the trace)",
            self.sessions, self.requests, self.orphans
        )?;
        write!(
            f,
            "  children keeping all parent blocks {}, all but the re-hashed last {}, fewer {}; prompts shorter than parent prompt + output {}",
            self.children_keep_all,
            self.children_rehash_last,
            self.children_keep_less,
            self.children_shorter_than_parent_context
        )
    }
}

#[cfg(test)]
pub(crate) mod tests;
