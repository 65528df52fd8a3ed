//! The conversation-head hash: what stays the same on every turn of one run
//! and differs between runs and subagents — system prompt, tool schema and the
//! first user message (never `messages[0]` alone).
//!
//! Top-level parts (`system`, `tools`, `instructions`) are hashed as raw bytes.
//! Conversation entries are hashed canonically: whitespace and `cache_control`
//! members are ignored (harnesses move `cache_control` markers to the newest
//! messages each turn), and strings over [`LONG_STRING`] bytes contribute their length, first
//! and last [`LONG_STRING`]/2 bytes (a pasted file is identified by its ends;
//! the hash stays cheap for 100-KB first messages).

use crate::api::Api;
use crate::json::{self, Value};
use crate::read::scan::{Conv, Doc, View};
use xxhash_rust::xxh3::Xxh3;

/// Strings longer than this are hashed by length, prefix and suffix.
pub const LONG_STRING: usize = 4096;

/// Nesting below this depth is hashed as raw bytes.
const MAX_CANON_DEPTH: usize = 64;

/// Hashes `v` canonically into `h`.
fn feed(h: &mut Xxh3, v: Value<'_>, depth: usize) {
    let bytes = v.bytes();
    if depth > MAX_CANON_DEPTH {
        h.update(bytes);
        return;
    }
    match bytes.first() {
        Some(b'{') => {
            h.update(b"{");
            for (k, val) in v.members() {
                if json::key_eq(k, "cache_control") {
                    continue;
                }
                h.update(k);
                h.update(b":");
                feed(h, val, depth + 1);
            }
            h.update(b"}");
        }
        Some(b'[') => {
            h.update(b"[");
            for e in v.elements() {
                feed(h, e, depth + 1);
                h.update(b",");
            }
            h.update(b"]");
        }
        Some(b'"') => feed_string(h, bytes),
        _ => h.update(bytes),
    }
}

/// A string (with its quotes, or a cut prefix of one): short ones whole, long ones by ends.
fn feed_string(h: &mut Xxh3, bytes: &[u8]) {
    if bytes.len() <= LONG_STRING {
        h.update(bytes);
        return;
    }
    let half = LONG_STRING / 2;
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes.get(..half).unwrap_or_default());
    h.update(bytes.get(bytes.len() - half..).unwrap_or_default());
}

/// The head hash of a scanned body; `None` when the body has no conversation.
pub fn head_hash(api: Api, doc: &Doc, view: &View) -> Option<u64> {
    let mut h = Xxh3::with_seed(crate::read::identity::SEED);
    h.update(api.name().as_bytes());
    // Top-level parts are hashed as raw bytes: a harness sends them byte-identical
    // every turn, and raw xxh3 is far cheaper than a walk over 60 KB of tool schemas.
    fn part(h: &mut Xxh3, name: &str, v: Option<Value<'_>>) {
        if let Some(v) = v {
            h.update(name.as_bytes());
            h.update(&(v.bytes().len() as u64).to_le_bytes());
            h.update(v.bytes());
        }
    }
    match api {
        Api::Chat => {
            part(&mut h, "tools", doc.member(view, "tools"));
            part(&mut h, "functions", doc.member(view, "functions"));
        }
        Api::Responses => {
            part(&mut h, "instructions", doc.member(view, "instructions"));
            part(&mut h, "tools", doc.member(view, "tools"));
        }
        Api::Messages => {
            // Without its per-request blocks (Claude Code's billing header);
            // a system without them hashes as the other raw parts.
            if let Some(s) = doc.member(view, "system") {
                crate::read::preamble::feed_system(&mut h, s);
            }
            part(&mut h, "tools", doc.member(view, "tools"));
        }
        Api::Completions => {}
    }
    // Chained Responses requests carry only the new items: the head is then
    // instructions + tools, the part that stays the same along the chain.
    let chained = api == Api::Responses
        && doc
            .member(view, "previous_response_id")
            .is_some_and(|v| v.is_string());
    let conv = doc.conv.as_ref()?;
    if chained {
        return Some(h.digest());
    }
    h.update(b"conversation");
    match conv {
        Conv::Array { first, .. } => {
            if first.is_empty() {
                return None;
            }
            // Up to and including the first entry that is not a preamble.
            let upto = conv.opening_index(api, view).unwrap_or(first.len() - 1);
            for s in first.get(..=upto).unwrap_or(first) {
                feed(&mut h, view.value(*s)?, 0);
            }
        }
        Conv::Text { prefix } => {
            let bytes = view.bytes(*prefix)?;
            feed_string(
                &mut h,
                bytes
                    .get(..bytes.len().min(LONG_STRING))
                    .unwrap_or_default(),
            );
        }
    }
    Some(h.digest())
}

#[cfg(test)]
mod tests;
