//! OpenAI Responses chains: a request that continues a stored response
//! (`previous_response_id`) carries only its new items, so its head no longer
//! names the run. The filter learns `response id → session` on the response
//! path and keys each continuation by the session of the response it
//! continues: every turn of a chain keeps turn 1's key.
//!
//! The table lives in proxy-wasm shared data (one per Envoy process, seen by
//! every worker) as a fixed number of slots, two candidates per id, each
//! entry stamped with the time it was written: memory is bounded by the slot
//! count, and an entry older than the TTL reads as absent. A continuation
//! whose previous response is not in the table (another gateway replica
//! answered it, it expired, or its slot was reused) is keyed by that response
//! id instead: a key of its own, never another chain's, which the table then
//! carries along the rest of the chain on this replica. `docs/gateway.md`,
//! "Responses chains".

use crate::api::Api;
use crate::config::Config;
use crate::read::chain_id::{self, MacKey, Previous};
use crate::read::identity::{Identity, KeySource, MAX_ID_BYTES};
use crate::read::scan::{Doc, View};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The `chains` configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainConfig {
    /// Slots in the shared-data table (`chains.slots`).
    pub slots: u32,
    /// How long a learned response id is kept (`chains.ttl_s`), in milliseconds.
    pub ttl_ms: u64,
    /// Hand clients chain ids in place of the engine's (`chains.wrap`).
    pub wrap: bool,
    /// The chain ids' MAC key (`chains.secret`, else `cache_salt.secret`).
    pub key: MacKey,
}

impl Default for ChainConfig {
    fn default() -> Self {
        Self {
            slots: 32_768,
            ttl_ms: 3_600_000,
            wrap: true,
            key: crate::read::chain_id::mac_key(None),
        }
    }
}

/// Longest session stored in the table or carried in a chain id; longer
/// ones (a long `user` with the head hash) are neither, so both stay small.
pub use crate::read::chain_id::MAX_SESSION;

/// Bytes of the response body searched for its `id` before giving up.
pub const ID_WINDOW: usize = 16 * 1024;

/// Shared-data key of slot `i`.
pub fn slot_key(i: u32) -> String {
    format!("tether.chain.{i}")
}

/// Looks up the session a response id was learned under.
pub trait Chains: std::fmt::Debug {
    fn session_of(&self, response_id: &[u8]) -> Option<Vec<u8>>;
}

/// No table (native callers without a host): every continuation is unseen.
#[derive(Debug, Clone, Copy)]
pub struct NoChains;

impl Chains for NoChains {
    fn session_of(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// Where the table's slots are kept: shared data in Envoy, a map in tests.
pub trait SlotStore {
    fn get(&self, slot: u32) -> Option<Vec<u8>>;
    /// Writes a slot; false when the host refused.
    fn set(&self, slot: u32, value: &[u8]) -> bool;
}

/// The table over a slot store, at one instant.
#[derive(Debug)]
pub struct Table<'s, S> {
    pub store: &'s S,
    pub cfg: ChainConfig,
    pub now_ms: u64,
}

fn id_hash(id: &[u8]) -> u64 {
    xxh3_64_with_seed(id, crate::read::identity::SEED ^ 0x6368_6169_6e00)
}

/// An entry: id hash, write time, session.
fn entry(id: u64, at_ms: u64, session: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + session.len());
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&at_ms.to_le_bytes());
    v.extend_from_slice(session);
    v
}

fn word(v: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(v.get(at..at + 8)?.try_into().ok()?))
}

impl<S: SlotStore> Table<'_, S> {
    /// The two candidate slots of an id hash.
    fn slots(&self, h: u64) -> [u32; 2] {
        let n = u64::from(self.cfg.slots.max(1));
        [(h % n) as u32, ((h >> 32).rotate_left(7) % n) as u32]
    }

    fn live(&self, at_ms: u64) -> bool {
        self.now_ms.saturating_sub(at_ms) < self.cfg.ttl_ms
    }

    /// The session `response_id` was learned under, if still live here.
    pub fn lookup(&self, response_id: &[u8]) -> Option<Vec<u8>> {
        let h = id_hash(response_id);
        self.slots(h).into_iter().find_map(|s| {
            let v = self.store.get(s)?;
            (word(&v, 0)? == h && self.live(word(&v, 8)?))
                .then(|| v.get(16..).map(<[u8]>::to_vec))?
        })
    }

    /// Learns `response_id → session` into whichever candidate slot is free,
    /// expired or older. False when nothing was written.
    pub fn learn(&self, response_id: &[u8], session: &[u8]) -> bool {
        if session.len() > MAX_SESSION {
            return false;
        }
        let h = id_hash(response_id);
        let [a, b] = self.slots(h);
        let age = |s: u32| match self.store.get(s) {
            Some(v) if word(&v, 0) == Some(h) => (0, 0),
            Some(v) => match word(&v, 8) {
                Some(at) if self.live(at) => (2, at),
                _ => (1, 0),
            },
            None => (1, 0),
        };
        // Same id first, then a free/expired slot, then the older one.
        let (ka, kb) = (age(a), age(b));
        let slot = if ka.0 < kb.0 || (ka.0 == kb.0 && ka.1 <= kb.1) {
            a
        } else {
            b
        };
        self.store.set(slot, &entry(h, self.now_ms, session))
    }
}

impl<S: SlotStore + std::fmt::Debug> Chains for Table<'_, S> {
    fn session_of(&self, response_id: &[u8]) -> Option<Vec<u8>> {
        self.lookup(response_id)
    }
}

