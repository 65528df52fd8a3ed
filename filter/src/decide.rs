//! The per-request decision as one pure pipeline, read → place → emit:
//! [`crate::read`] turns headers and body bytes into a reading,
//! [`crate::place`] places its key on the load-view snapshot handed in, and
//! [`crate::emit`] turns both into the [`Plan`] the proxy-wasm shell applies.
//! Host-free: the shell only hands over bytes, the snapshot and the clock.

use crate::api::Api;
use crate::config::Config;
use crate::emit::{self, Plan};
use crate::place::{self, Placed, Pools, Prompt, Snapshot};
use crate::read::identity::Headers;
use crate::read::{self, Body, HeaderRead, Reading, reason::Reason};
use crate::step::Step;

/// What the header callback does.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderOutcome {
    /// Unknown path: no routing headers.
    Untouched,
    /// Decided now: apply the plan's headers, never buffer.
    Decided(Box<Plan>),
    /// Read the body; `reason` is already known to force the fallback key.
    ReadBody { api: Api, reason: Option<Reason> },
}

/// The header-callback decision. `end_of_stream` = the request has no body.
pub fn on_headers(
    cfg: &Config,
    pools: &Pools,
    snap: Snapshot<'_>,
    headers: &Headers,
    end_of_stream: bool,
) -> HeaderOutcome {
    match read::headers(cfg, headers, end_of_stream) {
        HeaderRead::Untouched => HeaderOutcome::Untouched,
        HeaderRead::ReadBody { api, reason } => HeaderOutcome::ReadBody { api, reason },
        HeaderRead::Read(r) => HeaderOutcome::Decided(Box::new(decide(
            cfg,
            pools,
            snap,
            r,
            None,
            &mut |_, _| None,
            &mut |_| {},
        ))),
    }
}

/// The fallback decision for a body we will not parse (`prefix` = its first bytes).
pub fn fallback(
    cfg: &Config,
    pools: &Pools,
    snap: Snapshot<'_>,
    api: Api,
    headers: &Headers,
    prefix: &[u8],
    reason: Reason,
) -> Plan {
    let r = read::fallback(cfg, api, headers, prefix, reason);
    decide(cfg, pools, snap, r, None, &mut |_, _| None, &mut |_| {})
}

/// One request's body as the body callback sees it at end of stream.
pub use crate::read::BodyIn as BodyCall;

/// The body-callback decision at end of stream; `fetch(start, len)` reads
/// body bytes, `mark` is called after each [`Step`] that ran (timing builds).
pub fn on_body(
    cfg: &Config,
    pools: &Pools,
    snap: Snapshot<'_>,
    call: BodyCall<'_>,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    mark: &mut impl FnMut(Step),
) -> Plan {
    let (r, body) = read::body(cfg, call, fetch, mark);
    decide(cfg, pools, snap, r, body.as_ref(), fetch, mark)
}

/// The body-path decision on a whole body held in memory, for a request that
/// names no identity in its headers and no load view: what the filter
/// concludes at end of stream (tests, tools and benchmarks compare against it).
pub fn on_whole_body(cfg: &Config, pools: &Pools, api: Api, body: &[u8]) -> Plan {
    let mut fetch = |s: usize, l: usize| body.get(s..s.checked_add(l)?).map(<[u8]>::to_vec);
    let call = BodyCall::new(api, &[], body.len());
    on_body(cfg, pools, Snapshot::NONE, call, &mut fetch, &mut |_| {})
}

/// Place, then emit, a reading. A refused reading is not placed on the view
/// (its plain rendezvous pick is kept for the debug header).
fn decide(
    cfg: &Config,
    pools: &Pools,
    snap: Snapshot<'_>,
    r: Reading,
    body: Option<&Body>,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    mark: &mut impl FnMut(Step),
) -> Plan {
    // A body read as a JSON object is rewritten when the configuration says so.
    let rewritten = body.filter(|_| cfg.rewrites_body());
    let placed = placement(cfg, pools, snap, &r, rewritten.is_some());
    mark(Step::Place);
    let plan = emit::emit(cfg, r, placed, body, fetch);
    if rewritten.is_some() {
        mark(Step::Rewrite);
    }
    plan
}

/// Places a reading; `rewritten` = its body is rewritten, so a spill must
/// keep the key's DP rank (`docs/gateway.md`, "Load-aware pick").
fn placement(
    cfg: &Config,
    pools: &Pools,
    snap: Snapshot<'_>,
    r: &Reading,
    rewritten: bool,
) -> Placed {
    let refused = r.reject.is_some();
    let id = &r.identity;
    let req = place::Request {
        key: r.key,
        resident: if cfg.residency.is_some() {
            tether_placement::resident_key(
                u128::from(id.tenant_hash()),
                u128::from(id.session_hash()),
                u128::from(id.subagent_hash()),
            )
        } else {
            0
        },
        prompt: (!r.header_path && !refused).then_some(Prompt {
            bytes: r.body_bytes,
            new_bytes: r.new_bytes,
        }),
        keep_rank: rewritten,
    };
    place::place(
        cfg,
        pools,
        &req,
        if refused { Snapshot::NONE } else { snap },
    )
}

#[cfg(test)]
mod tests;
