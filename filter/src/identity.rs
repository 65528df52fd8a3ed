//! Identity: walks the configured sources (trusted headers, JSON body paths)
//! to find tenant, session, subagent and parent, and derives the routing key.

use crate::config::{Config, Origin, Source};
use crate::json::Value;
use crate::scan::{Doc, View};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Fixed seed of every tether hash (keys must agree across gateway replicas).
pub const SEED: u64 = 0x7e7e_4e52_5445_5448;

/// Longest identity value accepted (header or body); longer ones are skipped as bad.
pub const MAX_ID_BYTES: usize = 1024;

/// Request headers as the host hands them over: (lower-case name, raw value).
pub type Headers = [(String, Vec<u8>)];

/// Hash of length-prefixed parts (so `("ab","c")` and `("a","bc")` differ).
/// Built on the stack when it fits: this runs several times per request on
/// the header path, where a heap allocation each time is measurable in V8.
pub fn hash_parts(parts: &[&[u8]]) -> u64 {
    let total: usize = parts.iter().map(|p| p.len() + 4).sum();
    let mut stack = [0u8; 128];
    if let Some(buf) = stack.get_mut(..total) {
        let mut rest: &mut [u8] = buf;
        for p in parts {
            let len = u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes();
            for chunk in [len.as_slice(), p] {
                let (head, tail) = rest.split_at_mut(chunk.len());
                head.copy_from_slice(chunk);
                rest = tail;
            }
        }
        return xxh3_64_with_seed(buf, SEED);
    }
    let mut buf = Vec::with_capacity(total);
    for p in parts {
        buf.extend_from_slice(&u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes());
        buf.extend_from_slice(p);
    }
    xxh3_64_with_seed(&buf, SEED)
}

/// 16 lower-case hex digits, on the stack (no formatting machinery: the
/// header path writes four or five of these per request).
pub fn hex16_bytes(h: u64) -> [u8; 16] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 16];
    for (i, d) in out.iter_mut().enumerate() {
        let nibble = (h >> (60 - 4 * i)) & 0xf;
        *d = DIGITS.get(nibble as usize).copied().unwrap_or(b'0');
    }
    out
}

/// 16 lower-case hex digits.
pub fn hex16(h: u64) -> String {
    hex16_bytes(h).iter().map(|&b| char::from(b)).collect()
}

/// What one source gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(Vec<u8>),
    Absent,
    /// Present but unusable: non-UTF-8, empty, repeated or over [`MAX_ID_BYTES`] (counted as `bad_header`).
    Bad,
}

/// Looks up a header; repeated headers are refused (a client could append its own copy).
pub fn header(headers: &Headers, name: &str) -> Lookup {
    let mut found: Option<&[u8]> = None;
    for (k, v) in headers {
        if k.eq_ignore_ascii_case(name) {
            if found.is_some() {
                return Lookup::Bad;
            }
            found = Some(v);
        }
    }
    match found {
        None => Lookup::Absent,
        Some(v) if v.is_empty() || v.len() > MAX_ID_BYTES || std::str::from_utf8(v).is_err() => {
            Lookup::Bad
        }
        Some(v) => Lookup::Found(v.to_vec()),
    }
}

/// Looks up a dotted body path: a string (unescaped), number or boolean; other
/// kinds, `null` and empty strings are absent.
pub fn body_path(doc: &Doc, view: &View, path: &[String]) -> Lookup {
    let Some((first, rest)) = path.split_first() else {
        return Lookup::Absent;
    };
    let Some(mut v) = doc.member(view, first) else {
        return Lookup::Absent;
    };
    for seg in rest {
        match v.get(seg) {
            Some(n) => v = n,
            None => return Lookup::Absent,
        }
    }
    scalar_id(v)
}

fn scalar_id(v: Value<'_>) -> Lookup {
    match v.bytes().first() {
        Some(b'"') => match v.str() {
            Some(s) if s.is_empty() => Lookup::Absent,
            Some(s) if s.len() > MAX_ID_BYTES => Lookup::Bad,
            Some(s) => Lookup::Found(s.as_bytes().to_vec()),
            None => Lookup::Bad,
        },
        Some(b'-' | b'0'..=b'9' | b't' | b'f') if v.bytes().len() <= 64 => {
            Lookup::Found(v.bytes().to_vec())
        }
        _ => Lookup::Absent,
    }
}

/// The body as far as it was scanned, plus its conversation-head hash.
#[derive(Clone, Copy)]
pub struct BodyRef<'a> {
    pub doc: &'a Doc,
    pub view: &'a View,
    pub head: Option<u64>,
}

fn lookup(src: &Source, headers: &Headers, body: Option<BodyRef<'_>>) -> Option<Lookup> {
    match &src.origin {
        Origin::Header(name) => Some(header(headers, name)),
        Origin::Body(path) => body.map(|b| body_path(b.doc, b.view, path)),
    }
}

/// Which source produced the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `session_sources[i]`.
    Source(usize),
    /// The conversation-head hash.
    Head,
    /// Nothing usable: see [`crate::Reason`].
    Fallback(crate::Reason),
}

/// A resolved identity: raw materials stay inside the filter, only hashes leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub tenant: Vec<u8>,
    pub session: Vec<u8>,
    /// Explicit subagent id, or the head hash when the session is a body field
    /// shared by all subagents; `None` = main agent named by a header.
    pub subagent: Option<Vec<u8>>,
    pub parent: Option<Vec<u8>>,
    pub source: KeySource,
}

