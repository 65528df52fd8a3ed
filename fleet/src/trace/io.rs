//! The JSONL trace file: a streaming line reader into a [`Trace`], a streaming
//! writer out of one, and the content hash. The format is `docs/trace-format.md`.

use super::error::{TraceError, TraceErrorKind};
use super::model::{
    AgentSpec, Api, EndReason, Header, RequestSpec, SessionSpec, Trace, TraceBuilder,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use tether_wire::TurnKind;
use xxhash_rust::xxh3::Xxh3;

/// The `format` value of the header line.
pub const FORMAT: &str = "tether-trace";
/// The format version this code reads and writes.
pub const VERSION: u32 = 1;

/// Every field any line may carry; which ones a line may carry depends on its `type`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLine {
    #[serde(rename = "type")]
    kind: Option<String>,
    // header
    format: Option<String>,
    version: Option<u32>,
    block_size: Option<u32>,
    name: Option<String>,
    source: Option<serde_json::Value>,
    // session
    id: Option<String>,
    start_ms: Option<u64>,
    tenant: Option<String>,
    user: Option<String>,
    // agent
    session: Option<String>,
    agent_type: Option<String>,
    parent: Option<String>,
    spawned_by_turn: Option<usize>,
    system_tokens: Option<u32>,
    tool_tokens: Option<u32>,
    // request
    agent: Option<String>,
    at_ms: Option<u64>,
    gap_ms: Option<u64>,
    input_tokens: Option<u32>,
    output_tokens: Option<u32>,
    opened_by: Option<String>,
    ended_by: Option<String>,
    api: Option<String>,
    model: Option<String>,
    hash_ids: Option<Vec<u64>>,
    hash_runs: Option<Vec<(u64, u32)>>,
    messages: Option<Box<RawValue>>,
}

impl RawLine {
    /// Names of the fields present (besides `type`).
    fn present(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        macro_rules! check {
            ($($f:ident),*) => { $( if self.$f.is_some() { v.push(stringify!($f)); } )* };
        }
        check!(
            format,
            version,
            block_size,
            name,
            source,
            id,
            start_ms,
            tenant,
            user,
            session,
            agent_type,
            parent,
            spawned_by_turn,
            system_tokens,
            tool_tokens,
            agent,
            at_ms,
            gap_ms,
            input_tokens,
            output_tokens,
            opened_by,
            ended_by,
            api,
            model,
            hash_ids,
            hash_runs,
            messages
        );
        v
    }
}

const HEADER_FIELDS: &[&str] = &["format", "version", "block_size", "name", "source"];
const SESSION_FIELDS: &[&str] = &["id", "start_ms", "tenant", "user"];
const AGENT_FIELDS: &[&str] = &[
    "session",
    "id",
    "agent_type",
    "parent",
    "spawned_by_turn",
    "system_tokens",
    "tool_tokens",
];
const REQUEST_FIELDS: &[&str] = &[
    "session",
    "agent",
    "at_ms",
    "gap_ms",
    "input_tokens",
    "output_tokens",
    "opened_by",
    "ended_by",
    "api",
    "model",
    "hash_ids",
    "hash_runs",
    "messages",
];

fn allowed(line: &RawLine, kind: &str, fields: &[&str]) -> Result<(), String> {
    match line.present().into_iter().find(|f| !fields.contains(f)) {
        Some(f) => Err(format!("field `{f}` is not allowed on a `{kind}` line")),
        None => Ok(()),
    }
}

fn required<T>(v: Option<T>, field: &str, kind: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("a `{kind}` line needs `{field}`"))
}

/// Reads a trace file.
pub fn read_trace(path: &Path) -> Result<Trace, TraceError> {
    let name = path.display().to_string();
    read_trace_from(open_text(path)?, &name)
}

