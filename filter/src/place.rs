//! Stage 2 of the decision, place: a pure function of (key, configuration,
//! snapshot of the load view and ejection table, now) — every gateway replica, the fleet simulator and
//! the replay client given the same view make the same choice.
//!
//! - Rendezvous (pick mode): the key's weighted rendezvous order over the
//!   decode endpoints and its DP rank ([`tether_placement::Placement::pick`]).
//! - Ejection (pick mode): when the VM's [`eject::Health`] table (fed by the
//!   response path) holds the primary out, the key takes its first healthy
//!   fallback ([`eject::Health::reorder`]).
//! - Load-aware pick (`load`): when the view has a fresh sample, the key is
//!   placed by [`tether_placement::Placement::pick_bounded`] on the polled
//!   requests in flight — it stays on its primary until that endpoint is over
//!   the bound, then takes its next rendezvous choice with room. When the body
//!   is rewritten a spill never changes the key's DP rank (endpoints of
//!   different `dp_size`; `docs/gateway.md`, "Load-aware pick").
//! - Residency-aware pick (`residency`): when the view has a fresh sample, the
//!   key is placed by [`tether_placement::Placement::place_resident`] on the
//!   polled loads and what each of its *d* candidates says it holds
//!   ([`residency_view`]); a key moved off an overloaded holder names that
//!   holder when moving its state is cheaper than recomputing it — the new
//!   endpoint pulls from it ([`Prefill::Pull`], `migrate: "pull"`) or it runs
//!   the prefill leg ([`Prefill::Holder`], `"leg"`) (`docs/gateway.md`,
//!   "Residency-aware placement").
//! - P/D (`pd`, body path): [`pd::prefiller`] on the prompt estimate and the
//!   prefill endpoints' queued prefill as waits at their own rates.

pub mod eject;
pub mod load_view;
pub mod pd;
pub mod residency_view;

use crate::config::residency::{Migrate, ResidencyConfig};
use crate::config::{Config, Mode};
use eject::Health;
use load_view::{Freshness, LoadView};
use residency_view::ResidencyView;
use tether_placement::{How, Pick, Placement};

/// The endpoint pools of a configuration, built once per VM.
#[derive(Debug, Clone)]
pub struct Pools {
    /// The decode (pick-mode) endpoints, `endpoints`.
    pub decode: Placement,
    /// The prefill pool, `pd.prefill_endpoints`.
    pub prefill: Option<Placement>,
}

impl Pools {
    pub fn new(cfg: &Config) -> Self {
        Self {
            decode: Placement::new(&cfg.endpoints),
            prefill: cfg.pd.as_ref().map(|pd| Placement::new(&pd.prefill)),
        }
    }
}

/// The load view as of one moment, handed in by the caller: the view indexes
/// decode endpoints first, then prefill endpoints.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    pub view: &'a LoadView,
    /// What the decode endpoints hold (`residency`), by decode endpoint index.
    pub residency: &'a ResidencyView,
    /// Pick mode: the VM's ejection table ([`eject`]), when it keeps one.
    pub health: Option<&'a Health>,
    /// Host clock, ms since the epoch (what the samples' `at_ms` count from).
    pub now_ms: u64,
}

/// A view with no samples: placement is the plain rendezvous pick.
static NO_VIEW: LoadView = LoadView::EMPTY;
/// No residency known.
static NO_RESIDENCY: ResidencyView = ResidencyView::EMPTY;

impl Snapshot<'_> {
    /// No load known.
    pub const NONE: Snapshot<'static> = Snapshot {
        view: &NO_VIEW,
        residency: &NO_RESIDENCY,
        health: None,
        now_ms: 0,
    };
}

/// What placement needs to know about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub key: u64,
    /// The key's retention key as a residency summary lists it
    /// ([`tether_placement::resident_key`] of its marker hashes).
    pub resident: u64,
    /// Body path: the prompt's size, for P/D; `None` on the header path.
    pub prompt: Option<Prompt>,
    /// The body is rewritten: a spill must keep the key's DP rank.
    pub keep_rank: bool,
}

/// A request's prompt as the body shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prompt {
    /// The body's size.
    pub bytes: usize,
    /// The bytes after its last assistant entry, when it has one.
    pub new_bytes: Option<usize>,
}

/// Where the prefill runs (P/D).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefill {
    /// No P/D decision: not configured, header path, or nothing picked.
    Off,
    /// On the decode endpoint (expected uncached prompt under the threshold).
    Local,
    /// On this prefill endpoint (index into `pd.prefill_endpoints`).
    Remote(usize),
    /// On the key's old home, decode endpoint `i`, whose retained state the
    /// chosen endpoint receives over the KV link from a prefill leg there (a
    /// residency migration, `migrate: "leg"`).
    Holder(usize),
    /// On the chosen endpoint, after it pulls the key's retained state from
    /// its old home, decode endpoint `i`, which schedules nothing for it (a
    /// residency migration, `migrate: "pull"`). Never also disaggregated: a
    /// prefill endpoint holds none of the state, so a P/D leg would recompute
    /// what the pull brings.
    Pull(usize),
}

