//! Prefix-block ids of every request, stored once: a radix tree of runs of consecutive ids.
//!
//! Consecutive turns of an agent resend the same prefix, and trace formats
//! number new blocks consecutively (Mooncake, Bailian and AgentX all remap
//! hashes to sequential integers), so a request's id list is a few runs that
//! mostly already exist in the tree. A request is stored as the node where its
//! path ends; a 43-turn session costs a few nodes per turn instead of its
//! whole context per turn, which is what lets a million-request trace sit in
//! memory.

use std::collections::HashMap;

/// Where a request's block sequence ends in a [`BlockStore`]; its depth is the
/// number of blocks. `BlockRef::EMPTY` is the empty sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockRef(u32);

impl BlockRef {
    /// No blocks.
    pub const EMPTY: BlockRef = BlockRef(ROOT);

    /// The node index (for per-node tables kept by analyses).
    pub fn node(self) -> usize {
        self.0 as usize
    }
}

const ROOT: u32 = 0;

/// One run of consecutive ids `first, first + 1, …` below `parent`.
#[derive(Clone, Copy, Debug)]
struct Node {
    parent: u32,
    first: u64,
    len: u32,
    /// Blocks from the root through the end of this node.
    depth: u32,
}

/// The radix tree. Nodes are split where requests diverge or end, so every
/// request ends exactly at a node boundary and a split never invalidates a
/// [`BlockRef`] (the lower half keeps the node's index).
#[derive(Clone, Debug)]
pub struct BlockStore {
    nodes: Vec<Node>,
    children: HashMap<(u32, u64), u32>,
}

impl Default for BlockStore {
    fn default() -> Self {
        Self::new()
    }
}

/// Length of the run of consecutive ids at the start of `ids`.
fn run_len(ids: &[u64]) -> usize {
    let mut n = 1;
    while n < ids.len() && ids[n - 1].checked_add(1) == Some(ids[n]) {
        n += 1;
    }
    n.min(ids.len())
}