/// Opens a trace file for reading, refusing by name what is no text file a
/// line-based reader can report on: a directory (which would read as an I/O
/// error "at line 1"), and a UTF-8 byte-order mark, which JSON forbids and
/// which would read as a parse error at line 1 column 1.
pub fn open_text(path: &Path) -> Result<BufReader<File>, TraceError> {
    let name = path.display().to_string();
    if path.is_dir() {
        return Err(TraceError::invalid(
            &name,
            None,
            "is a directory, not a trace file (only AgentX imports read directories)",
        ));
    }
    let file = File::open(path).map_err(|e| TraceError::at(&name, None, e))?;
    let mut reader = BufReader::new(file);
    let head = reader
        .fill_buf()
        .map_err(|e| TraceError::at(&name, None, e))?;
    if head.starts_with(b"\xEF\xBB\xBF") {
        return Err(TraceError::invalid(
            &name,
            Some(1),
            "starts with a UTF-8 byte-order mark (BOM), which JSON does not allow: save the file without it",
        ));
    }
    Ok(reader)
}

/// Reads a trace from a stream, one line at a time; `name` names it in errors.
pub fn read_trace_from(reader: impl BufRead, name: &str) -> Result<Trace, TraceError> {
    let mut builder: Option<TraceBuilder> = None;
    let mut last_line = 0;
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        last_line = lineno;
        let line = line.map_err(|e| TraceError::at(name, Some(lineno), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let raw: RawLine = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) if builder.is_none() => {
                return Err(TraceError::invalid(
                    name,
                    Some(lineno),
                    not_a_trace(&line, &e.to_string()),
                ));
            }
            Err(e) => return Err(TraceError::at(name, Some(lineno), e)),
        };
        let err = |msg: String| TraceError::invalid(name, Some(lineno), msg);
        let model = |e| TraceError::at(name, Some(lineno), TraceErrorKind::Model(e));
        match (&mut builder, raw.kind.as_deref()) {
            (None, Some("trace")) => {
                allowed(&raw, "trace", HEADER_FIELDS).map_err(err)?;
                let format = required(raw.format, "format", "trace").map_err(err)?;
                if format != FORMAT {
                    return Err(err(format!(
                        "unknown trace format `{format}` (this reads `{FORMAT}`)"
                    )));
                }
                let version = required(raw.version, "version", "trace").map_err(err)?;
                if version != VERSION {
                    return Err(err(format!(
                        "trace format version {version} is not supported (this reads version {VERSION})"
                    )));
                }
                let block_size = required(raw.block_size, "block_size", "trace").map_err(err)?;
                builder = Some(
                    TraceBuilder::with_header(Header {
                        block_size,
                        name: raw.name,
                        source: raw.source,
                    })
                    .map_err(model)?,
                );
            }
            (None, _) => {
                return Err(err(not_a_trace(
                    &line,
                    "the first line is no `trace` header",
                )));
            }
            (Some(_), Some("trace")) => {
                return Err(err("a second `trace` header line".to_owned()));
            }
            (Some(b), Some("session")) => {
                allowed(&raw, "session", SESSION_FIELDS).map_err(err)?;
                b.session(SessionSpec {
                    id: required(raw.id, "id", "session").map_err(err)?,
                    start_ms: raw.start_ms,
                    tenant: raw.tenant,
                    user: raw.user,
                })
                .map_err(model)?;
            }
            (Some(b), Some("agent")) => {
                allowed(&raw, "agent", AGENT_FIELDS).map_err(err)?;
                let sname = required(raw.session, "session", "agent").map_err(err)?;
                let sid = b
                    .session_id(&sname)
                    .ok_or_else(|| model(super::model::ModelError::UnknownSession(sname)))?;
                b.agent(
                    sid,
                    AgentSpec {
                        id: required(raw.id, "id", "agent").map_err(err)?,
                        agent_type: raw.agent_type.unwrap_or_else(|| "main".to_owned()),
                        parent: raw.parent,
                        spawned_by_turn: raw.spawned_by_turn,
                        system_tokens: raw.system_tokens,
                        tool_tokens: raw.tool_tokens,
                    },
                )
                .map_err(model)?;
            }
            (Some(b), Some("request")) => {
                allowed(&raw, "request", REQUEST_FIELDS).map_err(err)?;
                let sname = required(raw.session, "session", "request").map_err(err)?;
                let aname = required(raw.agent, "agent", "request").map_err(err)?;
                let sid = b.session_id(&sname).ok_or_else(|| {
                    model(super::model::ModelError::UnknownSession(sname.clone()))
                })?;
                let aid = b.agent_id(sid, &aname).ok_or_else(|| {
                    model(super::model::ModelError::UnknownAgent {
                        session: sname,
                        agent: aname,
                    })
                })?;
                let opened = required(raw.opened_by, "opened_by", "request").map_err(err)?;
                let opened_by = TurnKind::parse(&opened).ok_or_else(|| {
                    err(format!(
                        "unknown `opened_by` `{opened}` (first, user, tool, handoff)"
                    ))
                })?;
                let ended_by = match raw.ended_by {
                    Some(e) => Some(EndReason::parse(&e).ok_or_else(|| {
                        err(format!(
                            "unknown `ended_by` `{e}` (tool_call, end_turn, handoff)"
                        ))
                    })?),
                    None => None,
                };
                let api = match raw.api {
                    Some(a) => Api::parse(&a).ok_or_else(|| {
                        err(format!(
                            "unknown `api` `{a}` (chat, responses, messages, completions)"
                        ))
                    })?,
                    None => Api::Chat,
                };
                let spec = RequestSpec {
                    at_ms: required(raw.at_ms, "at_ms", "request").map_err(err)?,
                    gap_ms: raw.gap_ms,
                    input_tokens: required(raw.input_tokens, "input_tokens", "request")
                        .map_err(err)?,
                    output_tokens: required(raw.output_tokens, "output_tokens", "request")
                        .map_err(err)?,
                    opened_by,
                    ended_by,
                    api,
                    model: raw.model,
                    messages: raw.messages,
                };
                match (raw.hash_ids, raw.hash_runs) {
                    (Some(_), Some(_)) => {
                        return Err(err(
                            "a request has either `hash_ids` or `hash_runs`, not both".to_owned(),
                        ));
                    }
                    (Some(ids), None) => b.request(aid, spec, &ids).map_err(model)?,
                    (None, Some(runs)) => b.request_runs(aid, spec, &runs).map_err(model)?,
                    (None, None) => b.request(aid, spec, &[]).map_err(model)?,
                };
            }
            (Some(_), Some(other)) => {
                return Err(err(format!(
                    "unknown line type `{other}` (trace, session, agent, request)"
                )));
            }
            (Some(_), None) => return Err(err("a line without `type`".to_owned())),
        }
    }
    let Some(b) = builder else {
        return Err(TraceError::invalid(
            name,
            None,
            "empty file: no `trace` header line",
        ));
    };
    b.build()
        .map_err(|e| TraceError::at(name, Some(last_line), TraceErrorKind::Model(e)))
}