/// Where one request goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// Pick mode: the endpoint order and DP rank; `None` in hash mode.
    pub pick: Option<Pick>,
    /// Its primary is ejected: the key went to its first healthy fallback.
    pub ejected: bool,
    /// Load-aware pick moved the key off its rendezvous primary.
    pub spilled: bool,
    /// How the decision read the load view.
    pub load: LoadRead,
    pub prefill: Prefill,
    /// Placed by residency: why the key went where it went.
    pub how: Option<How>,
}

impl Placed {
    /// Hash mode: Envoy places the key.
    pub const NONE: Placed = Placed {
        pick: None,
        ejected: false,
        spilled: false,
        load: LoadRead::Off,
        prefill: Prefill::Off,
        how: None,
    };

    /// The primary endpoint's index.
    pub fn primary(&self) -> Option<usize> {
        self.pick.as_ref().and_then(|p| p.order.first().copied())
    }
}

/// Places one request.
pub fn place(cfg: &Config, pools: &Pools, req: &Request, snap: Snapshot<'_>) -> Placed {
    if cfg.mode != Mode::Pick {
        return Placed::NONE;
    }
    let mut placed = pick(cfg, pools, req, snap);
    if placed.pick.is_some() {
        placed.load = load_read(cfg, pools, snap, &placed);
    }
    placed
}

/// How a pick-mode decision read the load view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadRead {
    /// Not read: no `load` block, hash mode, or nothing picked.
    Off,
    /// Every sample read was fresh (an endpoint never sampled reads 0).
    Fresh,
    /// Some endpoint's last report was older than `load.max_age_ms` beside
    /// fresh ones (its polls failing or late) and was held: the decode
    /// endpoints' (bounded and residency placement) or, with a P/D choice,
    /// the prefill endpoints'. Counted in `tether_load_held`.
    Held,
    /// No decode endpoint had a fresh sample (ranks down, polls failing, no
    /// poll answered yet since start): no view, so the key went by the plain
    /// rendezvous order. Counted in `tether_load_blind`, so an operator sees
    /// load-aware placement that is configured but not acting.
    Blind,
}

/// How the decision that made `placed` read the load view.
fn load_read(cfg: &Config, pools: &Pools, snap: Snapshot<'_>, placed: &Placed) -> LoadRead {
    let Some(lc) = &cfg.load else {
        return LoadRead::Off;
    };
    let n = pools.decode.endpoints().len();
    let m = pools.prefill.as_ref().map_or(0, |p| p.endpoints().len());
    let (now, age) = (snap.now_ms, lc.max_age_ms);
    let prefill_chosen = matches!(placed.prefill, Prefill::Local | Prefill::Remote(_));
    match snap.view.freshness(0..n, now, age) {
        Freshness::NoView => LoadRead::Blind,
        Freshness::Holds => LoadRead::Held,
        Freshness::Fresh if prefill_chosen && snap.view.holds_stale(n..n + m, now, age) => {
            LoadRead::Held
        }
        Freshness::Fresh => LoadRead::Fresh,
    }
}

/// [`place`] in pick mode.
fn pick(cfg: &Config, pools: &Pools, req: &Request, snap: Snapshot<'_>) -> Placed {
    let Some(plain) = pools.decode.pick(req.key, cfg.fallbacks) else {
        return Placed::NONE;
    };
    let (home, ejected) = match healthy(pools, req, snap, &plain) {
        Some(moved) => (moved, true),
        None => (plain, false),
    };
    if !ejected && let Some(placed) = resident(cfg, pools, req, snap, &home) {
        return placed;
    }
    let (pick, spilled) = match bounded(cfg, pools, req, snap) {
        Some(b)
            if b.order.first() != home.order.first() && !(req.keep_rank && b.rank != home.rank) =>
        {
            (b, true)
        }
        _ => (home, false),
    };
    let prefill = match req.prompt {
        Some(p) => prefill(cfg, pools, req.key, p, spilled, snap),
        None => Prefill::Off,
    };
    Placed {
        pick: Some(pick),
        ejected,
        spilled,
        load: LoadRead::Off,
        prefill,
        how: None,
    }
}

