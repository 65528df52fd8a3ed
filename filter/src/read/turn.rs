//! Turn markers: what ended the turn (first message, user reply, tool result,
//! subagent handoff), read from the last messages; and the turn count when the
//! whole conversation was walked.

use crate::api::{Api, ApiShape};
use crate::json::{Span, Value};
use crate::read::scan::{Conv, Doc, View};

pub use tether_wire::TurnKind;

/// The turn markers of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    pub kind: TurnKind,
    /// Turns so far, this one included; `None` when the conversation was not walked whole.
    pub count: Option<u32>,
    /// False when the prompt ends with an assistant message (a prefill), not a turn boundary.
    pub prompt_end: bool,
}

impl Turn {
    /// Whether the markers say the conversation was answered before: a
    /// count above 1, or, uncounted, a user reply or tool result (a handoff
    /// may be a subagent's first turn, so only its count says). Completions
    /// (one text, always `user`) never say.
    pub fn returning(&self, api: Api) -> bool {
        api != Api::Completions
            && match self.count {
                Some(n) => n > 1,
                None => matches!(self.kind, TurnKind::User | TurnKind::Tool),
            }
    }
}

/// One conversation entry, reduced to what turn detection needs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    System,
    User,
    /// Tool results, by call id.
    ToolResult(Vec<String>),
    /// Assistant side (message, reasoning, tool call): the calls it made as (id, tool name).
    Assistant(Vec<(String, String)>),
    Other,
}

fn string_of(v: Option<Value<'_>>) -> Option<String> {
    v.and_then(|v| v.str()).map(|s| s.into_owned())
}

