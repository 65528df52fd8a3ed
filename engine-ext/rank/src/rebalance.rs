//! Rebalancing in tool gaps between real ranks (`docs/rank.md` "Rebalancing
//! in tool gaps"): what the fleet simulator does (`tether simulate
//! --rebalance`, `docs/planning.md`), here between `tether-rank` processes.
//!
//! At the end of a `tool` or `handoff` turn whose state this rank retained,
//! the rank asks the rule the gateway and the simulator share
//! ([`tether_placement::Placement::rebalance_target`]) whether a cooler
//! candidate should hold a copy: its own gauges fresh, its peers' from their
//! `/load` polled every `--peer-poll-ms`. With a target it asks it to *adopt*
//! the state (`POST /pull/adopt`): the target leases the blocks from this rank
//! with the state pull's client and retains them under the key, so both ranks
//! list the key and the gateway's rule 1 sends the returning turn to the less
//! loaded holder. Whichever of the two serves that turn tells the other to let
//! its copy go (`POST /pull/forget`). No gateway state; a rank remembers only
//! its twin per copied key, boundedly.
//!
//! This module holds the pure parts: the flags ([`peers`]), the polled view
//! ([`view`]), the twin memory ([`twins`]), the JSON of the two calls
//! ([`wire`]) and the counters ([`Event`]); `server::rebalance` runs them.

pub mod peers;
pub mod twins;
pub mod view;
pub mod wire;

use crate::config::{Args, ConfigError};
use std::sync::atomic::{AtomicU64, Ordering};

pub use peers::Peers;
pub use twins::{Side, Twin, Twins};
pub use view::View;

/// `--candidates` as used: the flag, else the gateway's default
/// ([`tether_placement::DEFAULT_CANDIDATES`]), never more than the endpoints.
pub fn candidates(args: &Args, endpoints: usize) -> usize {
    args.candidates
        .unwrap_or(tether_placement::DEFAULT_CANDIDATES.min(endpoints.max(1)))
}

fn flag(flag: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Flag {
        flag,
        why: why.into(),
    }
}

/// Checks the rebalancing flags; the endpoints of `--peers` (empty without
/// `--rebalance`). Which of them is this rank is found once it listens
/// ([`Peers::resolve`]).
pub fn check_flags(a: &Args) -> Result<Vec<tether_placement::Endpoint>, ConfigError> {
    if !(a.rebalance_kv_factor.is_finite() && a.rebalance_kv_factor > 1.0) {
        return Err(flag("rebalance-kv-factor", "must be a number above 1"));
    }
    if !(a.resident_factor.is_finite() && a.resident_factor > 1.0) {
        return Err(flag("resident-factor", "must be a number above 1"));
    }
    if !(a.resident_floor.is_finite() && a.resident_floor >= 1.0) {
        return Err(flag("resident-floor", "must be a number of at least 1"));
    }
    if !(10..=60_000).contains(&a.peer_poll_ms) {
        return Err(flag("peer-poll-ms", "must be between 10 and 60000"));
    }
    if a.rebalance && a.role == crate::config::Role::Prefill {
        return Err(flag(
            "rebalance",
            "a prefill rank serves no session's turns (--role prefill)",
        ));
    }
    if !a.rebalance {
        if !a.peers.is_empty() {
            return Err(flag("peers", "only with --rebalance"));
        }
        if a.candidates.is_some() {
            return Err(flag("candidates", "only with --rebalance"));
        }
        return Ok(Vec::new());
    }
    let eps = peers::parse(&a.peers).map_err(|why| flag("peers", why))?;
    let d = candidates(a, eps.len());
    if d == 0 || d > eps.len() {
        return Err(flag(
            "candidates",
            format!(
                "must be between 1 and the {} endpoints of --peers",
                eps.len()
            ),
        ));
    }
    Ok(eps)
}

/// What `tether_rank_rebalance_total{event}` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// As a home: a target adopted this rank's copy of a tool turn's state.
    Copied,
    /// As a home: the target could not be reached, refused or failed to adopt.
    CopyFailed,
    /// As a home: the copy landed and this rank moved its own to its host tier.
    Demoted,
    /// As a target: a state leased from its home and retained here.
    Adopted,
    /// As a target: the lease or the engine failed; nothing retained.
    AdoptFailed,
    /// As a target: the returning turn came here; the home was told to forget.
    Used,
    /// As a home: the returning turn came back here; the target was told to forget.
    Unused,
    /// The returning turn came while the copy was still crossing; the copy
    /// the turn did not take was let go once the copy ended.
    Late,
    /// This rank let its copy go on its twin's `POST /pull/forget`.
    Released,
    /// The twin could not be told to forget (its copy expires on its own).
    ForgetFailed,
    /// A tool/handoff turn without `x-tether-key`: its candidates are unknown.
    NoKey,
    /// A bad `/pull/adopt` or `/pull/forget` call (400, 405, 409, 413).
    Refused,
}

