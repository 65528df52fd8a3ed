//! A session's shape before any token is drawn: the planner's calls in each
//! user turn, which of them hand off to a subagent, and how many calls each
//! subagent makes.

use super::{GenerateOptions, Rng};

/// The largest session [`Shape::sized`] draws (a log-normal has no upper bound).
pub(super) const MAX_SESSION_REQUESTS: f64 = 20_000.0;

/// Who makes a session's requests.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Shape {
    /// Planner calls in each user turn.
    pub turns: Vec<u32>,
    /// The planner calls that hand off (user turn, call in it), in the order
    /// drawn, each with its subagent's calls (`None`: drawn when it runs).
    pub spawns: Vec<((u32, u32), Option<u32>)>,
}

impl Shape {
    /// Counts drawn bottom up: user turns, calls per turn, subagents, each
    /// subagent's calls (geometric; the default model).
    pub fn counted(rng: &mut Rng, o: &GenerateOptions) -> Self {
        let n = rng.count(o.user_turns_mean);
        let turns: Vec<u32> = (0..n).map(|_| rng.count(o.calls_per_turn_mean)).collect();
        let mut spawns = Vec::new();
        let eligible = handoff_calls(&turns);
        if !eligible.is_empty() && rng.chance(o.subagent_share) {
            let k = rng.count(o.subagents_mean).min(eligible.len() as u32);
            for at in pick(rng, &eligible, k) {
                spawns.push((at, None));
            }
        }
        Self { turns, spawns }
    }

    /// The session's size drawn first (log-normal requests, planner and
    /// subagents together), then split: a share of it to the subagents of a
    /// session that uses them, the rest to the planner, whose calls end a user
    /// turn with probability 1 / `calls_per_turn_mean` each.
    pub fn sized(rng: &mut Rng, o: &GenerateOptions, median: f64) -> Self {
        let total = rng
            .lognormal(median, o.session_requests_sigma)
            .round()
            .clamp(1.0, MAX_SESSION_REQUESTS) as u32;
        let (mut k, mut sub_total) = (0, 0);
        // A handoff needs a planner call before it and one after it.
        if total >= 3 && rng.chance(o.subagent_share) {
            sub_total =
                ((f64::from(total) * o.subagent_request_share).round() as u32).clamp(1, total - 2);
            k = rng.count(o.subagents_mean).min(sub_total);
        }
        let mut turns = vec![1u32];
        let end_turn = 1.0 / o.calls_per_turn_mean.max(1.0);
        for _ in 1..total - sub_total {
            if rng.chance(end_turn) {
                turns.push(1);
            } else if let Some(last) = turns.last_mut() {
                *last += 1;
            }
        }
        let eligible = handoff_calls(&turns);
        k = k.min(eligible.len() as u32);
        if k == 0 {
            // No room for a handoff: the planner makes those calls itself.
            if let Some(last) = turns.last_mut() {
                *last += sub_total;
            }
            return Self {
                turns,
                spawns: Vec::new(),
            };
        }
        let calls = split(rng, sub_total, k);
        let spawns = pick(rng, &eligible, k)
            .into_iter()
            .zip(calls.into_iter().map(Some))
            .collect();
        Self { turns, spawns }
    }

    /// Requests of the session, subagents' included (`None` when a
    /// subagent's calls are still to be drawn).
    #[cfg(test)]
    pub fn requests(&self) -> Option<u32> {
        let subs: Option<u32> = self.spawns.iter().map(|(_, c)| *c).sum();
        Some(self.turns.iter().sum::<u32>() + subs?)
    }
}

/// Planner calls that can hand off: every call of a turn but its last.
fn handoff_calls(turns: &[u32]) -> Vec<(u32, u32)> {
    turns
        .iter()
        .enumerate()
        .flat_map(|(u, &n)| (0..n.saturating_sub(1)).map(move |c| (u as u32, c)))
        .collect()
}

/// `k` distinct picks from `from` (`k` ≤ its length), in the order drawn.
fn pick(rng: &mut Rng, from: &[(u32, u32)], k: u32) -> Vec<(u32, u32)> {
    let mut picked = Vec::new();
    while (picked.len() as u32) < k {
        let at = from[(rng.next_u64() % from.len() as u64) as usize];
        if !picked.contains(&at) {
            picked.push(at);
        }
    }
    picked
}

/// `total` calls over `k` ≥ 1 subagents, at least one each, the rest in
/// proportion to exponential weights (a uniform split of the simplex).
fn split(rng: &mut Rng, total: u32, k: u32) -> Vec<u32> {
    let weights: Vec<f64> = (0..k).map(|_| rng.exponential(1.0)).collect();
    let sum: f64 = weights.iter().sum();
    let spare = total - k;
    let mut calls: Vec<u32> = weights
        .iter()
        .map(|w| 1 + (f64::from(spare) * w / sum).floor() as u32)
        .collect();
    let given: u32 = calls.iter().sum();
    if let Some(first) = calls.first_mut() {
        *first += total - given;
    }
    calls
}
