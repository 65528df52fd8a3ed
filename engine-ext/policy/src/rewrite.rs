//! Tail rewrites: how much of the prompt it resends a session's next turn changes at
//! the end, learned per rank, and the snapshot boundary that serves that next turn best.
//!
//! A hybrid model resumes only at a boundary with a state snapshot, so a retention is
//! worth what its snapshot's boundary is worth to the key's next request. The prompt end
//! is the obvious place, and it is the right one when the next turn resends the prompt
//! unchanged. Often it does not: a chat template that strips the previous turn's
//! reasoning, a generation prompt the answer replaces, a re-tokenised or re-hashed
//! partial last block (a trace's block ids are per whole block, so a turn that extends
//! the previous prompt's partial block re-hashes it) — the next turn diverges a few
//! blocks *before* the prompt end, the prompt-end snapshot is off its chain, and
//! prefill starts over from whatever older snapshot survives.
//!
//! Every returning request tells how far back it diverged: `r` = the previous prompt's
//! full blocks − the blocks the two chains share (0 when the new chain contains the
//! whole previous prompt). [`TailRewrites`] keeps the last [`WINDOW`] of these per rank
//! and puts a retention's snapshot at the aligned boundary `b ≤ n` (`n` the prompt's
//! full blocks) that maximises the blocks the next turn can expect to resume,
//! `b × P(r ≤ n − b)`: the prompt end when returns keep it, a boundary just below the
//! usual rewrite when they do not, and — since an occasional rewrite of everything (a
//! compaction, a new system prompt) only scales every candidate alike — never pulled
//! to the head by rare outliers. Until [`MIN_SAMPLES`] returns are seen it is the
//! prompt end, as before.

use std::collections::VecDeque;

/// Returns remembered per rank: enough to see a mix of behaviours, few enough to follow
/// a change of workload within minutes.
pub const WINDOW: usize = 128;

/// Returns needed before the boundary moves from the prompt end.
pub const MIN_SAMPLES: usize = 8;

/// The last [`WINDOW`] tail rewrites seen on one rank, in blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TailRewrites {
    seen: VecDeque<u32>,
}

impl TailRewrites {
    /// Records that a returning request kept all but the last `blocks` full blocks of its
    /// key's previous prompt.
    pub fn observe(&mut self, blocks: usize) {
        if self.seen.len() == WINDOW {
            self.seen.pop_front();
        }
        self.seen
            .push_back(u32::try_from(blocks).unwrap_or(u32::MAX));
    }

    /// Returns observed (at most [`WINDOW`]).
    pub fn samples(&self) -> usize {
        self.seen.len()
    }

    /// The snapshot boundary, in blocks, for a prompt of `full` full blocks whose
    /// snapshots fall on multiples of `align` blocks: the aligned `b ≤ full` maximising
    /// `b × P(r ≤ full − b)` over the observed rewrites (ties to the deeper boundary);
    /// the aligned prompt end before [`MIN_SAMPLES`] observations. 0 when no aligned
    /// boundary fits.
    pub fn boundary(&self, full: usize, align: usize) -> usize {
        let align = align.max(1);
        let end = full / align * align;
        if self.seen.len() < MIN_SAMPLES || end == 0 {
            return end;
        }
        let mut sorted: Vec<u32> = self.seen.iter().copied().collect();
        sorted.sort_unstable();
        let total = sorted.len() as f64;
        // P(r ≤ x) steps up only at observed values, and b × P(r ≤ full − b) grows with b
        // where P is flat: the best b is the deepest aligned boundary at or below
        // full − r for one of the observed r (or the aligned prompt end itself).
        let candidate = |r: u32| {
            let b = full.saturating_sub(r as usize) / align * align;
            let keep = (full - b) as u64;
            let covered = sorted.partition_point(|&x| u64::from(x) <= keep);
            (b, b as f64 * covered as f64 / total)
        };
        let mut best = candidate(0);
        for &r in &sorted {
            let c = candidate(r);
            if c.1 > best.1 || (c.1 == best.1 && c.0 > best.0) {
                best = c;
            }
        }
        best.0
    }
}

/// How many trailing full blocks of `previous` a request with chain `next` rewrote:
/// `previous.len()` − their common prefix.
pub fn rewritten(previous: &[crate::hash::BlockHash], next: &[crate::hash::BlockHash]) -> usize {
    let shared = previous
        .iter()
        .zip(next)
        .take_while(|(a, b)| a == b)
        .count();
    previous.len() - shared
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(rs: &[usize]) -> TailRewrites {
        let mut t = TailRewrites::default();
        for &r in rs {
            t.observe(r);
        }
        t
    }

    #[test]
    fn the_prompt_end_until_enough_returns_are_seen() {
        let t = with(&[3; MIN_SAMPLES - 1]);
        assert_eq!(t.boundary(103, 1), 103);
        assert_eq!(t.boundary(103, 34), 102);
        assert_eq!(t.boundary(20, 34), 0);
    }

    #[test]
    fn returns_that_keep_the_prompt_end_keep_it() {
        let t = with(&[0; 20]);
        assert_eq!(t.boundary(103, 1), 103);
    }

    #[test]
    fn a_usual_rewrite_moves_the_boundary_just_below_it() {
        // Returns rewrite 0..=3 trailing blocks (a 4-block partial unit re-hashed):
        // only n − 3 is on every next chain.
        let t = with(&[0, 1, 2, 3, 0, 1, 2, 3, 1, 2, 3, 3]);
        assert_eq!(t.boundary(100, 1), 97);
        // Aligned to 4: the deepest multiple of 4 at or below 97.
        assert_eq!(t.boundary(100, 4), 96);
    }

    #[test]
    fn rare_rewrites_of_everything_do_not_pull_it_to_the_head() {
        let mut rs = vec![2; 30];
        rs.extend([100, 100]);
        let t = with(&rs);
        assert_eq!(t.boundary(100, 1), 98);
    }

    #[test]
    fn the_window_forgets_old_behaviour() {
        let mut t = with(&[10; WINDOW]);
        assert_eq!(t.boundary(200, 1), 190);
        for _ in 0..WINDOW {
            t.observe(0);
        }
        assert_eq!(t.samples(), WINDOW);
        assert_eq!(t.boundary(200, 1), 200);
    }

    #[test]
    fn rewritten_counts_the_previous_prompts_lost_tail() {
        use crate::hash::BlockHash;
        let h = |x: u128| BlockHash(x);
        let prev = [h(1), h(2), h(3), h(4)];
        assert_eq!(rewritten(&prev, &[h(1), h(2), h(3), h(4), h(5)]), 0);
        assert_eq!(rewritten(&prev, &[h(1), h(2), h(9), h(10)]), 2);
        assert_eq!(rewritten(&prev, &[h(1), h(2)]), 2);
        assert_eq!(rewritten(&prev, &[h(7)]), 4);
    }
}
