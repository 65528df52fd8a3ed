//! Conversations derived from prefix continuation, for traces that record no
//! session (Mooncake): which earlier request each request continues, and
//! which shared prefixes are common heads rather than conversations.
//!
//! Rules, applied to requests in arrival order over the trie of all their
//! block ids ([`BlockStore`]):
//!
//! 1. **Match.** `k` = blocks this request shares with any earlier request;
//!    `p` = the latest earlier request through that point.
//! 2. **Common head.** A node after which at least `head_fanout` distinct
//!    contents continue for a full block (the block is not the last, partial
//!    block of every request that has it) is a *common head*: a system prompt
//!    or document that unrelated conversations start with. Re-hashed partial
//!    last blocks do not count (each turn of a chat re-hashes its last block,
//!    so a conversation node can have many one-block leaves), and a conversation
//!    forks into a handful of branches at most. A request whose match ends at a
//!    common head starts a **new** conversation.
//! 3. Otherwise the request joins `p`'s conversation as
//!    - a **regeneration** when its prompt is no longer than `p`'s (in
//!      tokens) and lies within `p`'s path (`len ≤ k + 1`): a retry, or a
//!      shorter regenerated turn;
//!    - a **continuation** when it keeps all of `p`'s blocks but the last
//!      (`k ≥ len(p) − 1`: the partial last block is re-hashed next turn);
//! 4. **Head rule.** Otherwise it branches off `p`'s history. A conversation's
//!    head is its first request's blocks but the last (the partial block the
//!    next turn re-hashes): the system prompt and the first user message, as
//!    the gateway filter's head hash reads it. A request that branches off
//!    inside that head (`k` shorter than it) starts a **new** conversation
//!    (another conversation on the same document or system prompt); one that
//!    keeps the head is a **fork** of the conversation (an edited earlier
//!    message).
//!
//! Known limit: a conversation whose first prompt fits in a common head plus
//! one partial block shares nothing but the common head with its next turn,
//! which is therefore counted as a new conversation; no cache reuse is lost
//! by that, since nothing beyond the common head was shared.

use crate::trace::{BlockRef, BlockStore};
use serde::{Deserialize, Serialize};

/// Default `head_fanout`: an edit fork has two or three continuing branches;
/// four or more unrelated continuations mark a shared head.
pub const DEFAULT_HEAD_FANOUT: u32 = 4;

/// How a request was placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Link {
    /// First request of a conversation: it shares no block with any earlier one.
    NewNoSharedBlock,
    /// First request of a conversation: it shares only a common head.
    NewCommonHead,
    /// First request of a conversation: it diverges inside another conversation's head.
    NewInsideHead,
    /// Extends the request given (its partial last block re-hashed).
    Continuation(usize),
    /// A retry or shorter regenerated turn of the request given.
    Regeneration(usize),
    /// Branches off the history of the request given's conversation.
    Fork(usize),
}

impl Link {
    /// The earlier request this one joins, if any.
    pub fn parent(self) -> Option<usize> {
        match self {
            Link::Continuation(p) | Link::Regeneration(p) | Link::Fork(p) => Some(p),
            _ => None,
        }
    }
}

/// The derivation of one trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Derivation {
    /// Per request (input order): its conversation (index of its first request).
    pub conversation: Vec<usize>,
    /// Per request: how it was placed.
    pub link: Vec<Link>,
    /// What it found.
    pub report: DerivationReport,
}

/// Counts for the trace header and `tether trace stats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DerivationReport {
    /// The rule, in one line.
    pub rule: String,
    /// `head_fanout` used.
    pub head_fanout: u32,
    /// Requests.
    pub requests: usize,
    /// Conversations derived.
    pub conversations: usize,
    /// Conversations of one request.
    pub single_request: usize,
    /// Requests of the largest conversation.
    pub largest: usize,
    /// Trie nodes flagged as common heads.
    pub common_heads: usize,
    /// Deepest common head, in blocks.
    pub deepest_common_head: usize,
    /// New conversations sharing no block with earlier requests.
    pub new_no_shared_block: usize,
    /// New conversations sharing only a common head.
    pub new_common_head: usize,
    /// New conversations diverging inside another's head.
    pub new_inside_head: usize,
    /// Continuations.
    pub continuations: usize,
    /// Regenerations.
    pub regenerations: usize,
    /// Forks.
    pub forks: usize,
}

