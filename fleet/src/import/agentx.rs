//! AgentX / WEKA agent traces (the format SemiAnalysis publishes and NVIDIA
//! AIPerf reads as `weka_trace`): one JSON object per recorded agent run with
//! `id`, `models`, `block_size` (64), `hash_id_scope`, `tool_tokens`,
//! `system_tokens` and `requests[]`. A request is `type: "n"` (or `"s"`,
//! streamed) with `t` (seconds from the run's start), `model`, `in`, `out`,
//! `hash_ids`, `input_types`, `output_types`, `stop` (`tool_use` /
//! `end_turn`), `api_time`, `think_time`; a subagent is `type: "subagent"`
//! with `t`, `agent_id`, `subagent_type`, `status` and its own `requests`
//! (nested subagents allowed).
//!
//! Mapping: one trace → one session (id = the trace's `id`) with a main agent;
//! each subagent entry → an agent whose parent is the enclosing agent, spawned
//! by the parent's request just before the entry. `hash_id_scope: "local"`
//! means the ids are a namespace of their own trace (equal ids in two traces
//! are different blocks), so they are renumbered per trace into one fresh
//! range; `"global"` ids share one namespace across the corpus and keep their
//! identity (renumbered consistently, so they never collide with local ones).
//! Main agent and subagents of one trace share its namespace.

use super::ImportOptions;
use crate::trace::{
    AgentSpec, Api, EndReason, Header, RequestSpec, SessionSpec, Trace, TraceBuilder, TraceError,
    TraceErrorKind, TurnKind,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Read};
use std::path::Path;

/// Block size when a trace does not say.
pub const DEFAULT_BLOCK_SIZE: u32 = 64;

/// One recorded agent run.
#[derive(Clone, Debug, Deserialize)]
pub struct WekaTrace {
    /// Trace (session) id.
    pub id: serde_json::Value,
    /// Models used.
    #[serde(default)]
    pub models: Vec<String>,
    /// Tokens per hash id.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// `local` or `global`.
    #[serde(default)]
    pub hash_id_scope: Option<String>,
    /// Tool-schema tokens of the main agent.
    #[serde(default)]
    pub tool_tokens: Option<u32>,
    /// System-prompt tokens of the main agent.
    #[serde(default)]
    pub system_tokens: Option<u32>,
    /// Requests and subagent entries, in order.
    pub requests: Vec<WekaItem>,
}

/// A request or a subagent entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type")]
pub enum WekaItem {
    /// A normal API call.
    #[serde(rename = "n")]
    Normal(WekaRequest),
    /// A streamed API call.
    #[serde(rename = "s")]
    Streamed(WekaRequest),
    /// A subagent and its requests.
    #[serde(rename = "subagent")]
    Subagent(WekaSubagent),
}

/// One API call.
#[derive(Clone, Debug, Deserialize)]
pub struct WekaRequest {
    /// Seconds from the run's start.
    pub t: f64,
    /// Model.
    #[serde(default)]
    pub model: Option<String>,
    /// Input tokens.
    #[serde(rename = "in")]
    pub input: u32,
    /// Output tokens.
    pub out: u32,
    /// Prefix-block ids.
    #[serde(default)]
    pub hash_ids: Vec<u64>,
    /// Kinds of the new input (`text`, `tool_result`, …).
    #[serde(default)]
    pub input_types: Vec<String>,
    /// `tool_use`, `end_turn` or empty.
    #[serde(default)]
    pub stop: Option<String>,
    /// Recorded server time, seconds.
    #[serde(default)]
    pub api_time: Option<f64>,
    /// Client delay before this request, seconds.
    #[serde(default)]
    pub think_time: Option<f64>,
}

/// A subagent entry.
#[derive(Clone, Debug, Deserialize)]
pub struct WekaSubagent {
    /// Spawn time, seconds from the run's start.
    pub t: f64,
    /// Subagent id.
    pub agent_id: String,
    /// `Explore`, `general-purpose`, …
    #[serde(default)]
    pub subagent_type: Option<String>,
    /// `completed`, `async_launched`, …
    #[serde(default)]
    pub status: Option<String>,
    /// Its requests (and nested subagents).
    #[serde(default)]
    pub requests: Vec<WekaItem>,
    /// Its tool-schema tokens.
    #[serde(default)]
    pub tool_tokens: Option<u32>,
    /// Its system-prompt tokens.
    #[serde(default)]
    pub system_tokens: Option<u32>,
}