/// The message for a first line that is not a tether header: says which
/// format it looks like and how to import it.
fn not_a_trace(line: &str, why: &str) -> String {
    let guess = crate::import::sniff(line)
        .map(|f| {
            format!(
                "; it looks like a {} trace: convert it with `tether trace import --format {} --input FILE --output T.jsonl`",
                f.title(),
                f.name()
            )
        })
        .unwrap_or_default();
    format!("not a {FORMAT} file ({why}){guess}")
}

#[derive(Serialize)]
struct HeaderOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    format: &'static str,
    version: u32,
    block_size: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<&'a serde_json::Value>,
}

#[derive(Serialize)]
struct SessionOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
}

#[derive(Serialize)]
struct AgentOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    session: &'a str,
    id: &'a str,
    agent_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spawned_by_turn: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_tokens: Option<u32>,
}

#[derive(Serialize)]
struct RequestOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    session: &'a str,
    agent: &'a str,
    at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    gap_ms: Option<u64>,
    input_tokens: u32,
    output_tokens: u32,
    opened_by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_by: Option<&'static str>,
    api: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash_ids: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hash_runs: Option<Vec<(u64, u32)>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<&'a RawValue>,
}

/// How block ids are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IdForm {
    /// `hash_runs`: `[first id, count]` pairs (compact; the default).
    #[default]
    Runs,
    /// `hash_ids`: the flat list, as Mooncake-style tools read it.
    Flat,
}

