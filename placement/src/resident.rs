//! Placement by residency and load: a key's state follows it (`docs/gateway.md`
//! "Residency-aware placement").
//!
//! A key may live on any of its first *d* rendezvous candidates. Given a load
//! view and what each candidate says it holds ([`crate::residency`]):
//!
//! 1. a candidate holds the key's state and is under the load bound → stay
//!    there ([`How::Stay`]; the holder with the most tokens when several do) —
//!    unless, when the view has the ranks' prefill backlogs, the holder's
//!    backlog would delay the turn longer than moving it to another candidate
//!    ([`Placement::place_resident_in`]); of several holders, the one with the
//!    most tokens, and of those with as many the least loaded (a state copied to
//!    a cooler candidate during a tool gap is found there);
//! 2. no candidate holds it → the least loaded candidate, ties by rendezvous
//!    order (power of *d* choices: [`How::Least`]); or, with
//!    [`Unseen::Rendezvous`], its first rendezvous candidate while that one is
//!    under the bound, so a turn that returns before any summary shows its
//!    predecessor lands where the predecessor did;
//! 3. the holder is over the bound → the least loaded other candidate with
//!    room, and the state goes with the key when pulling it over the KV link
//!    costs less than recomputing it ([`MoveCost::migrate`]: [`How::Migrate`],
//!    else [`How::Recompute`]); when no other candidate has room the key stays.
//!    With [`OverBound::KeepUp`] and the ranks' prefill backlogs in view, a
//!    holder over the bound keeps the key unless the move passes rule 1's
//!    backlog test: a rank busy decoding whose prefills keep up keeps its
//!    sessions;
//! 4. some candidate's residency is unknown (no fresh summary) → the
//!    bounded-load pick down the rendezvous order ([`How::Bounded`]), so a
//!    fleet that publishes nothing keeps tether's plain affinity instead of
//!    bouncing keys between candidates.
//!
//! Pure: the same view gives the same choice on every gateway replica, in the
//! simulator and in `tether replay --route`; no per-session state anywhere.

use crate::load::{LoadBound, first_under_bound};
use crate::rendezvous::{Pick, Placement};
use crate::residency::Held;

/// *d*, the rendezvous candidates a key may live on, when nothing sets it
/// (the filter's `residency.candidates`, `tether simulate --candidates`,
/// `tether replay`, `tether-rank --rebalance`), at most the endpoints: four of
/// eight ranks gives a key on a busy home as many cooler places to go as its
/// busy share can tell apart (docs/gateway.md, "Residency-aware placement").
pub const DEFAULT_CANDIDATES: usize = 4;

/// The prefill rate, tokens/s, a router assumes for a rank that reports none
/// in `/load` when nothing configures one: a conservative figure (an 8 B model
/// on one H200 prefills about 100 K tokens/s, a 70 B model at TP 4 about
/// 20 K), so an unknown rank's backlog reads long rather than short.
pub const FALLBACK_PREFILL_TOKENS_PER_S: f64 = 20_000.0;

/// How much sooner a move must start a returning turn's prefill than
/// staying, ms: small gains are not worth a transfer and a stale view.
pub const WAIT_MARGIN_MS: f64 = 50.0;

/// What a router knows of one endpoint's residency for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Knows {
    /// No fresh summary from this endpoint.
    Unknown,
    /// Its summary lists nothing for the key.
    Nothing,
    /// Its summary lists the key.
    Holds(Held),
}

/// The cost rule of moving a state: transfer over the KV link or recompute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoveCost {
    /// Fixed cost of one transfer (connection set-up, the prefill leg's
    /// round trip), ms.
    pub transfer_setup_ms: f64,
    /// ms per token over the link: KV bytes per token / link bytes per ms.
    pub transfer_ms_per_token: f64,
    /// ms per token to recompute the state on the target (its prefill rate).
    pub recompute_ms_per_token: f64,
}

impl MoveCost {
    /// From the model's KV bytes per token, the link's GB/s (10⁹ bytes per
    /// second, as `tether-rank --kv-link-gbps` counts it), the set-up ms and
    /// the target's prefill tokens per second. A link of 0 GB/s never migrates.
    pub fn from_link(
        kv_bytes_per_token: f64,
        link_gbps: f64,
        setup_ms: f64,
        prefill_tps: f64,
    ) -> Self {
        let transfer = if link_gbps > 0.0 {
            kv_bytes_per_token / (link_gbps * 1e9) * 1e3
        } else {
            f64::INFINITY
        };
        Self {
            transfer_setup_ms: setup_ms.max(0.0),
            transfer_ms_per_token: transfer,
            recompute_ms_per_token: if prefill_tps > 0.0 {
                1e3 / prefill_tps
            } else {
                f64::INFINITY
            },
        }
    }

    /// Time to pull `tokens` of state over the link.
    pub fn transfer_ms(&self, tokens: u64) -> f64 {
        self.transfer_setup_ms + tokens as f64 * self.transfer_ms_per_token
    }