/// What the import found, recorded in the header's `source`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentxReport {
    /// Traces (sessions).
    pub traces: usize,
    /// Requests.
    pub requests: usize,
    /// Subagents imported.
    pub subagents: usize,
    /// Subagents spawned by another subagent.
    pub nested_subagents: usize,
    /// Subagent entries without requests (e.g. `async_launched`), skipped.
    pub empty_subagents_skipped: usize,
    /// Traces per `hash_id_scope`.
    pub scopes: BTreeMap<String, usize>,
    /// Requests whose `t` was earlier than their agent's previous one (kept in
    /// order, arrival raised to the previous one's).
    pub out_of_order: usize,
    /// Subagent ids repeated in a trace (renamed with a `#n` suffix).
    pub renamed_agents: usize,
    /// Traces whose first request is at a negative `t` (their times shifted
    /// so it is at 0, as every trace's are).
    #[serde(default)]
    pub negative_starts: usize,
    /// Subagent entries whose `t` lies before their trace's first request
    /// (e.g. far negative in older exports): ignored for the timeline, which
    /// starts at the first request.
    #[serde(default)]
    pub early_subagent_markers: usize,
    /// Traces per API the requests are sent with (`--api`, or implied by the
    /// trace's models: Claude models speak Anthropic Messages, Codex models
    /// OpenAI Responses, others Chat).
    #[serde(default)]
    pub apis: BTreeMap<String, usize>,
    /// Files of an imported directory that are not traces (not `.json` / `.jsonl`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_files: Vec<String>,
}

/// Where a trace came from, for errors.
struct Origin {
    file: String,
    line: Option<usize>,
}

/// Traces read from a path: `(trace, file, line)`, and the files of a directory
/// that were not read (not `.json` / `.jsonl`).
pub type ReadTraces = (Vec<(WekaTrace, String, Option<usize>)>, Vec<String>);

/// Reads every trace of `path`: a `.json` file (one trace object, or an array
/// of them), a JSONL file (one trace per line), or a directory, walked with
/// its subdirectories in path order, whose `.json` and `.jsonl` files are read
/// and whose other files are listed as skipped.
pub fn read_path(path: &Path) -> Result<ReadTraces, TraceError> {
    let name = path.display().to_string();
    if !path.is_dir() {
        return Ok((read_file(path)?, Vec::new()));
    }
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    walk(path, &mut files, &mut skipped)?;
    files.sort();
    skipped.sort();
    if files.is_empty() {
        return Err(TraceError::invalid(
            &name,
            None,
            format!(
                "the directory and its subdirectories hold no .json or .jsonl trace files{}",
                if skipped.is_empty() {
                    String::new()
                } else {
                    format!(" ({} other files skipped)", skipped.len())
                }
            ),
        ));
    }
    let mut out = Vec::new();
    for f in files {
        out.extend(read_file(&f)?);
    }
    Ok((out, skipped))
}

/// Collects the trace files under `dir` (recursively) and the other files.
fn walk(
    dir: &Path,
    files: &mut Vec<std::path::PathBuf>,
    skipped: &mut Vec<String>,
) -> Result<(), TraceError> {
    let name = dir.display().to_string();
    for e in std::fs::read_dir(dir).map_err(|e| TraceError::at(&name, None, e))? {
        let p = e.map_err(|e| TraceError::at(&name, None, e))?.path();
        if p.is_dir() {
            walk(&p, files, skipped)?;
        } else if p
            .extension()
            .is_some_and(|x| x.eq_ignore_ascii_case("json") || x.eq_ignore_ascii_case("jsonl"))
        {
            files.push(p);
        } else {
            skipped.push(p.display().to_string());
        }
    }
    Ok(())
}

fn json_err(file: &str, e: serde_json::Error, line: Option<usize>) -> TraceError {
    let l = line.or(Some(e.line()).filter(|&l| l > 0));
    TraceError::at(file, l, TraceErrorKind::Json(e))
}

