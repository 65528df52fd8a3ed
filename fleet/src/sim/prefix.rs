//! An approximate prefix tree of what the router sent where, in the style of
//! SGLang's cache-aware router: the router never asks the ranks what they hold;
//! it remembers which rank it sent each prefix to and assumes it is still
//! there.
//!
//! The tree is the trace's own block tree ([`crate::trace::BlockStore`]): each
//! node keeps the ranks a request through it was routed to. A request's match
//! on a rank is the blocks of its path that rank holds contiguously from the
//! root (SGLang matches characters; the trace resolves blocks). Nothing is
//! evicted: SGLang evicts least-recently-used leaves beyond `max_tree_size`
//! per worker, a bound larger than any device's KV here, so within a run the
//! tree keeps believing in prefixes the rank's cache has long evicted — which
//! is how the approximation errs.

use crate::trace::{BlockRef, BlockStore};

/// The tree: per trace node, the ranks believed to hold it.
#[derive(Debug)]
pub struct ApproxTree {
    holders: Vec<Vec<u32>>,
    /// Tokens inserted per rank (SGLang's tree size, its tie-breaker for "most room").
    size: Vec<u64>,
    block: u64,
    /// Scratch: per rank, (path position + 1) up to which it matched contiguously.
    reach: Vec<u32>,
    touched: Vec<u32>,
}

/// The best match of a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Match {
    /// Rank with the longest contiguous match (lowest index on ties).
    pub rank: Option<usize>,
    /// Matched tokens on it.
    pub tokens: u64,
}

impl ApproxTree {
    /// An empty tree for `ranks` ranks over `store`, blocks of `block` tokens.
    pub fn new(store: &BlockStore, ranks: usize, block: u32) -> Self {
        Self {
            holders: vec![Vec::new(); store.node_count()],
            size: vec![0; ranks],
            block: u64::from(block),
            reach: vec![0; ranks],
            touched: Vec::new(),
        }
    }

    /// Tokens inserted for `rank`.
    pub fn size(&self, rank: usize) -> u64 {
        self.size[rank]
    }

    /// The rank holding the longest prefix of `path` (nodes root first), among
    /// the ranks `active` marks.
    pub fn best(&mut self, store: &BlockStore, path: &[BlockRef], active: &[bool]) -> Match {
        let mut best = Match {
            rank: None,
            tokens: 0,
        };
        for (pos, node) in path.iter().enumerate() {
            let mut any = false;
            for &r in &self.holders[node.node()] {
                if !active.get(r as usize).copied().unwrap_or(false) {
                    continue;
                }
                let reach = &mut self.reach[r as usize];
                if *reach == pos as u32 {
                    if pos == 0 {
                        self.touched.push(r);
                    }
                    *reach = pos as u32 + 1;
                    any = true;
                    let tokens = store.depth_of_node(node.node()) as u64 * self.block;
                    if tokens > best.tokens
                        || (tokens == best.tokens && best.rank.is_some_and(|b| (r as usize) < b))
                    {
                        best = Match {
                            rank: Some(r as usize),
                            tokens,
                        };
                    }
                }
            }
            if !any {
                break;
            }
        }
        for r in self.touched.drain(..) {
            self.reach[r as usize] = 0;
        }
        best
    }

    /// Records that `path` was routed to `rank`.
    pub fn insert(&mut self, store: &BlockStore, path: &[BlockRef], rank: usize) {
        for node in path {
            let h = &mut self.holders[node.node()];
            if !h.contains(&(rank as u32)) {
                h.push(rank as u32);
                self.size[rank] += store.segment_len(*node) as u64 * self.block;
            }
        }
    }
}

#[cfg(test)]
mod tests;