impl Identity {
    /// `xxh3_64(tenant ‖ session ‖ subagent)`, length-prefixed, fixed seed.
    pub fn key(&self) -> u64 {
        hash_parts(&[
            &self.tenant,
            &self.session,
            self.subagent.as_deref().unwrap_or_default(),
        ])
    }

    pub fn tenant_hash(&self) -> u64 {
        hash_parts(&[b"tenant", &self.tenant])
    }

    pub fn session_hash(&self) -> u64 {
        hash_parts(&[b"session", &self.tenant, &self.session])
    }

    /// 0 for the main agent (no subagent part).
    pub fn subagent_hash(&self) -> u64 {
        self.subagent
            .as_ref()
            .map_or(0, |s| hash_parts(&[b"subagent", &self.tenant, s]))
    }

    pub fn parent_hash(&self) -> Option<u64> {
        self.parent
            .as_ref()
            .map(|p| hash_parts(&[b"parent", &self.tenant, p]))
    }
}

/// Outcome of walking the sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Identity known (from headers alone when no body was given).
    Known(Identity),
    /// A body source comes before any present header source: read the body.
    NeedBody,
    /// No source and no head hash: the caller uses the fallback key.
    Nothing,
}

/// Walks the sources. With `body == None` (header callback) body sources are
/// unknown: the walk stops at the first one unless a header source hit before.
/// Returns the resolution and how many present-but-bad headers were skipped.
pub fn resolve(cfg: &Config, headers: &Headers, body: Option<BodyRef<'_>>) -> (Resolution, u32) {
    let mut bad = 0u32;
    let tenant = match &cfg.tenant_header {
        None => Vec::new(),
        Some(name) => match header(headers, name) {
            Lookup::Found(v) => v,
            Lookup::Absent => Vec::new(),
            Lookup::Bad => {
                bad += 1;
                Vec::new()
            }
        },
    };
    let head = body.and_then(|b| b.head);
    let mut session = None;
    for (i, src) in cfg.session_sources.iter().enumerate() {
        match lookup(src, headers, body) {
            None => return (Resolution::NeedBody, bad),
            Some(Lookup::Absent) => {}
            Some(Lookup::Bad) => bad += 1,
            Some(Lookup::Found(v)) if src.with_head => {
                if body.is_none() {
                    return (Resolution::NeedBody, bad);
                }
                if let Some(h) = head {
                    let mut m = v;
                    m.push(0);
                    m.extend_from_slice(&h.to_le_bytes());
                    session = Some((KeySource::Source(i), m, false));
                    break;
                }
            }
            Some(Lookup::Found(v)) => {
                session = Some((KeySource::Source(i), v, !src.is_header()));
                break;
            }
        }
    }
    let (source, session, shared_body_field) = match (session, head) {
        (Some(s), _) => s,
        (None, Some(h)) => (KeySource::Head, h.to_le_bytes().to_vec(), false),
        (None, None) => {
            return (
                if body.is_some() {
                    Resolution::Nothing
                } else {
                    Resolution::NeedBody
                },
                bad,
            );
        }
    };
    let mut first_of = |list: &[Source]| -> Option<Vec<u8>> {
        for src in list {
            match lookup(src, headers, body) {
                None | Some(Lookup::Absent) => {}
                Some(Lookup::Bad) => bad += 1,
                Some(Lookup::Found(v)) => return Some(v),
            }
        }
        None
    };
    let mut subagent = first_of(&cfg.subagent_sources);
    let parent = first_of(&cfg.parent_sources);
    if subagent.is_none() && shared_body_field {
        // Every subagent of a run shares such a field: its own head tells them apart.
        subagent = head.map(|h| {
            let mut m = b"head:".to_vec();
            m.extend_from_slice(&h.to_le_bytes());
            m
        });
    }
    (
        Resolution::Known(Identity {
            tenant,
            session,
            subagent,
            parent,
            source,
        }),
        bad,
    )
}

/// The documented fallback identity: tenant + the first [`FALLBACK_PREFIX`]
/// bytes of the raw body (the conversation head, unchanged between turns).
pub fn fallback(tenant: Vec<u8>, body_prefix: &[u8], reason: crate::Reason) -> Identity {
    let mut session = b"fallback:".to_vec();
    session.extend_from_slice(&xxh3_64_with_seed(body_prefix, SEED).to_le_bytes());
    Identity {
        tenant,
        session,
        subagent: None,
        parent: None,
        source: KeySource::Fallback(reason),
    }
}

/// Bytes of the raw body that feed the fallback key.
pub const FALLBACK_PREFIX: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    /// The allocation-free helpers agree with the plain definitions.
    #[test]
    fn stack_hashing_and_hex_match_the_plain_definitions() {
        let plain = |parts: &[&[u8]]| {
            let mut buf = Vec::new();
            for p in parts {
                buf.extend_from_slice(&(p.len() as u32).to_le_bytes());
                buf.extend_from_slice(p);
            }
            xxh3_64_with_seed(&buf, SEED)
        };
        let long = vec![b'x'; 300];
        for parts in [
            &[][..],
            &[b"".as_slice()][..],
            &[b"tenant".as_slice(), b"t1"][..],
            &[b"a".as_slice(), b"bc", b""][..],
            &[b"session".as_slice(), &long[..240]][..],
            &[b"session".as_slice(), &long[..]][..],
        ] {
            assert_eq!(hash_parts(parts), plain(parts));
        }
        for h in [0, 1, 0xdead_beef, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(hex16(h), format!("{h:016x}"));
        }
    }
}