fn read_file(path: &Path) -> Result<Vec<(WekaTrace, String, Option<usize>)>, TraceError> {
    let name = path.display().to_string();
    let mut text = String::new();
    crate::trace::io::open_text(path)?
        .read_to_string(&mut text)
        .map_err(|e| TraceError::at(&name, None, e))?;
    let jsonl = path
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("jsonl"));
    if !jsonl {
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Array(items)) => {
                return items
                    .into_iter()
                    .map(|v| {
                        serde_json::from_value(v)
                            .map(|t| (t, name.clone(), None))
                            .map_err(|e| json_err(&name, e, None))
                    })
                    .collect();
            }
            Ok(v) => {
                let t = serde_json::from_value(v).map_err(|e| json_err(&name, e, None))?;
                return Ok(vec![(t, name, None)]);
            }
            // Several objects: JSONL after all.
            Err(e) if e.is_syntax() && text.trim_start().starts_with('{') && e.line() > 1 => {}
            Err(e) => return Err(json_err(&name, e, None)),
        }
    }
    let mut out = Vec::new();
    for (i, line) in std::io::Cursor::new(text.as_bytes()).lines().enumerate() {
        let line = line.map_err(|e| TraceError::at(&name, Some(i + 1), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let t = serde_json::from_str(&line).map_err(|e| json_err(&name, e, Some(i + 1)))?;
        out.push((t, name.clone(), Some(i + 1)));
    }
    Ok(out)
}

/// Imports every trace of `path` into one tether trace.
pub fn import_path(path: &Path, opts: &ImportOptions) -> Result<Trace, TraceError> {
    let (traces, skipped) = read_path(path)?;
    let label = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rep = AgentxReport {
        skipped_files: skipped,
        ..AgentxReport::default()
    };
    import_reporting(traces, opts, &path.display().to_string(), &label, rep)
}

/// An agent being collected before it is added to the builder.
struct AgentTmp {
    id: String,
    agent_type: String,
    parent: Option<usize>,
    spawned_turn: Option<usize>,
    system_tokens: Option<u32>,
    tool_tokens: Option<u32>,
    requests: Vec<(RequestSpec, Vec<u64>)>,
}

/// Ids of one namespace renumbered into the import's single range.
struct Renumber<'a> {
    map: HashMap<u64, u64>,
    next: &'a mut u64,
}

impl Renumber<'_> {
    fn ids(&mut self, ids: &[u64]) -> Vec<u64> {
        ids.iter()
            .map(|id| {
                *self.map.entry(*id).or_insert_with(|| {
                    let n = *self.next;
                    *self.next += 1;
                    n
                })
            })
            .collect()
    }
}

/// Imports parsed traces (`(trace, file, line)`) into one tether trace.
pub fn import_traces(
    traces: Vec<(WekaTrace, String, Option<usize>)>,
    opts: &ImportOptions,
    name: &str,
    label: &str,
) -> Result<Trace, TraceError> {
    import_reporting(traces, opts, name, label, AgentxReport::default())
}

/// [`import_traces`], adding to `rep` (what reading found) what the import finds.
fn import_reporting(
    traces: Vec<(WekaTrace, String, Option<usize>)>,
    opts: &ImportOptions,
    name: &str,
    label: &str,
    mut rep: AgentxReport,
) -> Result<Trace, TraceError> {
    if traces.is_empty() {
        return Err(TraceError::invalid(name, None, "no traces"));
    }
    let block_size = traces[0].0.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    let mut b = TraceBuilder::with_header(Header {
        block_size,
        name: Some(label.to_owned()),
        source: None,
    })
    .map_err(|e| TraceError::at(name, None, e))?;
    let mut next_id = 0u64;
    let mut global: HashMap<u64, u64> = HashMap::new();
    for (k, (t, file, line)) in traces.into_iter().enumerate() {
        let origin = Origin { file, line };
        let bad = |msg: String| TraceError::invalid(&origin.file, origin.line, msg);
        let id = match &t.id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let bs = t.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
        if bs != block_size {
            return Err(bad(format!(
                "trace `{id}` has block_size {bs}, the first trace {block_size}: one import holds one block size"
            )));
        }
        let scope = t
            .hash_id_scope
            .clone()
            .unwrap_or_else(|| "local".to_owned());
        *rep.scopes.entry(scope.clone()).or_default() += 1;
        // Flatten the tree into agents.
        let mut agents = vec![AgentTmp {
            id: "main".to_owned(),
            agent_type: "main".to_owned(),
            parent: None,
            spawned_turn: None,
            system_tokens: t.system_tokens,
            tool_tokens: t.tool_tokens,
            requests: Vec::new(),
        }];
        let t0 = min_t(&t.requests).unwrap_or(0.0);
        if t0 < 0.0 {
            rep.negative_starts += 1;
        }
        rep.early_subagent_markers += early_markers(&t.requests, t0);
        let api = opts.api.unwrap_or_else(|| implied_api(&t));
        *rep.apis.entry(api.name().to_owned()).or_default() += 1;
        let opts = &ImportOptions {
            api: Some(api),
            ..opts.clone()
        };
        let mut names: HashMap<String, usize> = HashMap::from([("main".to_owned(), 1)]);
        let mut local_map = Renumber {
            map: HashMap::new(),
            next: &mut next_id,
        };
        match scope.as_str() {
            "local" => flatten(
                &t.requests,
                0,
                t0,
                opts,
                &mut agents,
                &mut names,
                &mut rep,
                &mut local_map,
            ),
            "global" => {
                let mut g = Renumber {
                    map: std::mem::take(&mut global),
                    next: local_map.next,
                };
                flatten(
                    &t.requests,
                    0,
                    t0,
                    opts,
                    &mut agents,
                    &mut names,
                    &mut rep,
                    &mut g,
                );
                global = g.map;
            }
            other => {
                return Err(bad(format!(
                    "trace `{id}`: unsupported hash_id_scope `{other}` (local, global)"
                )));
            }
        }
        if agents[0].requests.is_empty() {
            return Err(bad(format!(
                "trace `{id}` has no requests of its main agent"
            )));
        }
        let sid = b
            .session(SessionSpec {
                id: id.clone(),
                start_ms: opts.agentx_stagger_ms.map(|s| s.saturating_mul(k as u64)),
                ..SessionSpec::default()
            })
            .map_err(|e| TraceError::at(&origin.file, origin.line, e))?;
        let mut ids = Vec::with_capacity(agents.len());
        for a in &agents {
            let aid = b
                .agent(
                    sid,
                    AgentSpec {
                        id: a.id.clone(),
                        agent_type: a.agent_type.clone(),
                        parent: a.parent.map(|p| agents[p].id.clone()),
                        spawned_by_turn: a.spawned_turn,
                        system_tokens: a.system_tokens,
                        tool_tokens: a.tool_tokens,
                    },
                )
                .map_err(|e| TraceError::at(&origin.file, origin.line, e))?;
            ids.push(aid);
        }
        for (a, aid) in agents.into_iter().zip(ids) {
            for (spec, hash_ids) in a.requests {
                rep.requests += 1;
                b.request(aid, spec, &hash_ids)
                    .map_err(|e| TraceError::at(&origin.file, origin.line, e))?;
            }
        }
        rep.traces += 1;
    }
    b.header_mut().source = Some(serde_json::json!({
        "format": "agentx",
        "file": label,
        "report": rep,
    }));
    b.build().map_err(|e| TraceError::at(name, None, e))
}

