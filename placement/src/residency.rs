//! What a rank says it holds: the residency summary of its `/load` reply
//! (`docs/rank.md` "Residency summary"), written by the rank (and by vLLM's
//! `TetherConnector`) and read by every router that places by residency.
//!
//! One entry per retained turn state: the 64-bit [`resident_key`] of its
//! retention key (tenant, session, subagent hashes — the marker headers the
//! gateway sends, so the rank can compute it without the raw ids), the prompt
//! tokens it holds, and its tier. The wire form is three hex strings with a
//! fixed width per entry, keys sorted ascending, so a reader binary-searches
//! the decoded keys and the size is exact: 16 + 8 + 1 = 25 bytes per entry
//! (250 KB at 10,000 retained sessions; a rank lists at most
//! [`MAX_ENTRIES`] and says how many it left out).

use crate::keys::hash_parts;
use serde::{Deserialize, Serialize};

/// The wire version this code writes and reads.
pub const VERSION: u32 = 1;
/// Most entries a summary may list; a longer one is refused as malformed.
pub const MAX_ENTRIES: usize = 16_384;

/// The 64-bit key a residency summary lists for a retention key: the
/// tenant, session and subagent hashes (`x-tether-tenant`, `-session`,
/// `-subagent`; 0 for the main agent) as 16-byte little-endian words,
/// hashed with [`hash_parts`].
pub fn resident_key(tenant: u128, session: u128, subagent: u128) -> u64 {
    hash_parts(&[
        b"resident",
        &tenant.to_le_bytes(),
        &session.to_le_bytes(),
        &subagent.to_le_bytes(),
    ])
}

/// Where a retained state sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Prompt tokens of the retained prompt end.
    pub tokens: u32,
    /// Some of it is on the device (else host tier only).
    pub device: bool,
}

/// The summary as it travels inside the `/load` reply.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Summary {
    /// [`VERSION`].
    pub version: u32,
    /// 16 lower-case hex digits per entry, ascending.
    pub keys: String,
    /// 8 hex digits per entry: tokens held.
    pub tokens: String,
    /// 1 hex digit per entry: bit 0 device tier, bit 1 host tier.
    pub tiers: String,
    /// Entries left out (the rank lists the largest states first).
    #[serde(default)]
    pub omitted: u64,
}

/// Why a summary was refused (the reader counts and logs it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BadSummary {
    /// A version this reader does not know.
    Version(u32),
    /// More than [`MAX_ENTRIES`] entries.
    TooMany(usize),
    /// The three strings disagree on the entry count, or hold a non-hex digit.
    Shape,
    /// Keys not strictly ascending.
    Unsorted,
}

impl std::fmt::Display for BadSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadSummary::Version(v) => write!(f, "residency version {v} (want {VERSION})"),
            BadSummary::TooMany(n) => {
                write!(f, "residency lists {n} entries (limit {MAX_ENTRIES})")
            }
            BadSummary::Shape => write!(f, "residency strings are not 16/8/1 hex digits per entry"),
            BadSummary::Unsorted => write!(f, "residency keys are not strictly ascending"),
        }
    }
}

impl std::error::Error for BadSummary {}

/// A decoded summary: sorted keys and what each holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resident {
    keys: Vec<u64>,
    held: Vec<Held>,
}

fn hex_word(s: &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for &c in s {
        let d = (c as char).to_digit(16)?;
        v = v << 4 | u64::from(d);
    }
    Some(v)
}

impl Resident {
    /// Holds nothing (a rank that restarted, or that publishes nothing yet).
    pub const EMPTY: Resident = Resident {
        keys: Vec::new(),
        held: Vec::new(),
    };

    /// From `(key, held)` entries in any order; duplicate keys keep the
    /// largest state. The entries beyond `max` (smallest states first) are left out.
    pub fn from_entries(entries: impl IntoIterator<Item = (u64, Held)>, max: usize) -> (Self, u64) {
        let mut v: Vec<(u64, Held)> = entries.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.tokens.cmp(&a.1.tokens)));
        v.dedup_by_key(|e| e.0);
        let mut omitted = 0u64;
        if v.len() > max {
            omitted = (v.len() - max) as u64;
            v.sort_by(|a, b| b.1.tokens.cmp(&a.1.tokens).then(a.0.cmp(&b.0)));
            v.truncate(max);
            v.sort_by_key(|e| e.0);
        }
        let (keys, held) = v.into_iter().unzip();
        (Self { keys, held }, omitted)
    }

    /// The wire form.
    pub fn encode(&self, omitted: u64) -> Summary {
        use std::fmt::Write;
        let n = self.keys.len();
        let mut s = Summary {
            version: VERSION,
            keys: String::with_capacity(n * 16),
            tokens: String::with_capacity(n * 8),
            tiers: String::with_capacity(n),
            omitted,
        };
        for (k, h) in self.keys.iter().zip(&self.held) {
            let _ = write!(s.keys, "{k:016x}");
            let _ = write!(s.tokens, "{:08x}", h.tokens);
            let tier = if h.device { 1 } else { 2 };
            let _ = write!(s.tiers, "{tier:x}");
        }
        s
    }

    /// Reads the wire form; never panics on any input.
    pub fn decode(s: &Summary) -> Result<Self, BadSummary> {
        if s.version != VERSION {
            return Err(BadSummary::Version(s.version));
        }
        let n = s.tiers.len();
        if n > MAX_ENTRIES {
            return Err(BadSummary::TooMany(n));
        }
        if s.keys.len() != n * 16 || s.tokens.len() != n * 8 {
            return Err(BadSummary::Shape);
        }
        let mut keys = Vec::with_capacity(n);
        let mut held = Vec::with_capacity(n);
        let (kb, tb, rb) = (s.keys.as_bytes(), s.tokens.as_bytes(), s.tiers.as_bytes());
        for i in 0..n {
            let k = kb.get(i * 16..i * 16 + 16).and_then(hex_word);
            let t = tb.get(i * 8..i * 8 + 8).and_then(hex_word);
            let r = rb.get(i..i + 1).and_then(hex_word);
            let (Some(k), Some(t), Some(r)) = (k, t, r) else {
                return Err(BadSummary::Shape);
            };
            if keys.last().is_some_and(|&last| last >= k) {
                return Err(BadSummary::Unsorted);
            }
            keys.push(k);
            held.push(Held {
                tokens: u32::try_from(t).unwrap_or(u32::MAX),
                device: r & 1 == 1,
            });
        }
        Ok(Self { keys, held })
    }

    /// What this rank holds for `key`.
    pub fn get(&self, key: u64) -> Option<Held> {
        let i = self.keys.binary_search(&key).ok()?;
        self.held.get(i).copied()
    }

    /// Entries listed.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Lists nothing.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Tokens over all entries.
    pub fn tokens(&self) -> u64 {
        self.held.iter().map(|h| u64::from(h.tokens)).sum()
    }

    /// The entries, ascending by key.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Held)> + '_ {
        self.keys.iter().copied().zip(self.held.iter().copied())
    }
}

#[cfg(test)]
mod tests;