impl BlockStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            nodes: vec![Node {
                parent: ROOT,
                first: 0,
                len: 0,
                depth: 0,
            }],
            children: HashMap::new(),
        }
    }

    /// Nodes in the tree (the root included): its memory is proportional to this.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Splits `x` after its first `j` ids; returns the new upper node. `x`
    /// keeps its index, its end and its children.
    fn split(&mut self, x: u32, j: u32) -> u32 {
        let n = self.nodes[x as usize];
        debug_assert!(j > 0 && j < n.len);
        let mid = self.nodes.len() as u32;
        self.nodes.push(Node {
            parent: n.parent,
            first: n.first,
            len: j,
            depth: n.depth - (n.len - j),
        });
        self.children.insert((n.parent, n.first), mid);
        self.children.insert((mid, n.first + u64::from(j)), x);
        let lower = &mut self.nodes[x as usize];
        lower.parent = mid;
        lower.first = n.first + u64::from(j);
        lower.len = n.len - j;
        mid
    }

    /// Stores `ids` and returns where the sequence ends.
    ///
    /// # Panics
    /// Never on input: a sequence longer than `u32::MAX` blocks is cut there.
    pub fn insert(&mut self, ids: &[u64]) -> BlockRef {
        let ids = &ids[..ids.len().min(u32::MAX as usize)];
        let mut cur = ROOT;
        let mut i = 0;
        while i < ids.len() {
            match self.children.get(&(cur, ids[i])).copied() {
                Some(child) => {
                    let n = self.nodes[child as usize];
                    let mut t = 1u32;
                    while t < n.len
                        && (i + t as usize) < ids.len()
                        && ids[i + t as usize] == n.first + u64::from(t)
                    {
                        t += 1;
                    }
                    if t == n.len {
                        cur = child;
                    } else {
                        cur = self.split(child, t);
                    }
                    i += t as usize;
                }
                None => {
                    let len = run_len(&ids[i..]) as u32;
                    let depth = self.nodes[cur as usize].depth + len;
                    let node = self.nodes.len() as u32;
                    self.nodes.push(Node {
                        parent: cur,
                        first: ids[i],
                        len,
                        depth,
                    });
                    self.children.insert((cur, ids[i]), node);
                    cur = node;
                    i += len as usize;
                }
            }
        }
        BlockRef(cur)
    }

    /// Number of blocks of `r`.
    pub fn len(&self, r: BlockRef) -> usize {
        self.nodes[r.0 as usize].depth as usize
    }

    /// Whether `r` has no blocks.
    pub fn is_empty(&self, r: BlockRef) -> bool {
        r.0 == ROOT
    }

    /// Writes the ids of `r` into `out` (cleared first).
    pub fn ids_into(&self, r: BlockRef, out: &mut Vec<u64>) {
        out.clear();
        let mut cur = r.0;
        while cur != ROOT {
            let n = self.nodes[cur as usize];
            out.extend((0..u64::from(n.len)).rev().map(|t| n.first + t));
            cur = n.parent;
        }
        out.reverse();
    }

    /// The ids of `r`.
    pub fn ids(&self, r: BlockRef) -> Vec<u64> {
        let mut v = Vec::with_capacity(self.len(r));
        self.ids_into(r, &mut v);
        v
    }

    /// The runs of `r` as `(first id, count)`, root first (the compact form
    /// the trace file writes). Adjacent nodes that continue one run are merged.
    pub fn runs(&self, r: BlockRef) -> Vec<(u64, u32)> {
        let mut rev: Vec<(u64, u32)> = Vec::new();
        let mut cur = r.0;
        while cur != ROOT {
            let n = self.nodes[cur as usize];
            match rev.last_mut() {
                Some((first, len)) if n.first.checked_add(u64::from(n.len)) == Some(*first) => {
                    *first = n.first;
                    *len += n.len;
                }
                _ => rev.push((n.first, n.len)),
            }
            cur = n.parent;
        }
        rev.reverse();
        rev
    }

    /// The nodes on the path of `r`, root excluded, root side first.
    pub fn path_into(&self, r: BlockRef, out: &mut Vec<BlockRef>) {
        out.clear();
        let mut cur = r.0;
        while cur != ROOT {
            out.push(BlockRef(cur));
            cur = self.nodes[cur as usize].parent;
        }
        out.reverse();
    }

    /// Blocks in the node that `r` ends at (the last segment of its path).
    pub fn segment_len(&self, r: BlockRef) -> usize {
        self.nodes[r.0 as usize].len as usize
    }

    /// The node above `r`'s last segment (`EMPTY` at the top).
    pub fn parent(&self, r: BlockRef) -> BlockRef {
        BlockRef(self.nodes[r.0 as usize].parent)
    }

    /// Distinct blocks stored (every node is on some request's path).
    pub fn distinct_blocks(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.len)).sum()
    }

    /// Number of child nodes of each node, indexed by [`BlockRef::node`].
    pub fn child_counts(&self) -> Vec<u32> {
        let mut c = vec![0u32; self.nodes.len()];
        for &(parent, _) in self.children.keys() {
            c[parent as usize] += 1;
        }
        c
    }

    /// Every (parent, child) edge of the tree, in no particular order.
    pub fn edges(&self) -> impl Iterator<Item = (BlockRef, BlockRef)> + '_ {
        self.children
            .iter()
            .map(|(&(parent, _), &child)| (BlockRef(parent), BlockRef(child)))
    }

    /// Blocks from the root through the end of node `n` (a [`BlockRef::node`] index).
    pub fn depth_of_node(&self, n: usize) -> usize {
        self.nodes.get(n).map_or(0, |x| x.depth as usize)
    }

    /// Blocks `a` and `b` share from the start.
    pub fn common_prefix(&self, a: BlockRef, b: BlockRef) -> usize {
        let (mut a, mut b) = (a.0, b.0);
        // Walk the deeper one up until both paths meet at a node.
        while a != b {
            let (na, nb) = (self.nodes[a as usize], self.nodes[b as usize]);
            if na.depth >= nb.depth {
                a = na.parent;
            } else {
                b = nb.parent;
            }
        }
        self.nodes[a as usize].depth as usize
    }
}

#[cfg(test)]
mod tests;