/// The earliest request time of a trace, subagents' requests included. A
/// subagent entry's own `t` is a marker, not a request: it does not move the
/// timeline (older exports put some far in the past).
fn min_t(items: &[WekaItem]) -> Option<f64> {
    items
        .iter()
        .filter_map(|i| match i {
            WekaItem::Normal(r) | WekaItem::Streamed(r) => Some(r.t),
            WekaItem::Subagent(s) => min_t(&s.requests),
        })
        .filter(|t| t.is_finite())
        .reduce(f64::min)
}

/// Subagent entries (at any depth) whose marker `t` is before `t0`.
fn early_markers(items: &[WekaItem], t0: f64) -> usize {
    items
        .iter()
        .map(|i| match i {
            WekaItem::Subagent(s) => usize::from(s.t < t0) + early_markers(&s.requests, t0),
            _ => 0,
        })
        .sum()
}

/// The API a trace's models speak: Claude models Anthropic Messages (Claude
/// Code traffic), Codex models OpenAI Responses (the Codex CLI), else Chat.
fn implied_api(t: &WekaTrace) -> Api {
    fn models(items: &[WekaItem], out: &mut Vec<String>) {
        for i in items {
            match i {
                WekaItem::Normal(r) | WekaItem::Streamed(r) => out.extend(r.model.clone()),
                WekaItem::Subagent(s) => models(&s.requests, out),
            }
        }
    }
    let mut all = t.models.clone();
    models(&t.requests, &mut all);
    let has = |needle: &str| all.iter().any(|m| m.to_ascii_lowercase().contains(needle));
    if has("claude") {
        Api::Messages
    } else if has("codex") {
        Api::Responses
    } else {
        Api::Chat
    }
}

fn ms(t: f64, t0: f64) -> u64 {
    let v = ((t - t0) * 1000.0).round();
    if v.is_finite() && v > 0.0 {
        v as u64
    } else {
        0
    }
}

