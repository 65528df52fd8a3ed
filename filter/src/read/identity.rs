//! Identity: walks the configured sources (trusted headers, JSON body paths)
//! to find tenant, session, subagent and parent, and derives the routing key.

use crate::config::{Config, Origin, Source};
use crate::json::Value;
use crate::read::scan::{Doc, View};
use tether_placement::keys;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use tether_placement::keys::{SEED, hash_parts};
pub use tether_wire::hex::{hex16, hex16_bytes};

/// Longest identity value accepted (header or body); longer ones are skipped as bad.
pub const MAX_ID_BYTES: usize = 1024;

/// Request headers as the host hands them over: (lower-case name, raw value).
pub type Headers = [(String, Vec<u8>)];

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
    /// A Responses continuation (`previous_response_id`), keyed by its
    /// chain ([`crate::read::chain`]).
    Chain(crate::read::chain::ChainFrom),
    /// Nothing usable: see [`crate::read::reason::Reason`].
    Fallback(crate::read::reason::Reason),
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
        keys::routing_key(&self.tenant, &self.session, self.subagent.as_deref())
    }

    pub fn tenant_hash(&self) -> u64 {
        keys::tenant_hash(&self.tenant)
    }

    pub fn session_hash(&self) -> u64 {
        keys::session_hash(&self.tenant, &self.session)
    }

    /// 0 for the main agent (no subagent part).
    pub fn subagent_hash(&self) -> u64 {
        keys::subagent_hash(&self.tenant, self.subagent.as_deref())
    }

    pub fn parent_hash(&self) -> Option<u64> {
        self.parent
            .as_ref()
            .map(|p| keys::parent_hash(&self.tenant, p))
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
pub fn fallback(
    tenant: Vec<u8>,
    body_prefix: &[u8],
    reason: crate::read::reason::Reason,
) -> Identity {
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