fn entry(api: Api, v: Value<'_>) -> Entry {
    let role = string_of(v.get("role"));
    match api {
        Api::Chat => match role.as_deref() {
            Some("system" | "developer") => Entry::System,
            Some("user") => Entry::User,
            Some("tool" | "function") => {
                Entry::ToolResult(string_of(v.get("tool_call_id")).into_iter().collect())
            }
            Some("assistant") => {
                let calls = v
                    .get_head("tool_calls")
                    .map(|tc| {
                        tc.elements()
                            .filter_map(|c| {
                                let id = string_of(c.get("id"))?;
                                let name =
                                    string_of(c.get("function").and_then(|f| f.get("name")))?;
                                Some((id, name))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Entry::Assistant(calls)
            }
            _ => Entry::Other,
        },
        Api::Messages => {
            // `get_head` + the lazy element walk read each block once (stopping at `]`).
            let content = v.get_head("content");
            let blocks = || content.into_iter().flat_map(|c| c.elements());
            match role.as_deref() {
                Some("user") => {
                    let mut ids = Vec::new();
                    let mut has_result = false;
                    for b in blocks() {
                        if b.get("type").is_some_and(|t| t.str_is("tool_result")) {
                            has_result = true;
                            ids.extend(string_of(b.get("tool_use_id")));
                        }
                    }
                    if has_result {
                        Entry::ToolResult(ids)
                    } else {
                        Entry::User
                    }
                }
                Some("assistant") => Entry::Assistant(
                    blocks()
                        .filter(|b| b.get("type").is_some_and(|t| t.str_is("tool_use")))
                        .filter_map(|b| Some((string_of(b.get("id"))?, string_of(b.get("name"))?)))
                        .collect(),
                ),
                _ => Entry::Other,
            }
        }
        Api::Responses => {
            let ty = string_of(v.get("type"));
            match (ty.as_deref(), role.as_deref()) {
                (Some(t), _) if t.ends_with("_call_output") => {
                    Entry::ToolResult(string_of(v.get("call_id")).into_iter().collect())
                }
                (Some(t), _) if t.ends_with("_call") => {
                    let call = string_of(v.get("call_id")).zip(string_of(v.get("name")));
                    Entry::Assistant(call.into_iter().collect())
                }
                (Some("reasoning"), _) => Entry::Assistant(Vec::new()),
                (Some("message") | None, Some("system" | "developer")) => Entry::System,
                (Some("message") | None, Some("user")) => Entry::User,
                (Some("message") | None, Some("assistant")) => Entry::Assistant(Vec::new()),
                _ => Entry::Other,
            }
        }
        Api::Completions => Entry::User,
    }
}

/// Classifies the turn. `subagent_tools` names the tools whose results are
/// handoffs; `has_parent` marks a subagent (its first turn is a handoff).
pub fn classify(
    api: Api,
    doc: &Doc,
    view: &View,
    subagent_tools: &[String],
    has_parent: bool,
) -> Option<Turn> {
    classify_counting(api, doc, view, subagent_tools, has_parent, true)
}

/// [`classify`], counting the turns only when `count` is set (the count walks
/// every entry of the conversation; a deployment that does not read
/// `x-tether-turn` need not pay for it).
pub fn classify_counting(
    api: Api,
    doc: &Doc,
    view: &View,
    subagent_tools: &[String],
    has_parent: bool,
    count: bool,
) -> Option<Turn> {
    let conv = doc.conv.as_ref()?;
    let first_kind = if has_parent {
        TurnKind::Handoff
    } else {
        TurnKind::First
    };
    let (first, last, all) = match conv {
        Conv::Text { .. } => {
            let kind = if api == Api::Completions {
                TurnKind::User
            } else {
                first_kind
            };
            let count = (api != Api::Completions).then_some(1);
            return Some(Turn {
                kind,
                count,
                prompt_end: true,
            });
        }
        Conv::Array {
            first, last, all, ..
        } => (first, if *all { first } else { last }, *all),
    };
    if api == Api::Completions {
        return Some(Turn {
            kind: TurnKind::User,
            count: None,
            prompt_end: true,
        });
    }
    // Only the turn that just ended is classified: from the last entry that is
    // neither a tool result nor a tool call, to the end.
    let run_from = last
        .iter()
        .rposition(|s| view.value(*s).is_some_and(|v| api.ends_turn_run(v)))
        .unwrap_or(0);
    let entries: Vec<(Span, Entry)> = last
        .get(run_from..)
        .unwrap_or_default()
        .iter()
        .filter_map(|s| Some((*s, entry(api, view.value(*s)?))))
        .collect();
    // The first turn-taking entry from the start: when the prompt ends with it, this is the first turn.
    let opening = conv.opening_index(api, view).and_then(|i| first.get(i));
    let count =
        (all && count).then(|| count_turns(api, last.iter().filter_map(|s| view.value(*s))));
    let (last_span, last_entry) = entries.last()?;
    let (kind, prompt_end) = match last_entry {
        Entry::ToolResult(_) => {
            let run_start = entries
                .iter()
                .rposition(|(_, e)| !matches!(e, Entry::ToolResult(_)))
                .map_or(0, |p| p + 1);
            let ids: Vec<&String> = entries
                .iter()
                .skip(run_start)
                .flat_map(|(_, e)| match e {
                    Entry::ToolResult(ids) => ids.iter(),
                    _ => [].iter(),
                })
                .collect();
            let calls: Vec<&(String, String)> = entries
                .iter()
                .take(run_start)
                .rev()
                .take_while(|(_, e)| matches!(e, Entry::Assistant(_)))
                .flat_map(|(_, e)| match e {
                    Entry::Assistant(c) => c.iter(),
                    _ => [].iter(),
                })
                .collect();
            let handoff = calls
                .iter()
                .any(|(id, name)| ids.contains(&id) && subagent_tools.iter().any(|t| t == name));
            (
                if handoff {
                    TurnKind::Handoff
                } else {
                    TurnKind::Tool
                },
                true,
            )
        }
        Entry::User | Entry::Other => {
            if opening == Some(last_span) {
                (first_kind, true)
            } else {
                (TurnKind::User, true)
            }
        }
        Entry::System => (first_kind, true),
        Entry::Assistant(_) => (TurnKind::User, false),
    };
    Some(Turn {
        kind,
        count,
        prompt_end,
    })
}

/// Turns = maximal runs of user/tool entries (each run is answered by one model call).
/// Walks every entry of the conversation, so each is looked at once: its
/// `role` (and for Responses its `type`), compared in place.
fn count_turns<'a>(api: Api, entries: impl Iterator<Item = Value<'a>>) -> u32 {
    let mut turns = 0u32;
    let mut in_run = false;
    let system_roles = matches!(api, Api::Chat | Api::Responses);
    for v in entries {
        // SDKs put `role` first: read it in place, else walk the members.
        let fast = v.first_plain_str("role");
        let role = if fast.is_some() { None } else { v.get("role") };
        let role_is = |r: &str| match fast {
            Some(raw) => raw == r.as_bytes(),
            None => role.is_some_and(|x| x.str_is(r)),
        };
        if system_roles && (role_is("system") || role_is("developer")) {
            continue;
        }
        let assistant = role_is("assistant")
            || api == Api::Responses
                && v.get("type")
                    .and_then(|t| t.str())
                    .is_some_and(|t| t == "reasoning" || t.ends_with("_call"));
        if assistant {
            in_run = false;
        } else if !in_run {
            turns = turns.saturating_add(1);
            in_run = true;
        }
    }
    turns
}

/// Bytes of the conversation after its last assistant entry: the part of a
/// returning turn's prompt that its rank has not seen yet (tool results, the
/// user's reply), for the P/D decision (`crate::place::pd`). `None` when no assistant
/// entry is among the known last entries (a first turn, a text prompt).
pub fn new_turn_bytes(api: Api, doc: &Doc, view: &View) -> Option<usize> {
    let conv = doc.conv.as_ref()?;
    let elems = conv.last_elems();
    let end = elems.last()?.end;
    let assistant = elems.iter().rev().find(|s| {
        view.value(**s)
            .is_some_and(|v| matches!(entry(api, v), Entry::Assistant(_)))
    })?;
    Some(end.saturating_sub(assistant.end))
}

#[cfg(test)]
mod tests;
