//! The request path of chain ids: the engine's own id goes back into
//! `previous_response_id` before the engine sees the request — in place, at
//! the same length (the rest of the old value padded with JSON whitespace),
//! so `content-length` stays true and no other byte moves.

use super::rewrite::Edit;
use crate::json::Span;
use crate::read::Body;

/// The body member holding the id a Responses request continues.
pub const FIELD: &str = "previous_response_id";

/// `"engine"` as a JSON string (chain ids only carry engine ids that need no escape).
pub fn quoted(engine: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(engine.len() + 2);
    v.push(b'"');
    v.extend_from_slice(engine);
    v.push(b'"');
    v
}

/// The edit putting `engine` in place of the last `previous_response_id`
/// (the one JSON parsers keep); `fetch` reads the bytes before it when the
/// scanned head does not hold them. `None` when it cannot be made.
pub fn edit(
    body: &Body,
    engine: &[u8],
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Option<Edit> {
    let value = body.doc.members_named(&body.view, FIELD).last()?.value;
    let new = quoted(engine);
    if value.end.saturating_sub(value.start) < new.len() {
        return None;
    }
    let mut data = match body.view.bytes(Span::new(0, value.start)) {
        Some(b) => b.to_vec(),
        None => fetch(0, value.start).filter(|b| b.len() == value.start)?,
    };
    data.extend_from_slice(&new);
    data.resize(value.end, b' ');
    Some(Edit {
        len: value.end,
        data,
    })
}

#[cfg(test)]
mod tests;
