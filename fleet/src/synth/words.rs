//! The words a synthesized prompt is made of: one two-character word per
//! token, derived from the block id and the offset in the block, so equal
//! block ids give equal text and different ids different text.
//!
//! Two characters from 62 give 3,844 words: a 16-token block of one id equals
//! one of another id with probability 3,844⁻¹⁶, and a prompt costs three bytes
//! per token (the gateway reads agent-sized bodies; the Completions head is
//! the first 4 KiB of the prompt, about 1,365 tokens).

use std::collections::HashMap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const SEED: u64 = 0x5ea1_7e7e_0b10_c4ed;
/// Salt of words at positions no block id covers (unique to their request).
const UNCOVERED: u64 = 0x00c0_ffee_0000_0000;

/// The word at `offset` of the block with id `id`.
pub fn word(id: u64, offset: u64) -> [u8; 2] {
    let h = xxh3_64_with_seed(&offset.to_le_bytes(), id ^ SEED);
    [
        ALPHABET[(h % 62) as usize],
        ALPHABET[((h >> 8) % 62) as usize],
    ]
}

/// What a prompt's words are drawn from: its block ids (`block_size` tokens
/// each), a `salt` for positions past the ids (unique to the request), and a
/// `content` seed mixed into every word (0: the trace's own text; a replay's
/// `--salt` gives every word of every prompt other text, so no cache warmed
/// by another replay matches, while requests of one replay still share theirs).
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// The prompt's block ids.
    pub ids: &'a [u64],
    /// Tokens per block id.
    pub block_size: u64,
    /// Seed of the words past the ids.
    pub salt: u64,
    /// Seed mixed into every word.
    pub content: u64,
}

/// Appends the words of positions `from..to` of the prompt `src` describes to
/// `out`, each followed by a space.
pub fn push_words(out: &mut String, src: Source<'_>, from: u64, to: u64) {
    out.reserve(((to.saturating_sub(from)) * 3) as usize);
    for p in from..to {
        let w = match src.ids.get((p / src.block_size) as usize) {
            Some(&id) => word(id ^ src.content, p % src.block_size),
            None => word(UNCOVERED ^ src.salt.rotate_left(20) ^ src.content, p),
        };
        out.push(w[0] as char);
        out.push(w[1] as char);
        out.push(' ');
    }
}

/// The words of positions `from..to`, space-separated (no trailing space).
pub fn words(src: Source<'_>, from: u64, to: u64) -> String {
    let mut s = String::new();
    push_words(&mut s, src, from, to);
    s.pop();
    s
}

/// The text of whole blocks, kept per block id: a session's turns resend
/// their earlier blocks every turn (a 190 K-token prompt is ~3,000 blocks, of
/// which a turn adds a few), so each block's words are hashed once per session
/// instead of once per turn. Gives exactly [`push_words`]'s text.
#[derive(Debug, Default)]
pub struct WordCache {
    /// Block id (content seed mixed in) → its words, each followed by a space.
    blocks: HashMap<u64, Box<str>>,
    /// Words hashed so far (each block's once, and every uncovered word).
    hashed: u64,
}

impl WordCache {
    /// Appends the words of positions `from..to` of the prompt `src`
    /// describes to `out`, each followed by a space (as [`push_words`]).
    pub fn push_words(&mut self, out: &mut String, src: Source<'_>, from: u64, to: u64) {
        let bs = src.block_size.max(1);
        let covered_end = (src.ids.len() as u64).saturating_mul(bs);
        let mut p = from;
        out.reserve((to.saturating_sub(from) * 3) as usize);
        while p < to.min(covered_end) {
            let id = src.ids[(p / bs) as usize] ^ src.content;
            let hashed = &mut self.hashed;
            let text = self.blocks.entry(id).or_insert_with(|| {
                let mut t = String::with_capacity(bs as usize * 3);
                push_block(&mut t, id, bs);
                *hashed += bs;
                t.into_boxed_str()
            });
            let (lo, hi) = (p % bs, (to - (p - p % bs)).min(bs));
            // Words are ASCII, three bytes each with their space.
            out.push_str(
                text.get(lo as usize * 3..hi as usize * 3)
                    .unwrap_or_default(),
            );
            p += hi - lo;
        }
        if p < to {
            push_words(out, src, p, to);
            self.hashed += to - p;
        }
    }

    /// Words hashed so far: what synthesis cost, in words.
    pub fn hashed(&self) -> u64 {
        self.hashed
    }
}

impl WordCache {
    /// The words of positions `from..to`, space-separated (as [`words`]).
    pub fn words(&mut self, src: Source<'_>, from: u64, to: u64) -> String {
        let mut s = String::new();
        self.push_words(&mut s, src, from, to);
        s.pop();
        s
    }
}

/// The words of a whole block of id `id` (content seed mixed in).
fn push_block(out: &mut String, id: u64, block_size: u64) {
    for o in 0..block_size {
        let w = word(id, o);
        out.push(w[0] as char);
        out.push(w[1] as char);
        out.push(' ');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The cache gives exactly the uncached words, for any range: inside a
        /// block, across blocks, past the ids, and on a second use.
        #[test]
        fn the_cache_gives_the_same_words(
            ids in prop::collection::vec(0u64..6, 0..8),
            block_size in 1u64..20,
            salt in any::<u64>(),
            content in prop_oneof![Just(0u64), any::<u64>()],
            ranges in prop::collection::vec((0u64..200, 0u64..60), 1..6),
        ) {
            let src = Source { ids: &ids, block_size, salt, content };
            let mut cache = WordCache::default();
            for (from, len) in ranges {
                prop_assert_eq!(cache.words(src, from, from + len), words(src, from, from + len));
            }
        }
    }
}