    /// Time to recompute `tokens` of state.
    pub fn recompute_ms(&self, tokens: u64) -> f64 {
        tokens as f64 * self.recompute_ms_per_token
    }

    /// How long a rank's prefill backlog of `tokens` holds a new prefill
    /// back, ms: at `tokens_per_s` (the rank's own rate, from its `/load`)
    /// when that is known and positive, else at this rule's recompute rate.
    pub fn wait_ms(&self, tokens: f64, tokens_per_s: Option<f64>) -> f64 {
        if !(tokens.is_finite() && tokens > 0.0) {
            return 0.0;
        }
        match tokens_per_s.filter(|r| r.is_finite() && *r > 0.0) {
            Some(rate) => tokens / rate * 1e3,
            None => tokens * self.recompute_ms_per_token,
        }
    }

    /// The rule: migrate when the transfer is faster than the recompute.
    pub fn migrate(&self, tokens: u64) -> bool {
        self.transfer_ms(tokens) < self.recompute_ms(tokens)
    }
}

/// Where rule 2 sends a key no candidate's summary shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unseen {
    /// The least loaded candidate, ties by rendezvous order.
    #[default]
    LeastLoaded,
    /// The first rendezvous candidate while it is under the bound, else the
    /// least loaded: deterministic until a summary shows the key.
    Rendezvous,
}

impl Unseen {
    /// Every setting with its name, as configurations and flags spell it.
    pub const NAMES: [(&'static str, Unseen); 2] = [
        ("least-loaded", Unseen::LeastLoaded),
        ("rendezvous", Unseen::Rendezvous),
    ];

    /// The setting named `s`.
    pub fn from_name(s: &str) -> Option<Unseen> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, u)| *u)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, u)| *u == self)
            .map_or("", |(n, _)| n)
    }
}

/// What rule 3 does with a holder over the in-flight bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OverBound {
    /// Move the key to the least loaded other candidate with room: the bound
    /// on requests in flight balances busy time (`docs/gateway.md`).
    #[default]
    Move,
    /// With prefill backlogs in view, move only when the move would start the
    /// turn's prefill [`WAIT_MARGIN_MS`] sooner (rule 1's test); without them,
    /// as [`OverBound::Move`]. A rank with many requests decoding but no
    /// prefill queue keeps its sessions' cached prefixes; heavy sessions stay
    /// on their homes longer, so busy time is less balanced.
    KeepUp,
}

impl OverBound {
    /// Every setting with its name, as configurations and flags spell it.
    pub const NAMES: [(&'static str, OverBound); 2] =
        [("move", OverBound::Move), ("keep-up", OverBound::KeepUp)];

    /// The setting named `s`.
    pub fn from_name(s: &str) -> Option<OverBound> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, o)| *o)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, o)| *o == self)
            .map_or("", |(n, _)| n)
    }
}

/// The residency-aware rule's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// *d*: rendezvous candidates a key may live on (≥ 1).
    pub candidates: usize,
    /// When a holder counts as over loaded.
    pub bound: LoadBound,
    /// Migrate or recompute.
    pub cost: MoveCost,
    /// Rule 2: where a key no summary shows goes.
    pub unseen: Unseen,
    /// Rule 3: what a holder over the bound does.
    pub over_bound: OverBound,
}

/// Why the key went where it went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// To the candidate that holds its state.
    Stay,
    /// No candidate holds it: to the least loaded candidate (or, with
    /// [`Unseen::Rendezvous`], to the first one while it has room).
    Least,
    /// The holder (endpoint index `from`) is over the bound: moved, its
    /// state pulled from `from` over the KV link.
    Migrate { from: usize },
    /// The holder `from` is over the bound: moved, its state recomputed
    /// (the transfer would cost more).
    Recompute { from: usize },
    /// Residency unknown for some candidate: bounded-load rendezvous pick.
    Bounded,
}

/// One key's placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The chosen endpoint first, then the rest of the key's rendezvous
    /// order (retry fallbacks); the DP rank on the chosen endpoint.
    pub pick: Pick,
    pub how: How,
    /// What the holder holds, when one does.
    pub held: Option<Held>,
}

impl Choice {
    /// The chosen endpoint.
    pub fn endpoint(&self) -> Option<usize> {
        self.pick.order.first().copied()
    }
}

impl Placement {
    /// Places `key` by residency and load ([module docs](self)): `loads[i]`
    /// per endpoint (requests in flight), `knows(i)` what endpoint `i` holds
    /// for the key. `fallbacks` endpoints follow the chosen one in the order
    /// (at least the other candidates). `None` without endpoints.
    pub fn place_resident(
        &self,
        key: u64,
        fallbacks: usize,
        rule: &Rule,
        loads: &[f64],
        knows: impl Fn(usize) -> Knows,
    ) -> Option<Choice> {
        self.place_resident_in(key, fallbacks, rule, loads, &[], knows)
    }

