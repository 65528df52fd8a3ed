//! Load-aware and P/D placement on top of a decision's rendezvous pick, from
//! the VM's load view: pure, so every gateway replica with the same view
//! makes the same choice.
//!
//! - Load-aware pick (`load`): when the view has a fresh sample, the key is
//!   placed by [`tether_placement::Placement::pick_bounded`] on the polled
//!   requests in flight — it stays on its primary until that endpoint is over
//!   the bound, then takes its next rendezvous choice with room. A spill that
//!   would change a DP rank already written into the body (`routed_dp_rank`
//!   with endpoints of different `dp_size`) is not made.
//! - P/D (`pd`): on the body path, [`crate::pd::prefiller`] on the estimate
//!   and the prefill endpoints' queued prefill tokens.

use crate::config::Config;
use crate::decide::Decision;
use crate::load_view::LoadView;
use tether_placement::Placement;

/// Applies the load view and P/D to a decision whose pick is the plain
/// rendezvous pick. `prefill` is the prefill pool (when `pd` is configured);
/// the view indexes decode endpoints first, then prefill endpoints.
pub fn refine(
    cfg: &Config,
    placement: &Placement,
    prefill: Option<&Placement>,
    view: &LoadView,
    now_ms: u64,
    d: &mut Decision,
) {
    let n = placement.endpoints().len();
    let key = d.identity.key();
    if let (Some(lc), Some(pick)) = (&cfg.load, d.pick.as_mut())
        && view.any_fresh(0..n, now_ms, lc.max_age_ms)
    {
        let loads = view.requests(0..n, now_ms, lc.max_age_ms);
        if let Some(bounded) = placement.pick_bounded(key, cfg.fallbacks, &loads, lc.bound())
            && bounded.order.first() != pick.order.first()
            && !(d.edit.is_some() && bounded.rank != pick.rank)
        {
            *pick = bounded;
            d.spilled = true;
        }
    }
    if let (Some(pd), Some(pp)) = (&cfg.pd, prefill)
        && d.pick.is_some()
        && !d.header_path
    {
        let m = pp.endpoints().len();
        let max_age = cfg.load.as_ref().map_or(0, |l| l.max_age_ms);
        let loads = view.prefill_tokens(n..n + m, now_ms, max_age);
        let est = crate::pd::estimate(d.body_bytes, d.new_bytes, d.spilled, pd.bytes_per_token);
        d.prefiller = crate::pd::prefiller(pd, pp, key, est, &loads)
            .and_then(|i| pp.endpoints().get(i))
            .map(|e| e.address.clone());
    }
}

#[cfg(test)]
mod tests;
