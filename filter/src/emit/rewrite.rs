//! Body rewrite for fields the filter owns (`cache_salt`, `session_id`,
//! `routed_dp_rank`): drop every client copy, insert ours first — replacing
//! only the body's prefix whenever the client copies sit before the conversation.

use crate::json::{self, Span};
use crate::read::scan::{Doc, Member, View};

/// Replace body bytes `[0, len)` with `data` (Envoy: `set_buffer_bytes(body, 0, len, data)`
/// drains `len` bytes and prepends `data`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub len: usize,
    pub data: Vec<u8>,
}

/// The rewrite, or `None` when it needs members the view does not hold (read the whole body, then retry).
pub fn plan(doc: &Doc, view: &View, owned: &[(&str, Vec<u8>)]) -> Option<Edit> {
    let open = json::skip_ws(&view.head, 0);
    if view.head.get(open) != Some(&b'{') {
        return None;
    }
    let is_owned = |m: &Member| {
        view.bytes(m.key)
            .is_some_and(|k| owned.iter().any(|(name, _)| json::key_eq(k, name)))
    };
    let removed: Vec<Span> = doc
        .members
        .iter()
        .filter(|m| is_owned(m))
        .map(|m| m.value)
        .collect();
    let cut = removed.iter().map(|s| s.end).max().unwrap_or(open + 1);
    if cut > view.head.len() {
        return None;
    }
    let mut data = Vec::with_capacity(cut + 64);
    data.push(b'{');
    for (i, (name, value)) in owned.iter().enumerate() {
        if i > 0 {
            data.push(b',');
        }
        data.push(b'"');
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(b"\":");
        data.extend_from_slice(value);
    }
    for m in doc
        .members
        .iter()
        .filter(|m| m.value.end <= cut && !is_owned(m))
    {
        data.push(b',');
        data.extend_from_slice(view.head.get(m.key.start.checked_sub(1)?..m.value.end)?);
    }
    let more = doc.members.iter().any(|m| m.value.end > cut) || doc.conv.is_some();
    if removed.is_empty() && more && !owned.is_empty() {
        data.push(b',');
    }
    Some(Edit { len: cut, data })
}

/// Applies an edit to a body (what the host does; used by tests and the fuzz target).
pub fn apply(body: &[u8], edit: &Edit) -> Vec<u8> {
    let mut out = edit.data.clone();
    out.extend_from_slice(body.get(edit.len..).unwrap_or_default());
    out
}