/// The key's order with its ejected primary moved behind its healthy
/// fallbacks ([`eject::Health::reorder`]), when the primary is ejected and the
/// move keeps the DP rank where it must.
fn healthy(pools: &Pools, req: &Request, snap: Snapshot<'_>, plain: &Pick) -> Option<Pick> {
    let health = snap.health.filter(|h| h.ever_ejected())?;
    let first = *plain.order.first()?;
    if !health.ejected(first, snap.now_ms) {
        return None;
    }
    let mut moved = plain.clone();
    (health.reorder(&pools.decode, req.key, &mut moved, snap.now_ms)
        && !(req.keep_rank && moved.rank != plain.rank))
        .then_some(moved)
}

/// The residency-aware placement, when `residency` is configured and some
/// decode endpoint has a fresh load sample; `None` leaves the key to the
/// plain and bounded picks (also when a rewritten body would change its DP
/// rank). A migrated key pulls its state from its old home, or sends its
/// prefill leg there (`residency.migrate`); otherwise P/D decides as usual,
/// expecting the prompt uncached unless the key stays.
fn resident(
    cfg: &Config,
    pools: &Pools,
    req: &Request,
    snap: Snapshot<'_>,
    home: &Pick,
) -> Option<Placed> {
    let (rc, lc) = (cfg.residency.as_ref()?, cfg.load.as_ref()?);
    let n = pools.decode.endpoints().len();
    if !snap.view.any_fresh(0..n, snap.now_ms, lc.max_age_ms) {
        return None;
    }
    // Requests in flight, ties broken by how busy each rank has lately been.
    let loads = snap
        .view
        .resident_loads(0..n, snap.now_ms, lc.max_age_ms, rc.busy_weight);
    let knows = |i| {
        snap.residency
            .knows(i, req.resident, snap.now_ms, lc.max_age_ms)
    };
    // The ranks' prefill backlogs as waits, each at the rank's own rate: a
    // holder busy with another session's long prefill passes a returning
    // turn on when moving it is quicker.
    let rule = rc.rule();
    let waits = snap
        .view
        .prefill_waits_ms(0..n, snap.now_ms, lc.max_age_ms, |tokens, rate| {
            rc.wait_ms(&rule, tokens, rate)
        });
    let c = pools
        .decode
        .place_resident_in(req.key, cfg.fallbacks, &rule, &loads, &waits, knows)?;
    if req.keep_rank && c.pick.rank != home.rank {
        return None;
    }
    let prefill = match (c.how, req.prompt) {
        (How::Migrate { from }, _) => match rc.migrate {
            Migrate::Pull => Prefill::Pull(from),
            Migrate::Leg => Prefill::Holder(from),
        },
        (_, Some(p)) => prefill(cfg, pools, req.key, p, c.how != How::Stay, snap),
        (_, None) => Prefill::Off,
    };
    Some(Placed {
        spilled: false,
        load: LoadRead::Off,
        ejected: false,
        prefill,
        how: Some(c.how),
        pick: Some(c.pick),
    })
}

/// The bounded-load pick on the view's requests in flight, when `load` is
/// configured and some decode endpoint has a fresh sample.
fn bounded(cfg: &Config, pools: &Pools, req: &Request, snap: Snapshot<'_>) -> Option<Pick> {
    let lc = cfg.load.as_ref()?;
    let n = pools.decode.endpoints().len();
    if !snap.view.any_fresh(0..n, snap.now_ms, lc.max_age_ms) {
        return None;
    }
    let loads = snap.view.requests(0..n, snap.now_ms, lc.max_age_ms);
    pools
        .decode
        .pick_bounded(req.key, cfg.fallbacks, &loads, lc.bound())
}

/// The P/D choice for a body-path request.
fn prefill(
    cfg: &Config,
    pools: &Pools,
    key: u64,
    prompt: Prompt,
    spilled: bool,
    snap: Snapshot<'_>,
) -> Prefill {
    let (Some(pd), Some(pp)) = (&cfg.pd, &pools.prefill) else {
        return Prefill::Off;
    };
    let n = pools.decode.endpoints().len();
    let m = pp.endpoints().len();
    let max_age = cfg.load.as_ref().map_or(0, |l| l.max_age_ms);
    // The pool's backlogs as waits, each at the prefill rank's own rate (the
    // residency rule's rate when one is configured): in a pool of unequal
    // ranks the shorter queue is not always the sooner start.
    let fallback;
    let rc = match &cfg.residency {
        Some(rc) => rc,
        None => {
            fallback = ResidencyConfig::default();
            &fallback
        }
    };
    let rule = rc.rule();
    let loads = snap
        .view
        .prefill_waits_ms(n..n + m, snap.now_ms, max_age, |tokens, rate| {
            rc.wait_ms(&rule, tokens, rate)
        });
    let est = pd::estimate(prompt.bytes, prompt.new_bytes, spilled, pd.bytes_per_token);
    match pd::prefiller(pd, pp, key, est, &loads) {
        Some(i) => Prefill::Remote(i),
        None => Prefill::Local,
    }
}

#[cfg(test)]
mod tests;