/// Where a continuation's session came from (`x-tether-key-source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainFrom {
    /// Carried in the chain id it continues: the same on every replica (`chain`).
    Id,
    /// A plain engine id this replica learned (`chain:table`).
    Table,
    /// A plain engine id this replica has not seen (`chain:unseen`).
    Unseen,
    /// A chain id that failed its check, keyed like an unseen one (`chain:forged`).
    Forged,
}

/// What a request's `previous_response_id` asks of the filter, whatever
/// named its key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainRead {
    /// The engine's own id, put back in `previous_response_id` before the
    /// engine sees the request.
    pub unwrap: Option<Vec<u8>>,
    /// The id looked like a chain id and failed its check (counted).
    pub forged: bool,
}

/// Whether `source` names a run only by its conversation (the head, a
/// `+head` source) or by its chain: such a Responses request is keyed by its
/// chain, and its answer's id carries the chain on.
pub fn keyed_by_head(cfg: &Config, source: &KeySource) -> bool {
    match source {
        KeySource::Head | KeySource::Chain(_) => true,
        KeySource::Source(i) => cfg.session_sources.get(*i).is_some_and(|s| s.with_head),
        KeySource::Fallback(_) => false,
    }
}

/// Reads a Responses request's `previous_response_id`: a chain id that
/// verifies is opened (its engine id to put back); a continuation keyed by
/// its head (its head no longer names the run) takes the chain's session —
/// carried in the id, else learned by this replica, else the previous id's own.
pub fn continue_chain(
    cfg: &Config,
    api: Api,
    chains: &dyn Chains,
    doc: &Doc,
    view: &View,
    id: &mut Identity,
) -> ChainRead {
    if api != Api::Responses {
        return ChainRead::default();
    }
    let Some(previous) = previous_id(doc, view) else {
        return ChainRead::default();
    };
    let opened = chain_id::open(&cfg.chains.key, &id.tenant, &previous);
    let read = ChainRead {
        unwrap: match &opened {
            Previous::Carried { engine, .. } => Some(engine.to_vec()),
            Previous::Plain | Previous::Forged => None,
        },
        forged: opened == Previous::Forged,
    };
    if !keyed_by_head(cfg, &id.source) {
        return read;
    }
    let (session, from) = match opened {
        Previous::Carried { session, .. } => (session, ChainFrom::Id),
        Previous::Forged => (unseen_session(&previous), ChainFrom::Forged),
        Previous::Plain => match chains.session_of(&previous) {
            Some(s) => (s, ChainFrom::Table),
            None => (unseen_session(&previous), ChainFrom::Unseen),
        },
    };
    id.session = session;
    id.source = KeySource::Chain(from);
    read
}

/// A Responses request's `previous_response_id`, when it names one.
pub fn previous_id(doc: &Doc, view: &View) -> Option<Vec<u8>> {
    let v = doc.member(view, "previous_response_id")?;
    let s = v.str()?;
    (!s.is_empty() && s.len() <= MAX_ID_BYTES).then(|| s.as_bytes().to_vec())
}

/// The session of a continuation whose previous response this gateway has
/// not seen: the previous response's id, unique to its chain.
pub fn unseen_session(previous: &[u8]) -> Vec<u8> {
    let mut s = b"chain:".to_vec();
    s.extend_from_slice(previous);
    s
}

/// The new response's `id`, from the first bytes of a Responses answer: a
/// JSON response object (`{"id": …}`) or an SSE stream whose first event
/// carries it (`data: {"type":"response.created","response":{"id": …}}`).
/// `None` while the bytes end before it.
pub fn response_id(prefix: &[u8]) -> Option<Vec<u8>> {
    let start = crate::json::skip_ws(prefix, 0);
    let rest = prefix.get(start..)?;
    if rest.first() == Some(&b'{') {
        return string_member(rest, "id");
    }
    // SSE: the first `data:` line's JSON, whose `response` holds the id.
    let at = memchr::memmem::find(rest, b"data:")?;
    let data = rest.get(at + 5..)?;
    let data = data.get(crate::json::skip_ws(data, 0)..)?;
    let response = crate::json::Value(data).get_head("response")?;
    string_member(response.bytes(), "id")
}

/// [`response_id`] of an answer's first bytes as they arrive: coded with
/// `content-encoding` when the upstream compressed it (the bytes decoded so
/// far are searched; a cut stream decodes up to the cut).
pub fn coded_response_id(
    enc: crate::read::encoding::ContentEncoding,
    first: &[u8],
) -> Option<Vec<u8>> {
    use crate::read::encoding::{ContentEncoding, DecodeError, decode};
    match enc {
        ContentEncoding::Identity => response_id(first),
        ContentEncoding::Decodable(e) => match decode(e, first, ID_WINDOW) {
            Ok(plain)
            | Err(DecodeError::TooLarge { prefix: plain })
            | Err(DecodeError::Corrupt { prefix: plain }) => response_id(&plain),
        },
        ContentEncoding::Other => None,
    }
}

/// Top-level string member `key` of an object that may be cut after it.
fn string_member(obj: &[u8], key: &str) -> Option<Vec<u8>> {
    let v = crate::json::Value(obj).get_head(key)?;
    let end = crate::json::skip_string(v.bytes(), 0).ok()?;
    let s = crate::json::Value(v.bytes().get(..end)?).str()?;
    (!s.is_empty() && s.len() <= MAX_ID_BYTES).then(|| s.as_bytes().to_vec())
}

#[cfg(test)]
mod tests;
