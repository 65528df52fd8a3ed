//! The words a synthesized prompt is made of: one two-character word per
//! token, derived from the block id and the offset in the block, so equal
//! block ids give equal text and different ids different text.
//!
//! Two characters from 62 give 3,844 words: a 16-token block of one id equals
//! one of another id with probability 3,844⁻¹⁶, and a prompt costs three bytes
//! per token (the gateway reads agent-sized bodies; the Completions head is
//! the first 4 KiB of the prompt, about 1,365 tokens).

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
