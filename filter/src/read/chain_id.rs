//! The chain id: the Responses id the filter hands a client in place of the
//! engine's, carrying the chain's session so that any gateway replica derives
//! the same key from the next turn's `previous_response_id`, and the engine's
//! own id so the filter can give it back before the engine sees the request.
//!
//! Format (ASCII, so a client just echoes it, in a body or in a URL):
//! `resp_tt1` ‖ 2 hex digits *n* ‖ the session (*n* bytes, 2*n* hex digits)
//! ‖ the tag (16 hex digits) ‖ the engine's id. The tag is the first 8 bytes
//! of HMAC-SHA256 over (tenant, session, engine id), keyed by `chains.secret`
//! (else `cache_salt.secret`, else a public key: a checksum only). An id
//! whose tag does not verify for the request's tenant is forged, corrupted or
//! another tenant's: the filter never opens it (`docs/gateway.md`, "Responses
//! chains").

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// What every chain id starts with (`tt1`: tether, format 1).
pub const PREFIX: &[u8] = b"resp_tt1";

/// Longest session a chain id carries (the chain table's bound too).
pub const MAX_SESSION: usize = 128;

/// Longest id the filter reads (`previous_response_id`): a chain id longer
/// than this would not be read back, so none is made.
pub const MAX_ID: usize = crate::read::identity::MAX_ID_BYTES;

const TAG_HEX: usize = 16;

/// The MAC key of the chain ids, derived once from the configured secret.
pub type MacKey = [u8; 32];

/// The key for `secret` (`None`: the public key, a checksum without a secret).
pub fn mac_key(secret: Option<&[u8]>) -> MacKey {
    let mut h = Sha256::new();
    h.update(b"tether chain id key v1\0");
    if let Some(s) = secret {
        h.update(s);
    }
    h.finalize().into()
}

/// A `previous_response_id` as the filter reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previous<'a> {
    /// An engine's own id (a chain begun before chain ids, or with them off).
    Plain,
    /// A chain id that verified: the chain's session and the engine's id.
    Carried { session: Vec<u8>, engine: &'a [u8] },
    /// Has the prefix but is malformed, or its tag does not verify for this
    /// tenant: never opened, keyed as unseen, forwarded as sent.
    Forged,
}

/// Bytes an engine id may hold to be carried: the characters of ids engines
/// make (`resp_…`, UUIDs), which need no JSON escape and no URL encoding.
fn id_safe(id: &[u8]) -> bool {
    id.iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn tag(key: &MacKey, tenant: &[u8], session: &[u8], engine: &[u8]) -> [u8; 8] {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return [0; 8];
    };
    for part in [tenant, session, engine] {
        mac.update(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes());
        mac.update(part);
    }
    let out = mac.finalize().into_bytes();
    let mut t = [0u8; 8];
    for (d, s) in t.iter_mut().zip(out.iter()) {
        *d = *s;
    }
    t
}

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digit = |d: u8| HEX.get(usize::from(d)).copied().unwrap_or(b'0');
    for b in bytes {
        out.push(digit(b >> 4));
        out.push(digit(b & 15));
    }
}

fn unhex(hex: &[u8]) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.chunks_exact(2)
        .map(|p| Some(digit(*p.first()?)? << 4 | digit(*p.get(1)?)?))
        .collect()
}

/// The chain id of `engine` (the engine's answer id) for `session` of
/// `tenant`; `None` when it cannot carry them: a session over
/// [`MAX_SESSION`], an engine id with other characters, or a result over
/// [`MAX_ID`].
pub fn seal(key: &MacKey, tenant: &[u8], session: &[u8], engine: &[u8]) -> Option<Vec<u8>> {
    let n = u8::try_from(session.len()).ok()?;
    if session.len() > MAX_SESSION || engine.is_empty() || !id_safe(engine) {
        return None;
    }
    let mut out = Vec::with_capacity(PREFIX.len() + 2 + 2 * session.len() + TAG_HEX + engine.len());
    out.extend_from_slice(PREFIX);
    push_hex(&mut out, &[n]);
    push_hex(&mut out, session);
    push_hex(&mut out, &tag(key, tenant, session, engine));
    out.extend_from_slice(engine);
    (out.len() <= MAX_ID).then_some(out)
}

/// Reads `id` for `tenant`: plain, carried (tag verified) or forged.
pub fn open<'a>(key: &MacKey, tenant: &[u8], id: &'a [u8]) -> Previous<'a> {
    let Some(rest) = id.strip_prefix(PREFIX) else {
        return Previous::Plain;
    };
    parts(rest)
        .filter(|(session, t, engine)| tag(key, tenant, session, engine).as_slice() == t.as_slice())
        .map_or(Previous::Forged, |(session, _, engine)| Previous::Carried {
            session,
            engine,
        })
}

/// (session, tag, engine id) of a chain id after its prefix.
fn parts(rest: &[u8]) -> Option<(Vec<u8>, Vec<u8>, &[u8])> {
    let n = usize::from(*unhex(rest.get(..2)?)?.first()?);
    if n > MAX_SESSION {
        return None;
    }
    let session = unhex(rest.get(2..2 + 2 * n)?)?;
    let at = 2 + 2 * n;
    let t = unhex(rest.get(at..at + TAG_HEX)?)?;
    let engine = rest.get(at + TAG_HEX..)?;
    (!engine.is_empty() && id_safe(engine)).then_some((session, t, engine))
}

#[cfg(test)]
mod tests;