    /// [`Placement::place_resident`] with each endpoint's prefill backlog as
    /// a wait (`wait_ms[i]`: the `/load` report's `queued_prefill_tokens` at
    /// that endpoint's prefill rate, [`MoveCost::wait_ms`]; empty: unknown,
    /// rule 1 as above). A holder under the bound whose backlog would hold
    /// the key's next prefill back longer than moving it — the quickest other
    /// candidate with room: its own wait plus moving the state (transfer, or
    /// recompute when that is cheaper) plus [`WAIT_MARGIN_MS`] — passes the
    /// key on: a returning turn does not queue behind another session's
    /// 100 K-token prefill when its state can cross the link in tens of ms.
    /// Waits, not tokens, because ranks prefill at their own rates: the
    /// caller converts with each rank's reported rate where it has one.
    pub fn place_resident_in(
        &self,
        key: u64,
        fallbacks: usize,
        rule: &Rule,
        loads: &[f64],
        wait_ms: &[f64],
        knows: impl Fn(usize) -> Knows,
    ) -> Option<Choice> {
        let d = rule.candidates.max(1);
        let mut pick = self.pick(key, fallbacks.max(d - 1))?;
        let cands: Vec<usize> = pick.order.iter().take(d).copied().collect();
        let shares = self.shares();
        let total: f64 = loads.iter().sum();
        let load = |i: usize| loads.get(i).copied().unwrap_or(0.0);
        let room = |i: usize| {
            load(i)
                < rule
                    .bound
                    .capacity(total, shares.get(i).copied().unwrap_or(0.0))
        };
        let mut holder: Option<(usize, Held)> = None;
        let mut unknown = false;
        for &i in &cands {
            match knows(i) {
                Knows::Unknown => unknown = true,
                Knows::Nothing => {}
                Knows::Holds(h) if h.tokens > 0 => {
                    // The most tokens; of holders with as many (a copy made in a tool
                    // gap beside its original), the less loaded.
                    let better = |(b, bh): (usize, Held)| {
                        h.tokens > bh.tokens || (h.tokens == bh.tokens && load(i) < load(b))
                    };
                    if holder.is_none_or(better) {
                        holder = Some((i, h));
                    }
                }
                Knows::Holds(_) => {}
            }
        }
        // Least loaded of `among`, ties by rendezvous order (the order of `cands`).
        let least = |among: &mut dyn Iterator<Item = usize>| {
            among.fold(None, |best: Option<usize>, i| match best {
                Some(b) if load(b) <= load(i) => Some(b),
                _ => Some(i),
            })
        };
        let wait = |i: usize| wait_ms.get(i).copied().unwrap_or(0.0).max(0.0);
        // Moving the state off holder `h`: what it costs the turn, ms, and how.
        let moving = |h: usize, held: Held| {
            let tokens = u64::from(held.tokens);
            if rule.cost.migrate(tokens) {
                (rule.cost.transfer_ms(tokens), How::Migrate { from: h })
            } else {
                (rule.cost.recompute_ms(tokens), How::Recompute { from: h })
            }
        };
        // Rule 1's backlog test: `t`, if moving there starts the prefill sooner by the margin.
        let sooner = |h: usize, cost: f64| {
            let quickest = cands.iter().copied().filter(|&i| i != h && room(i)).fold(
                None,
                |best: Option<usize>, i| match best {
                    Some(b) if wait(b) <= wait(i) => Some(b),
                    _ => Some(i),
                },
            );
            quickest.filter(|&t| wait(t) + cost + WAIT_MARGIN_MS < wait(h))
        };
        let keep_up = rule.over_bound == OverBound::KeepUp && !wait_ms.is_empty();
        let (chosen, how) = match holder {
            Some((h, held)) if (room(h) || keep_up) && !wait_ms.is_empty() => {
                let (cost, how) = moving(h, held);
                match sooner(h, cost) {
                    Some(t) => (t, how),
                    None => (h, How::Stay),
                }
            }
            Some((h, _)) if room(h) => (h, How::Stay),
            Some((h, held)) => {
                match least(&mut cands.iter().copied().filter(|&i| i != h && room(i))) {
                    None => (h, How::Stay),
                    Some(t) => (t, moving(h, held).1),
                }
            }
            None if unknown => {
                let pos = first_under_bound(&cands, loads, &shares, total, rule.bound)?;
                (*cands.get(pos)?, How::Bounded)
            }
            None => match (rule.unseen, cands.first()) {
                (Unseen::Rendezvous, Some(&first)) if room(first) => (first, How::Least),
                _ => (least(&mut cands.iter().copied())?, How::Least),
            },
        };
        let pos = pick.order.iter().position(|&i| i == chosen)?;
        let c = pick.order.remove(pos);
        pick.order.insert(0, c);
        pick.rank = crate::dp_rank(key, self.endpoints().get(chosen)?.dp_size);
        Some(Choice {
            pick,
            how,
            held: holder.map(|(_, h)| h),
        })
    }
}

#[cfg(test)]
mod tests;
