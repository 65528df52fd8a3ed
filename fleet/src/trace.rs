//! Mooncake-format traces and the session rule that turns them into multi-turn agent sessions.
//!
//! A Mooncake record carries `timestamp` (ms), `input_length`, `output_length` and
//! `hash_ids` (ids of 512-token prefix blocks; equal ids mean equal content and equal
//! prefix). The trace has no session ids, so sessions are derived from prefix
//! continuation:
//!
//! * find the earlier request sharing the longest hash-id prefix with this one (the
//!   latest such request on ties);
//! * none → a new session (turn kind `first`);
//! * it shares all of that request's ids except at most its last (the last 512-token
//!   block is usually partial, so the next turn re-hashes it) → the same session and
//!   subagent: a `tool` turn if it arrives within `tool_gap_ms` of that request, else
//!   a `user` turn;
//! * it shares less (a fork from the middle of a context) → the same session, a new
//!   subagent (turn kind `handoff`).

use serde::Deserialize;
use std::collections::HashMap;
use tether_engine::marker::TurnKind;
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Tokens per Mooncake hash id.
pub const MOONCAKE_BLOCK_TOKENS: usize = 512;

/// One line of a Mooncake trace.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct MooncakeRecord {
    /// Arrival time in ms from the trace start.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// Prefix-block ids, 512 tokens each.
    pub hash_ids: Vec<u64>,
}

/// A trace line that could not be read.
#[derive(Debug, Error)]
#[error("trace line {line}: {source}")]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// The JSON error.
    #[source]
    pub source: serde_json::Error,
}

/// Parses JSONL text (blank lines ignored).
pub fn parse_jsonl(text: &str) -> Result<Vec<MooncakeRecord>, TraceError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| TraceError {
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// A trace request with its derived session, subagent and turn kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// Index in the trace.
    pub index: usize,
    /// The record.
    pub record: MooncakeRecord,
    /// Session id (index of the session's first request).
    pub session: u64,
    /// Subagent id within the session (0 = main; else index of the fork request).
    pub subagent: u64,
    /// Derived turn kind.
    pub kind: TurnKind,
}

/// Applies the session rule of the module docs to records sorted by time.
pub fn derive_sessions(records: &[MooncakeRecord], tool_gap_ms: u64) -> Vec<Turn> {
    // Rolling hash of each hash-id prefix → latest request having it.
    let mut latest: HashMap<u64, usize> = HashMap::new();
    let mut out: Vec<Turn> = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        let mut h = 0u64;
        let mut best: Option<(usize, usize)> = None;
        let mut keys = Vec::with_capacity(r.hash_ids.len());
        for (k, id) in r.hash_ids.iter().enumerate() {
            h = xxh3_64_with_seed(&id.to_le_bytes(), h);
            keys.push(h);
            if best.is_none_or(|(bk, _)| bk == k)
                && let Some(&j) = latest.get(&h)
            {
                best = Some((k + 1, j));
            }
        }
        let (session, subagent, kind) = match best {
            None => (i as u64, 0, TurnKind::First),
            Some((k, j)) => {
                let prev = &out[j];
                if k + 1 >= records[j].hash_ids.len() {
                    let gap = r.timestamp.saturating_sub(records[j].timestamp);
                    let kind = if gap <= tool_gap_ms {
                        TurnKind::Tool
                    } else {
                        TurnKind::User
                    };
                    (prev.session, prev.subagent, kind)
                } else {
                    (prev.session, i as u64, TurnKind::Handoff)
                }
            }
        };
        for key in keys {
            latest.insert(key, i);
        }
        out.push(Turn {
            index: i,
            record: r.clone(),
            session,
            subagent,
            kind,
        });
    }
    out
}

/// Token ids standing in for a request's prompt: position `p` of hash id `id` gets a
/// token derived from `(id, p mod 512)`, so equal hash-id prefixes give equal tokens.
pub fn synth_tokens(r: &MooncakeRecord, out: &mut Vec<u32>) {
    out.clear();
    let n = r.input_length as usize;
    for (b, id) in r.hash_ids.iter().enumerate() {
        let start = b * MOONCAKE_BLOCK_TOKENS;
        if start >= n {
            break;
        }
        let end = (start + MOONCAKE_BLOCK_TOKENS).min(n);
        let base = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for p in 0..(end - start) as u64 {
            // A cheap mix of (id, position); only equality of whole blocks matters downstream.
            let mut z = base ^ p.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z ^= z >> 31;
            out.push(z as u32 ^ (z >> 32) as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: u64, ids: &[u64]) -> MooncakeRecord {
        MooncakeRecord {
            timestamp: t,
            input_length: ids.len() as u64 * 512 - 100,
            output_length: 1,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn sessions_follow_prefix_continuation() {
        let rs = [
            rec(0, &[1, 2, 3]),
            rec(10, &[1, 2, 4, 5]), // shares all but the last of #0, 10 ms later → tool
            rec(100_000, &[1, 2, 4, 5, 6, 7]), // continues #1 after 100 s → user
            rec(100_001, &[9]),     // unrelated → first
            rec(100_002, &[1, 2, 4, 8, 9, 10, 11]), // forks from the middle of #2 → handoff
        ];
        let t = derive_sessions(&rs, 30_000);
        let kinds: Vec<_> = t.iter().map(|t| t.kind).collect();
        assert_eq!(
            kinds,
            [
                TurnKind::First,
                TurnKind::Tool,
                TurnKind::User,
                TurnKind::First,
                TurnKind::Handoff
            ]
        );
        assert_eq!(t[1].session, 0);
        assert_eq!(t[2].session, 0);
        assert_eq!(t[3].session, 3);
        assert_eq!((t[4].session, t[4].subagent), (0, 4));
    }

    #[test]
    fn synthetic_tokens_share_exactly_the_shared_prefix() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        synth_tokens(&rec(0, &[1, 2, 3]), &mut a);
        synth_tokens(&rec(0, &[1, 2, 4]), &mut b);
        assert_eq!(a.len(), 3 * 512 - 100);
        assert_eq!(a[..1024], b[..1024]);
        assert_ne!(a[1024..], b[1024..]);
    }

    #[test]
    fn bad_lines_name_their_line() {
        let e = parse_jsonl(
            "{\"timestamp\":0,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n\n{oops}",
        )
        .expect_err("bad json");
        assert_eq!(e.line, 3);
    }
}
