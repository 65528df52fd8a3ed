//! Rebalancing in tool gaps (`SimConfig::rebalance`, `tether-resident` only):
//! a `tool` or `handoff` turn whose home holds more device KV than the pool's
//! mean by the configured factor has its retained state copied to the key's
//! emptiest qualifying candidate while the session waits on its tool
//! (`tether_placement::rebalance`, the rule the ranks share), so the returning
//! turn finds two holders and the residency rule takes the less loaded; the
//! copy it does not take is released.
//!
//! Modelled as the engines would do it: the copy is a pull of the home's
//! retained blocks over the KV link into the target, submitted to the target
//! engine at the turn's end as a one-token request whose prompt is the
//! retained tokens plus one, all of them transferred (`kv_in_tokens`): it
//! waits for room like any admission, holds the link for the transfer, costs
//! one batch step for its last token, and retains the state under the key with
//! the turn's interval. It is not a trace request: never in the hit, latency
//! or request counts, only in busy time and the rebalancing counters. The
//! home is charged nothing (a one-sided read of pinned blocks); when the copy
//! lands the home moves its own to its host tier (`demote`). The rule reads
//! the polled view (requests, KV in use, queued prefill), as a rank polling its
//! peers' `/load` would.

use super::{DECODE, Sim};
use std::collections::HashMap;
use tether_engine::{RetentionKey, TurnKind, TurnMarker};
use tether_placement::Loads;
use tether_rank_engine::engine::{SimMs, SimRequest};

/// One copy crossing to its target.
#[derive(Clone, Copy, Debug)]
pub(super) struct Copy {
    key: RetentionKey,
    home: usize,
    to: usize,
    tokens: usize,
    /// Its turn returned before it landed: release it on landing.
    late: bool,
}

/// Copies in flight and the keys with two holders.
#[derive(Debug, Default)]
pub(super) struct Rebalancer {
    /// By copy request id (ids above the trace's requests).
    copies: HashMap<u64, Copy>,
    /// Key → its copy in flight.
    crossing: HashMap<RetentionKey, u64>,
    /// Key → (home, copy's holder) once the copy landed.
    twins: HashMap<RetentionKey, (usize, usize)>,
    next_id: u64,
}

impl Rebalancer {
    /// Copy ids start above every trace request id.
    pub(super) fn new(requests: usize) -> Self {
        Self {
            next_id: requests as u64,
            ..Self::default()
        }
    }

    /// Whether `id` is a copy (not a trace request).
    pub(super) fn is_copy(&self, id: u64) -> bool {
        self.copies.contains_key(&id)
    }
}

impl Sim<'_> {
    /// After trace request `q` finished on decode rank `rank` at `at`: copy its
    /// retained state to a cooler candidate when the rule says so.
    pub(super) fn rebalance_after(&mut self, q: u32, rank: usize, at: SimMs) {
        let id = crate::trace::RequestId(q);
        let req = self.trace.request(id);
        if !matches!(req.opened_by, TurnKind::Tool | TurnKind::Handoff) {
            return;
        }
        let (key, rkey) = super::request_key(self.trace, id);
        if self.rebalance.crossing.contains_key(&rkey) || self.rebalance.twins.contains_key(&rkey) {
            return;
        }
        let bs = self.pools[DECODE].cfg.policy.block_size.max(1);
        let held = self.held(rank, id) / bs * bs;
        if held == 0 {
            return;
        }
        let rule = self.resident_rule(DECODE, u64::from(req.input_tokens));
        let Some(settings) = self.cfg.rebalance else {
            return;
        };
        let pool = &mut self.pools[DECODE];
        let state = pool.engines[rank].cache().device_share(held as u64);
        let view = Loads {
            requests: &pool.polled,
            kv_usage: &pool.polled_kv,
            backlog: &pool.polled_prefill,
        };
        let Some(to) = pool
            .router
            .rebalance_target(key, rank, &rule, settings, view, state)
        else {
            return;
        };
        self.blocks
            .blocks_into(self.trace, id, &mut self.blocks_buf);
        let mut hashes = std::mem::take(&mut self.blocks_buf);
        hashes.truncate(held / bs);
        let copy_id = self.rebalance.next_id;
        self.rebalance.next_id += 1;
        let sr = SimRequest {
            id: copy_id,
            hashes,
            prompt_tokens: held + 1,
            max_tokens: 1,
            marker: Some(TurnMarker {
                key: rkey,
                prompt_end: true,
                kind: req.opened_by,
                turn: None,
                retention_ms: None,
            }),
            stream: false,
            kv_in_tokens: held,
        };
        self.advance(DECODE, to, at);
        let pool = &mut self.pools[DECODE];
        let at = at.max(pool.advanced[to]);
        if pool.engines[to].submit(sr, at).is_err() {
            return;
        }
        self.rebalance.copies.insert(
            copy_id,
            Copy {
                key: rkey,
                home: rank,
                to,
                tokens: held,
                late: false,
            },
        );
        self.rebalance.crossing.insert(rkey, copy_id);
        self.reschedule(DECODE, to);
    }

    /// A copy finished on its target: the key has two holders now (or, late,
    /// its turn already went elsewhere: released at once).
    pub(super) fn copy_landed(&mut self, id: u64, ok: bool) {
        let Some(c) = self.rebalance.copies.remove(&id) else {
            return;
        };
        if self.rebalance.crossing.get(&c.key) == Some(&id) {
            self.rebalance.crossing.remove(&c.key);
        }
        if !ok {
            return;
        }
        if c.late {
            self.tot.resident.rebalance_late += 1;
            self.pools[DECODE].engines[c.to].forget(&c.key);
            return;
        }
        self.tot.resident.rebalanced += 1;
        self.tot.resident.rebalanced_tokens += c.tokens as u64;
        self.rebalance.twins.insert(c.key, (c.home, c.to));
        // The home's own copy goes to its host tier: the relief starts now, and
        // the state still serves the turn from there if it comes back.
        if self.pools[DECODE].engines[c.home].demote(&c.key) {
            self.tot.resident.rebalance_demoted += 1;
        }
    }

    /// A turn of `rkey` was placed on decode rank `d`: the holder it did not
    /// take lets its copy go; a copy still crossing is released when it lands.
    pub(super) fn settle_twins(&mut self, rkey: &RetentionKey, d: usize) {
        if let Some(id) = self.rebalance.crossing.remove(rkey)
            && let Some(c) = self.rebalance.copies.get_mut(&id)
        {
            c.late = true;
        }
        let Some((home, to)) = self.rebalance.twins.remove(rkey) else {
            return;
        };
        let engines = &mut self.pools[DECODE].engines;
        if d == to {
            self.tot.resident.rebalance_used += 1;
            engines[home].forget(rkey);
        } else if d == home {
            self.tot.resident.rebalance_unused += 1;
            engines[to].forget(rkey);
        }
    }
}
