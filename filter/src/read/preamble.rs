//! Per-request-varying preamble blocks, left out of the conversation-head
//! hash. Claude Code sends `x-anthropic-billing-header: cc_version=…; cch=…`
//! as the first block of `system`, and `cch` changes on every request: hashed
//! with the rest, every turn of a run would get a new head (and a subagent
//! keyed by its head a new key). Dynamo strips the same block before hashing.

use crate::json::Value;
use xxhash_rust::xxh3::Xxh3;

/// Text prefixes of system blocks that vary per request (raw JSON bytes after
/// the opening quote; the prefixes need no escaping).
pub const VARYING_PREFIXES: &[&[u8]] = &[b"x-anthropic-billing-header:"];

/// Whether a `system` block (`{"type":"text","text":…}`) varies per request.
pub fn varies(block: Value<'_>) -> bool {
    block
        .get("text")
        .and_then(|t| t.bytes().strip_prefix(b"\""))
        .is_some_and(|raw| VARYING_PREFIXES.iter().any(|p| raw.starts_with(p)))
}

/// Feeds a `system` value into the head hash: its raw bytes, as every other
/// top-level part — unless it is a block array with a varying block, then
/// each remaining block's raw bytes (so a system without such a block hashes
/// exactly as before).
pub fn feed_system(h: &mut Xxh3, v: Value<'_>) {
    h.update(b"system");
    if !(v.is_array() && v.elements().any(varies)) {
        h.update(&(v.bytes().len() as u64).to_le_bytes());
        h.update(v.bytes());
        return;
    }
    for block in v.elements().filter(|b| !varies(*b)) {
        h.update(&(block.bytes().len() as u64).to_le_bytes());
        h.update(block.bytes());
    }
}

#[cfg(test)]
mod tests;
