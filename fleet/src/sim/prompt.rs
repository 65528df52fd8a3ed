//! A trace request as an engine sees it: the ids of its prompt's KV blocks.
//!
//! The trace records prefix blocks of `trace_block` tokens as nodes of a radix
//! tree ([`crate::trace::BlockStore`]); a block's place in that tree (its node
//! and offset) *is* its content and its whole prefix, so the engine block at
//! that place gets an id derived from (node, offset, sub-block) — equal ids
//! exactly where the trace says content and prefix are equal, as vLLM's
//! chained hashes would be, without hashing any tokens. Engine blocks are
//! `engine_block` tokens, a divisor of the trace's block size (default: equal).
//! Only full engine blocks inside the prompt get ids (vLLM caches full blocks);
//! blocks past the trace's ids (a request whose ids cover less than its
//! prompt) get ids of their own that nothing else shares. A tenant salts every
//! id (the gateway's `cache_salt`), so tenants never share blocks.

use crate::trace::{BlockRef, RequestId, Trace};
use tether_engine::BlockHash;

/// Turns requests into engine block ids. Reuses its buffers.
#[derive(Debug)]
pub struct PromptBlocks {
    trace_block: usize,
    engine_block: usize,
    path: Vec<BlockRef>,
    tenants: Vec<u64>,
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The engine block size can not be used with this trace.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("engine block size {engine} must be at least 1 and divide the trace's block size {trace}")]
pub struct BlockSizeError {
    /// Requested engine block size.
    pub engine: usize,
    /// The trace's.
    pub trace: usize,
}

impl PromptBlocks {
    /// For `trace` with engine blocks of `engine_block` tokens.
    pub fn new(trace: &Trace, engine_block: usize) -> Result<Self, BlockSizeError> {
        let trace_block = trace.block_size() as usize;
        if engine_block == 0 || !trace_block.is_multiple_of(engine_block) {
            return Err(BlockSizeError {
                engine: engine_block,
                trace: trace_block,
            });
        }
        let tenants = trace
            .sessions()
            .iter()
            .map(|s| {
                s.tenant.as_deref().map_or(0, |t| {
                    tether_placement::hash_parts(&[b"cache_salt", t.as_bytes()])
                })
            })
            .collect();
        Ok(Self {
            trace_block,
            engine_block,
            path: Vec::new(),
            tenants,
        })
    }

    /// Tokens per engine block.
    pub fn engine_block(&self) -> usize {
        self.engine_block
    }

    /// The ids of `id`'s full engine blocks, into `out` (cleared first).
    pub fn blocks_into(&mut self, trace: &Trace, id: RequestId, out: &mut Vec<BlockHash>) {
        out.clear();
        let r = trace.request(id);
        let salt = self.tenants[r.session.0 as usize];
        let full = r.input_tokens as usize / self.engine_block;
        let per = self.trace_block / self.engine_block;
        let store = trace.blocks();
        store.path_into(r.blocks, &mut self.path);
        let make =
            |x: u64| BlockHash(u128::from(mix(x)) | u128::from(mix(x ^ 0x5eed) ^ salt) << 64);
        'nodes: for node in &self.path {
            let len = store.segment_len(*node);
            for off in 0..len {
                for sub in 0..per {
                    if out.len() == full {
                        break 'nodes;
                    }
                    // Node < 2³¹ and (offset, sub) < 2³²: distinct places, distinct x.
                    let x = (node.node() as u64) << 32 | (off * per + sub) as u64;
                    out.push(make(x));
                }
            }
        }
        // Blocks past the trace's ids: the request's own.
        let own = 1u64 << 63 | u64::from(id.0) << 24;
        while out.len() < full {
            out.push(make(own | (out.len() as u64 & 0xff_ffff)));
        }
    }
}

#[cfg(test)]
mod tests;