impl Event {
    pub const ALL: [Event; 12] = [
        Event::Copied,
        Event::CopyFailed,
        Event::Demoted,
        Event::Adopted,
        Event::AdoptFailed,
        Event::Used,
        Event::Unused,
        Event::Late,
        Event::Released,
        Event::ForgetFailed,
        Event::NoKey,
        Event::Refused,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Event::Copied => "copied",
            Event::CopyFailed => "copy_failed",
            Event::Demoted => "demoted",
            Event::Adopted => "adopted",
            Event::AdoptFailed => "adopt_failed",
            Event::Used => "used",
            Event::Unused => "unused",
            Event::Late => "late",
            Event::Released => "released",
            Event::ForgetFailed => "forget_failed",
            Event::NoKey => "no_key",
            Event::Refused => "refused",
        }
    }
}

/// One counter per [`Event`].
#[derive(Debug, Default)]
pub struct Counters([AtomicU64; Event::ALL.len()]);

impl Counters {
    pub fn add(&self, e: Event) {
        if let Some(i) = Event::ALL.iter().position(|x| *x == e) {
            self.0[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, e: Event) -> u64 {
        Event::ALL
            .iter()
            .position(|x| *x == e)
            .map_or(0, |i| self.0[i].load(Ordering::Relaxed))
    }
}

/// Most keys a rank remembers a twin for (past it the oldest is forgotten:
/// that twin's copy expires on its own).
pub const MAX_TWINS: usize = 16_384;

/// A rank that rebalances: its peers, the rule's settings, the polled view
/// and the twin memory.
#[derive(Debug)]
pub struct Rebalancer {
    pub peers: Peers,
    pub rule: tether_placement::Rule,
    pub settings: tether_placement::Rebalance,
    /// `--peer-poll-ms`.
    pub poll: std::time::Duration,
    pub view: std::sync::Mutex<View>,
    pub twins: std::sync::Mutex<Twins>,
}

impl Rebalancer {
    /// From a checked configuration whose listen address (or `--rank-id`)
    /// is final; `None` without `--rebalance`.
    pub fn new(cfg: &crate::config::RankConfig) -> Result<Option<Self>, ConfigError> {
        let a = &cfg.args;
        if !a.rebalance {
            return Ok(None);
        }
        let peers = Peers::resolve(&cfg.peers, a.rank_id.as_deref(), a.listen)
            .map_err(|why| flag("peers", why))?;
        let n = cfg.peers.len();
        let rule = tether_placement::Rule {
            candidates: candidates(a, n),
            bound: tether_placement::LoadBound {
                factor: a.resident_factor,
                floor: a.resident_floor,
            },
            // Not read by the rebalancing rule (only by placement's rule 3).
            cost: tether_placement::MoveCost::from_link(
                cfg.profile.kv_bytes_per_token as f64,
                a.kv_link_gbps,
                5.0,
                20_000.0,
            ),
            unseen: tether_placement::Unseen::LeastLoaded,
            over_bound: tether_placement::OverBound::Move,
        };
        let poll = std::time::Duration::from_millis(a.peer_poll_ms);
        Ok(Some(Self {
            peers,
            rule,
            settings: tether_placement::Rebalance {
                kv_factor: a.rebalance_kv_factor,
            },
            poll,
            view: std::sync::Mutex::new(View::new(n, max_age(poll))),
            twins: std::sync::Mutex::new(Twins::new(MAX_TWINS)),
        }))
    }

    pub fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn twins(&self) -> std::sync::MutexGuard<'_, Twins> {
        self.twins.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a peer's last answer stands: three polls, at least a second (a
/// peer that does not answer is unknown at once; this only ages out the
/// answer of a poller that fell behind).
pub fn max_age(poll: std::time::Duration) -> std::time::Duration {
    (3 * poll).max(std::time::Duration::from_secs(1))
}

/// The bound on one `/load` call to a peer: its poll period, within
/// [250 ms, 2 s] (a busy peer answers late, not never).
pub fn poll_timeout(poll: std::time::Duration) -> std::time::Duration {
    poll.clamp(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(2),
    )
}

/// A tool/handoff turn being served here, to copy out once it finishes.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// The DP rank serving it.
    pub dp: usize,
    pub marker: tether_engine::TurnMarker,
    /// The gateway's routing key (`x-tether-key`).
    pub route: u64,
}

/// The gateway's routing key from `x-tether-key` (16 hex digits); `None`
/// when absent, repeated or malformed (then the turn is not rebalanced).
pub fn route_key<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<u64> {
    let mut it = values.into_iter();
    let v = std::str::from_utf8(it.next()?).ok()?.trim();
    if it.next().is_some() || v.is_empty() || v.len() > 16 {
        return None;
    }
    u64::from_str_radix(v, 16).ok()
}