/// Writes `trace` as JSONL: the header, then per session its session line,
/// its agent lines (parents first) and its requests in arrival order.
pub fn write_trace(trace: &Trace, form: IdForm, out: impl Write) -> std::io::Result<()> {
    let mut w = BufWriter::new(out);
    let h = trace.header();
    serde_json::to_writer(
        &mut w,
        &HeaderOut {
            kind: "trace",
            format: FORMAT,
            version: VERSION,
            block_size: h.block_size,
            name: h.name.as_deref(),
            source: h.source.as_ref(),
        },
    )?;
    w.write_all(b"\n")?;
    write_body(trace, form, &mut w)?;
    w.flush()
}

/// Everything after the header line (what the content hash covers, with the block size).
fn write_body(trace: &Trace, form: IdForm, w: &mut impl Write) -> std::io::Result<()> {
    for (si, s) in trace.sessions().iter().enumerate() {
        serde_json::to_writer(
            &mut *w,
            &SessionOut {
                kind: "session",
                id: &s.id,
                start_ms: s.start_ms,
                tenant: s.tenant.as_deref(),
                user: s.user.as_deref(),
            },
        )?;
        w.write_all(b"\n")?;
        for &aid in &s.agents {
            let a = trace.agent(aid);
            serde_json::to_writer(
                &mut *w,
                &AgentOut {
                    kind: "agent",
                    session: &s.id,
                    id: &a.id,
                    agent_type: &a.agent_type,
                    parent: a.parent.map(|p| trace.agent(p).id.as_str()),
                    spawned_by_turn: a.spawned_by.map(|r| trace.turn_of(r)),
                    system_tokens: a.system_tokens,
                    tool_tokens: a.tool_tokens,
                },
            )?;
            w.write_all(b"\n")?;
        }
        for rid in trace.session_requests(super::model::SessionId(si as u32)) {
            let r = trace.request(rid);
            let (hash_ids, hash_runs) = match form {
                IdForm::Flat => (Some(trace.blocks().ids(r.blocks)), None),
                IdForm::Runs => (None, Some(trace.blocks().runs(r.blocks))),
            };
            serde_json::to_writer(
                &mut *w,
                &RequestOut {
                    kind: "request",
                    session: &s.id,
                    agent: &trace.agent(r.agent).id,
                    at_ms: r.at_ms,
                    gap_ms: r.gap_ms,
                    input_tokens: r.input_tokens,
                    output_tokens: r.output_tokens,
                    opened_by: r.opened_by.name(),
                    ended_by: r.ended_by.map(EndReason::name),
                    api: r.api.name(),
                    model: trace.model_of(rid),
                    hash_ids,
                    hash_runs,
                    messages: r.messages.as_deref(),
                },
            )?;
            w.write_all(b"\n")?;
        }
    }
    Ok(())
}

/// Writes a trace to a file.
pub fn write_trace_file(trace: &Trace, form: IdForm, path: &Path) -> Result<(), TraceError> {
    let name = path.display().to_string();
    let f = File::create(path).map_err(|e| TraceError::at(&name, None, e))?;
    write_trace(trace, form, f).map_err(|e| TraceError::at(&name, None, e))
}

struct HashWriter(Xxh3);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The content hash of a trace, `xxh3-128:<32 hex>`: of its block size and
/// its session, agent and request lines as [`write_trace`] writes them with
/// `hash_runs`. Name and source are not covered, so re-importing or renaming
/// a trace keeps its hash; any change to what a replay sends changes it.
pub fn content_hash(trace: &Trace) -> String {
    let mut h = HashWriter(Xxh3::with_seed(0));
    h.0.update(&trace.block_size().to_le_bytes());
    // Writing into a hasher cannot fail.
    let _ = write_body(trace, IdForm::Runs, &mut h);
    format!("xxh3-128:{:032x}", h.0.digest128())
}

#[cfg(test)]
mod tests;