/// Adds `items` to agent `me` (and its subagents to `agents`).
#[allow(
    clippy::too_many_arguments,
    reason = "one recursive walk over the trace tree"
)]
fn flatten(
    items: &[WekaItem],
    me: usize,
    t0: f64,
    opts: &ImportOptions,
    agents: &mut Vec<AgentTmp>,
    names: &mut HashMap<String, usize>,
    rep: &mut AgentxReport,
    ids: &mut Renumber<'_>,
) {
    // (t, api_time) of this agent's previous request, for gaps.
    let mut prev: Option<(f64, Option<f64>)> = None;
    let mut after_subagent = false;
    for (i, item) in items.iter().enumerate() {
        match item {
            WekaItem::Normal(r) | WekaItem::Streamed(r) => {
                let first = agents[me].requests.is_empty();
                let opened_by = if first && me == 0 {
                    TurnKind::First
                } else if first || after_subagent {
                    TurnKind::Handoff
                } else if r.input_types.iter().any(|t| t == "tool_result") {
                    TurnKind::Tool
                } else {
                    TurnKind::User
                };
                let next_is_subagent = matches!(items.get(i + 1), Some(WekaItem::Subagent(_)));
                let ended_by = match r.stop.as_deref() {
                    Some("tool_use") if next_is_subagent => Some(EndReason::Handoff),
                    Some("tool_use") => Some(EndReason::ToolCall),
                    Some("end_turn") => Some(EndReason::EndTurn),
                    _ => None,
                };
                let gap_ms = match (r.think_time, prev) {
                    (Some(think), _) if think.is_finite() && think >= 0.0 => {
                        Some((think * 1000.0).round() as u64)
                    }
                    (_, Some((pt, Some(api)))) => Some(ms(r.t, pt + api)),
                    _ => None,
                };
                let mut at_ms = ms(r.t, t0);
                if let Some((last, _)) = agents[me].requests.last()
                    && at_ms < last.at_ms
                {
                    rep.out_of_order += 1;
                    at_ms = last.at_ms;
                }
                let spec = RequestSpec {
                    gap_ms,
                    ended_by,
                    api: opts.api.unwrap_or(Api::Chat),
                    model: r.model.clone(),
                    ..RequestSpec::new(at_ms, r.input, r.out, opened_by)
                };
                agents[me].requests.push((spec, ids.ids(&r.hash_ids)));
                prev = Some((r.t, r.api_time));
                after_subagent = false;
            }
            WekaItem::Subagent(s) => {
                after_subagent = true;
                if !has_requests(&s.requests) {
                    rep.empty_subagents_skipped += 1;
                    continue;
                }
                let n = names.entry(s.agent_id.clone()).or_insert(0);
                *n += 1;
                let id = if *n == 1 {
                    s.agent_id.clone()
                } else {
                    rep.renamed_agents += 1;
                    format!("{}#{}", s.agent_id, n)
                };
                rep.subagents += 1;
                if me != 0 {
                    rep.nested_subagents += 1;
                }
                let child = agents.len();
                agents.push(AgentTmp {
                    id,
                    agent_type: s
                        .subagent_type
                        .clone()
                        .unwrap_or_else(|| "subagent".to_owned()),
                    parent: Some(me),
                    spawned_turn: agents[me].requests.len().checked_sub(1),
                    system_tokens: s.system_tokens,
                    tool_tokens: s.tool_tokens,
                    requests: Vec::new(),
                });
                flatten(&s.requests, child, t0, opts, agents, names, rep, ids);
            }
        }
    }
}

fn has_requests(items: &[WekaItem]) -> bool {
    items.iter().any(|i| !matches!(i, WekaItem::Subagent(_)))
}

/// The import report recorded in a trace imported from AgentX, if any.
pub fn report_of(trace: &Trace) -> Option<AgentxReport> {
    super::recorded_report(trace, super::Format::Agentx)
}

impl std::fmt::Display for AgentxReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scopes = self
            .scopes
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        write!(
            f,
            "{} AgentX traces ({scopes} hash-id scope), {} requests, {} subagents ({} nested; {} empty skipped; {} renamed); {} requests earlier than their predecessor",
            self.traces,
            self.requests,
            self.subagents,
            self.nested_subagents,
            self.empty_subagents_skipped,
            self.renamed_agents,
            self.out_of_order
        )?;
        let apis = self
            .apis
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        if !apis.is_empty() {
            write!(f, "; sent as {apis} (--api, else implied by the models)")?;
        }
        if self.negative_starts > 0 {
            write!(
                f,
                "; {} traces start at a negative t (shifted to 0)",
                self.negative_starts
            )?;
        }
        if self.early_subagent_markers > 0 {
            write!(
                f,
                "; {} subagent markers before their trace's first request (ignored for the timeline)",
                self.early_subagent_markers
            )?;
        }
        if !self.skipped_files.is_empty() {
            write!(
                f,
                "; {} files skipped (not .json/.jsonl): {}",
                self.skipped_files.len(),
                self.skipped_files.join(", ")
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