const NONE: u32 = u32::MAX;

/// Derives conversations for `requests` (block refs into `store` and prompt
/// tokens, in arrival order).
pub fn derive(store: &BlockStore, requests: &[(BlockRef, u32)], head_fanout: u32) -> Derivation {
    // Full children per node: children whose first block is not the last
    // block of every request that has it.
    let counts = store.child_counts();
    let mut full = vec![0u32; store.node_count()];
    for (parent, child) in store.edges() {
        if store.segment_len(child) >= 2 || counts[child.node()] > 0 {
            full[parent.node()] += 1;
        }
    }
    let is_head = |n: BlockRef| full[n.node()] >= head_fanout.max(1);

    let mut last = vec![NONE; store.node_count()];
    let mut conversation = Vec::with_capacity(requests.len());
    let mut link = Vec::with_capacity(requests.len());
    let mut head_len: Vec<usize> = Vec::new(); // per request; meaningful for conversation firsts
    let mut path = Vec::new();
    let mut rep = DerivationReport {
        rule: "prefix continuation with common heads (docs/trace-format.md, Mooncake)".to_owned(),
        head_fanout,
        requests: requests.len(),
        ..DerivationReport::default()
    };
    for (i, &(r, tokens)) in requests.iter().enumerate() {
        store.path_into(r, &mut path);
        let deepest = path
            .iter()
            .take_while(|n| last[n.node()] != NONE)
            .last()
            .copied();
        let len = store.len(r);
        let l = match deepest {
            None => Link::NewNoSharedBlock,
            Some(n) if is_head(n) => Link::NewCommonHead,
            Some(n) => {
                let k = store.len(n);
                let p = last[n.node()] as usize;
                let conv = conversation[p];
                let (pref, ptokens) = requests[p];
                let plen = store.len(pref);
                if tokens <= ptokens && len <= k + 1 {
                    Link::Regeneration(p)
                } else if k + 1 >= plen {
                    Link::Continuation(p)
                } else if k < head_len[conv] {
                    Link::NewInsideHead
                } else {
                    Link::Fork(p)
                }
            }
        };
        let conv = match l.parent() {
            Some(p) => conversation[p],
            None => i,
        };
        match l {
            Link::NewNoSharedBlock => rep.new_no_shared_block += 1,
            Link::NewCommonHead => rep.new_common_head += 1,
            Link::NewInsideHead => rep.new_inside_head += 1,
            Link::Continuation(_) => rep.continuations += 1,
            Link::Regeneration(_) => rep.regenerations += 1,
            Link::Fork(_) => rep.forks += 1,
        }
        head_len.push(len.saturating_sub(1).max(1));
        conversation.push(conv);
        link.push(l);
        for n in &path {
            last[n.node()] = i as u32;
        }
    }
    let mut sizes = vec![0usize; requests.len()];
    for &c in &conversation {
        sizes[c] += 1;
    }
    rep.conversations = sizes.iter().filter(|&&s| s > 0).count();
    rep.single_request = sizes.iter().filter(|&&s| s == 1).count();
    rep.largest = sizes.iter().copied().max().unwrap_or(0);
    rep.common_heads = (1..store.node_count())
        .filter(|&n| full[n] >= head_fanout.max(1))
        .count();
    rep.deepest_common_head = (1..store.node_count())
        .filter(|&n| full[n] >= head_fanout.max(1))
        .map(|n| store.depth_of_node(n))
        .max()
        .unwrap_or(0);
    Derivation {
        conversation,
        link,
        report: rep,
    }
}

impl std::fmt::Display for DerivationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "derived {} conversations from {} requests ({}; head fan-out {})",
            self.conversations, self.requests, self.rule, self.head_fanout
        )?;
        writeln!(
            f,
            "  new conversations: {} sharing no block, {} sharing only a common head, {} diverging inside another's head",
            self.new_no_shared_block, self.new_common_head, self.new_inside_head
        )?;
        writeln!(
            f,
            "  joined: {} continuations, {} regenerations, {} forks",
            self.continuations, self.regenerations, self.forks
        )?;
        write!(
            f,
            "  {} single-request conversations; largest {} requests; {} common-head nodes (deepest {} blocks)",
            self.single_request, self.largest, self.common_heads, self.deepest_common_head
        )
    }
}

#[cfg(test)]
mod tests;
