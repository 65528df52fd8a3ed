//! Chained block hashes compatible with vLLM prefix caching.
//!
//! A block's identity is `hash(parent_hash, block_tokens, extra_keys)`, exactly the
//! shape vLLM uses (`hash_block_tokens`): two prompts share a cached block only when
//! they share every token *and* every extra key up to and including it. The first
//! block's parent is a fixed root ([`ROOT_HASH`], vLLM's `NONE_HASH`), and the tenant's
//! `cache_salt` enters the first block's extra keys only, so it changes the first hash
//! and, through the chain, every hash downstream. A LoRA adapter name enters every
//! block, as in vLLM. Only full blocks are hashed (a partial tail is never cached).
//!
//! The digest is xxh3-128 over a length-prefixed little-endian encoding, so the hash is
//! stable across runs and machines (unlike Python's `hash`), which the simulator and a
//! multi-process engine need.

use xxhash_rust::xxh3::xxh3_128;

/// Identity of one full KV block: the chained hash of its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

/// Parent hash of the first block of every prompt (vLLM's `NONE_HASH`).
pub const ROOT_HASH: BlockHash = BlockHash(0x7465_7468_6572_2e72_6f6f_742e_7631_0000);

/// One extra key mixed into a block hash besides its tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey {
    /// The tenant's cache salt (first block only).
    CacheSalt(Vec<u8>),
    /// A LoRA adapter name (every block).
    Lora(Vec<u8>),
    /// A multimodal input's content hash overlapping the block, with its start offset in the block.
    MultiModal { hash: u128, offset: u32 },
}

impl ExtraKey {
    fn tag(&self) -> u8 {
        match self {
            ExtraKey::CacheSalt(_) => 1,
            ExtraKey::Lora(_) => 2,
            ExtraKey::MultiModal { .. } => 3,
        }
    }
}

/// Hashes one block: `xxh3_128(parent ‖ n_tokens ‖ tokens ‖ n_extra ‖ (tag ‖ len ‖ bytes)*)`.
pub fn block_hash(parent: BlockHash, tokens: &[u32], extra: &[ExtraKey]) -> BlockHash {
    let mut buf = Vec::with_capacity(16 + 8 + tokens.len() * 4 + extra.len() * 24);
    encode_block(&mut buf, parent, tokens, extra);
    BlockHash(xxh3_128(&buf))
}

fn encode_block(buf: &mut Vec<u8>, parent: BlockHash, tokens: &[u32], extra: &[ExtraKey]) {
    buf.extend_from_slice(&parent.0.to_le_bytes());
    buf.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    buf.extend_from_slice(&(extra.len() as u32).to_le_bytes());
    for key in extra {
        buf.push(key.tag());
        match key {
            ExtraKey::CacheSalt(b) | ExtraKey::Lora(b) => {
                buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
                buf.extend_from_slice(b);
            }
            ExtraKey::MultiModal { hash, offset } => {
                buf.extend_from_slice(&20u32.to_le_bytes());
                buf.extend_from_slice(&hash.to_le_bytes());
                buf.extend_from_slice(&offset.to_le_bytes());
            }
        }
    }
}

/// Per-request inputs to block hashing besides the tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestKeys {
    /// `cache_salt` (vLLM/SGLang request field), derived by the gateway from the tenant.
    pub cache_salt: Option<Vec<u8>>,
    /// LoRA adapter name, when the request uses one.
    pub lora: Option<Vec<u8>>,
}

/// The hash of the `n`-th dead block (a request's partial or output block kept in the
/// free queue after it ended, `PolicyConfig::hold_tail_blocks`) under `parent`: in a
/// domain of its own, so no prompt's block ever matches it.
pub(crate) fn dead_block_hash(parent: Option<BlockHash>, n: u64) -> BlockHash {
    let mut buf = Vec::with_capacity(48);
    buf.extend_from_slice(b"tether.dead-block");
    buf.extend_from_slice(&parent.unwrap_or(ROOT_HASH).0.to_le_bytes());
    buf.extend_from_slice(&n.to_le_bytes());
    BlockHash(xxh3_128(&buf))
}

/// Computes the chained hashes of a prompt's full blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHasher {
    block_size: usize,
}

impl BlockHasher {
    /// A hasher for blocks of `block_size` tokens (vLLM's default is 16); `None` for 0.
    pub fn try_new(block_size: usize) -> Option<Self> {
        (block_size > 0).then_some(Self { block_size })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Hashes of every full block of `tokens`, in order; a partial tail is not hashed.
    pub fn hash_prompt(&self, tokens: &[u32], keys: &RequestKeys) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(tokens.len() / self.block_size);
        self.extend_hashes(&mut out, tokens, keys);
        out
    }

    /// Continues a chain: hashes the full blocks of `tokens` that follow `out` (whose
    /// entries must be the hashes of the first `out.len()` blocks of the same prompt).
    pub fn extend_hashes(&self, out: &mut Vec<BlockHash>, tokens: &[u32], keys: &RequestKeys) {
        let mut buf = Vec::with_capacity(64 + self.block_size * 4);
        let mut extra = Vec::with_capacity(2);
        let mut parent = out.last().copied().unwrap_or(ROOT_HASH);
        for (i, chunk) in tokens
            .chunks_exact(self.block_size)
            .enumerate()
            .skip(out.len())
        {
            extra.clear();
            if i == 0
                && let Some(salt) = &keys.cache_salt
            {
                extra.push(ExtraKey::CacheSalt(salt.clone()));
            }
            if let Some(lora) = &keys.lora {
                extra.push(ExtraKey::Lora(lora.clone()));
            }
            buf.clear();
            encode_block(&mut buf, parent, chunk, &extra);
            parent = BlockHash(xxh3_128(&buf));
            out.push(parent);
        }
    }
}

impl Default for BlockHasher {
    fn default() -> Self {
        Self { block_size: 16 }
    }
}

#[cfg(test)]
mod tests;
