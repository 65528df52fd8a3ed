//! The polled residency view of residency-aware placement: per endpoint, what
//! its last `/load` said it holds and when, and the byte forms the poller keeps
//! in proxy-wasm shared data. Every worker reads one small index per tick (a
//! content hash and a time per endpoint) and re-reads an endpoint's blob (up to
//! ~410 KB) only when its hash changed, decoding it once per worker; requests
//! read the worker's decoded view with no host call and no copy.

use tether_placement::residency::{Summary, VERSION};
use tether_placement::{Knows, Resident};

/// Bytes per entry of a blob: 16 + 8 + 1 hex digits (the summary's wire form).
const ENTRY: usize = 25;
/// Bytes per endpoint of the index: content hash, arrival ms.
const INDEX_REC: usize = 16;

/// One endpoint's last good summary.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// [`content_hash`] of its blob.
    hash: u64,
    /// When the reply arrived (host clock, ms since the epoch).
    at_ms: u64,
    resident: Resident,
}

/// Per endpoint (the decode endpoints, by index), its last summary, if any.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResidencyView {
    entries: Vec<Option<Entry>>,
}

/// The blob of a decoded summary: its keys, tokens and tiers strings back to back.
pub fn blob(r: &Resident) -> Vec<u8> {
    let s = r.encode(0);
    let mut out = Vec::with_capacity(s.keys.len() + s.tokens.len() + s.tiers.len());
    out.extend_from_slice(s.keys.as_bytes());
    out.extend_from_slice(s.tokens.as_bytes());
    out.extend_from_slice(s.tiers.as_bytes());
    out
}

/// The summary in a blob; `None` when it is not one (another configuration's
/// bytes, a torn write), checked as strictly as a rank's reply.
pub fn from_blob(b: &[u8]) -> Option<Resident> {
    if !b.len().is_multiple_of(ENTRY) {
        return None;
    }
    let n = b.len() / ENTRY;
    let text = std::str::from_utf8(b).ok()?;
    let s = Summary {
        version: VERSION,
        keys: text.get(..n * 16)?.to_owned(),
        tokens: text.get(n * 16..n * 24)?.to_owned(),
        tiers: text.get(n * 24..)?.to_owned(),
        omitted: 0,
    };
    Resident::decode(&s).ok()
}

/// A blob's content hash, never 0 (0 in the index means "no summary").
pub fn content_hash(blob: &[u8]) -> u64 {
    tether_placement::hash_parts(&[b"residency", blob]) | 1
}

impl ResidencyView {
    /// A view of no endpoints.
    pub const EMPTY: ResidencyView = ResidencyView {
        entries: Vec::new(),
    };

    /// A view of `n` endpoints that knows nothing.
    pub fn new(n: usize) -> Self {
        Self {
            entries: vec![None; n],
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Endpoint `i` said at `at_ms` that it holds `resident` (its blob hashes
    /// to `hash`). An older report than the one kept is ignored.
    pub fn record(&mut self, i: usize, hash: u64, at_ms: u64, resident: Resident) {
        if let Some(slot) = self.entries.get_mut(i)
            && slot.as_ref().is_none_or(|e| e.at_ms <= at_ms)
        {
            *slot = Some(Entry {
                hash,
                at_ms,
                resident,
            });
        }
    }

    /// Brings endpoint `i` to the index's `(hash, at_ms)`: the same content
    /// only refreshes the time; new content is read with `load` (the shared
    /// blob) and decoded here, once. Hash 0, or a blob that does not decode or
    /// hash alike, forgets the endpoint (unknown until its next good summary).
    pub fn sync(
        &mut self,
        i: usize,
        hash: u64,
        at_ms: u64,
        load: impl FnOnce() -> Option<Vec<u8>>,
    ) {
        let Some(slot) = self.entries.get_mut(i) else {
            return;
        };
        match slot {
            _ if hash == 0 => *slot = None,
            Some(e) if e.hash == hash => e.at_ms = e.at_ms.max(at_ms),
            _ => {
                *slot = load()
                    .filter(|b| content_hash(b) == hash)
                    .and_then(|b| from_blob(&b))
                    .map(|resident| Entry {
                        hash,
                        at_ms,
                        resident,
                    });
            }
        }
    }

    /// What endpoint `i` holds for `key`: [`Knows::Unknown`] without a
    /// summary or with one older than `max_age_ms`.
    pub fn knows(&self, i: usize, key: u64, now_ms: u64, max_age_ms: u64) -> Knows {
        match self.entries.get(i).and_then(Option::as_ref) {
            Some(e) if now_ms.saturating_sub(e.at_ms) <= max_age_ms => {
                e.resident.get(key).map_or(Knows::Nothing, Knows::Holds)
            }
            _ => Knows::Unknown,
        }
    }

    /// The index: per endpoint its content hash (0: none) and arrival ms, LE.
    pub fn index(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * INDEX_REC);
        for e in &self.entries {
            let (h, t) = e.as_ref().map_or((0, 0), |e| (e.hash, e.at_ms));
            out.extend_from_slice(&h.to_le_bytes());
            out.extend_from_slice(&t.to_le_bytes());
        }
        out
    }
}

/// An index of `n` endpoints: `(hash, at_ms)` each; `None` when the bytes are
/// not `n` records (another configuration wrote them: ignored).
pub fn parse_index(bytes: &[u8], n: usize) -> Option<Vec<(u64, u64)>> {
    if bytes.len() != n.checked_mul(INDEX_REC)? {
        return None;
    }
    bytes
        .chunks_exact(INDEX_REC)
        .map(|r| {
            let h = u64::from_le_bytes(r.get(..8)?.try_into().ok()?);
            let t = u64::from_le_bytes(r.get(8..)?.try_into().ok()?);
            Some((h, t))
        })
        .collect()
}

/// `index` with endpoint `i` set to `(hash, at_ms)` (a fresh index of `n`
/// endpoints when `index` is none or not `n` records).
pub fn set_index(index: Option<&[u8]>, n: usize, i: usize, hash: u64, at_ms: u64) -> Vec<u8> {
    let mut recs = index
        .and_then(|b| parse_index(b, n))
        .unwrap_or_else(|| vec![(0, 0); n]);
    if let Some(r) = recs.get_mut(i)
        && (hash == 0 || r.1 <= at_ms)
    {
        *r = (hash, at_ms);
    }
    let mut out = Vec::with_capacity(n * INDEX_REC);
    for (h, t) in recs {
        out.extend_from_slice(&h.to_le_bytes());
        out.extend_from_slice(&t.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests;
