//! Prefetch in tool gaps: when to bring a session's host-tier state back before it returns.
//!
//! A turn that ends at a retained prompt end of kind `tool` or `handoff` (the
//! session is waiting on a tool or a subagent, usually seconds) gets a plan: at
//! `end + early return − restore time − margin` the engine asks the cache to bring
//! the key's retention back from the host tier (`RetentionCache::prefetch`, which
//! takes only room free of retained and running state). The early return is the
//! rank's smoothed gap of that kind (`tether_engine::gaps`: mean − 2 × deviation,
//! RFC 6298 smoothing); before any gap of the kind was seen, the plan only
//! observes. A plan whose record is still on the device when it fires, or that
//! found no room, stays armed and is retried, oldest first, whenever a step
//! starts or ends (a retry that finds no room ends that round), until the record
//! expires or the session returns. No retry runs while a request that has arrived
//! waits for admission: free room goes to demand first.
//!
//! The copy uses the same host link as demand restores at lower priority: it
//! starts when the link is free of them, and a demand restore that starts while
//! prefetches are in flight or queued pushes each of them back by its own
//! duration (preemptive priority). A returning request whose prefetch copy is
//! still in flight waits for it, as a demand restore would.

use super::SimMs;
use crate::latency::LatencyModel;
use std::collections::{BTreeSet, HashMap};
use tether_engine::{
    MetadataOnly, PolicyConfig, PrefetchSkip, RetentionCache, RetentionKey, ReturnGaps, TurnKind,
};

/// Slack between a prefetch's expected arrival and the session's early return:
/// room for a demand restore or two on the host link before it.
pub const MARGIN_MS: f64 = 100.0;

/// Microseconds, the timers' unit (exact ordering for f64 simulated ms).
fn us(t: SimMs) -> u64 {
    (t.max(0.0) * 1000.0).ceil() as u64
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    /// When the turn ended (its last token).
    ended: SimMs,
    /// The retained prompt end's kind (the gap's kind).
    kind: TurnKind,
    /// When to try, µs (`None`: no gap of this kind seen yet; observe only).
    due: Option<u64>,
    /// The record's expiry, µs: the plan is forgotten then.
    forget: u64,
}

/// The engine's prefetch state. See the module docs.
#[derive(Debug, Default)]
pub(super) struct Prefetcher {
    gaps: ReturnGaps,
    plans: HashMap<RetentionKey, Plan>,
    /// Due times of the plans not yet tried, µs (the engine wakes for them).
    timers: BTreeSet<(u64, RetentionKey)>,
    /// Expiry times of the plans, µs (swept lazily; no wake-up).
    forgets: BTreeSet<(u64, RetentionKey)>,
    /// Plans past due, by due time: retried until they succeed or are forgotten.
    armed: BTreeSet<(u64, RetentionKey)>,
    /// Prefetch copies on the host link: when each lands.
    inflight: HashMap<RetentionKey, SimMs>,
    /// When the host link is free of prefetch copies.
    link_free_at: SimMs,
}

impl Prefetcher {
    /// A turn of `key` ended at `at` with its prompt end retained as `kind`.
    pub(super) fn turn_ended(
        &mut self,
        key: RetentionKey,
        kind: TurnKind,
        at: SimMs,
        cache: &RetentionCache,
        model: &LatencyModel,
    ) {
        self.drop_plan(&key);
        if !matches!(kind, TurnKind::Tool | TurnKind::Handoff) {
            return;
        }
        let Some(meta) = cache
            .device_record(&key)
            .map(|r| &r.meta)
            .or_else(|| cache.host().record(&key).map(|r| &r.meta))
        else {
            return;
        };
        let forget = meta.expires_ms.saturating_mul(1000);
        if forget <= us(at) {
            return;
        }
        let due = self.gaps.early_return_ms(kind).map(|early| {
            let t = at + early as f64 - model.restore_ms(meta.bytes) - MARGIN_MS;
            us(t.max(at)).min(forget)
        });
        let plan = Plan {
            ended: at,
            kind,
            due,
            forget,
        };
        if let Some(d) = due {
            self.timers.insert((d, key));
        }
        self.forgets.insert((forget, key));
        self.plans.insert(key, plan);
    }

    /// A request of `key` arrived at `arrival`: its gap is observed, its plan done.
    pub(super) fn returned(&mut self, key: &RetentionKey, arrival: SimMs) {
        if let Some(p) = self.plans.get(key).copied() {
            if arrival >= p.ended {
                self.gaps
                    .observe(p.kind, (arrival - p.ended).round() as u64);
            }
            self.drop_plan(key);
        }
    }

    /// When `key`'s prefetch copy lands, if one is still on the link after `now`.
    pub(super) fn take_inflight(&mut self, key: &RetentionKey, now: SimMs) -> Option<SimMs> {
        self.inflight.remove(key).filter(|&t| t > now)
    }

    /// A demand restore of `ms` takes the host link at `from`: prefetch copies
    /// landing after `from` wait for it.
    pub(super) fn yield_to(&mut self, from: SimMs, ms: f64) {
        for t in self.inflight.values_mut().filter(|t| **t > from) {
            *t += ms;
        }
        if self.link_free_at > from {
            self.link_free_at += ms;
        }
    }

    /// The next plan due, ms.
    pub(super) fn next_timer(&self) -> Option<SimMs> {
        self.timers.first().map(|(t, _)| *t as f64 / 1000.0)
    }

    /// Fires the timers due by `now` and, unless `demand_waits` (a request that has
    /// arrived is not admitted yet: room goes to it first), retries the armed plans;
    /// `demand_free_at` is when the host link is free of demand restores.
    pub(super) fn run(
        &mut self,
        now: SimMs,
        demand_waits: bool,
        demand_free_at: SimMs,
        cache: &mut RetentionCache,
        mover: &mut MetadataOnly,
        model: &LatencyModel,
    ) {
        self.inflight.retain(|_, t| *t > now);
        while let Some(&(t, key)) = self.forgets.first() {
            if t as f64 / 1000.0 > now {
                break;
            }
            self.forgets.pop_first();
            if self.plans.get(&key).is_some_and(|p| p.forget == t) {
                self.drop_plan(&key);
            }
        }
        while let Some(&(t, key)) = self.timers.first() {
            if t as f64 / 1000.0 > now {
                break;
            }
            self.timers.pop_first();
            self.armed.insert((t, key));
        }
        if demand_waits {
            return;
        }
        let mut done = Vec::new();
        for &(d, key) in &self.armed {
            match cache.prefetch(&key, now as u64, mover) {
                Ok(got) => {
                    let bytes = bytes_of(cache.config(), got.blocks, got.state);
                    let start = now.max(demand_free_at).max(self.link_free_at);
                    self.link_free_at = start + model.restore_ms(bytes);
                    self.inflight.insert(key, self.link_free_at);
                    done.push((d, key));
                }
                Err(PrefetchSkip::OnDevice) => {}
                Err(PrefetchSkip::NoRoom { .. }) => break,
                Err(_) => done.push((d, key)),
            }
        }
        for e in done {
            self.armed.remove(&e);
        }
    }

    fn drop_plan(&mut self, key: &RetentionKey) {
        if let Some(p) = self.plans.remove(key) {
            if let Some(d) = p.due {
                self.timers.remove(&(d, *key));
                self.armed.remove(&(d, *key));
            }
            self.forgets.remove(&(p.forget, *key));
        }
    }
}

/// Bytes a prefetch moves over the host link.
fn bytes_of(cfg: &PolicyConfig, blocks: usize, state: bool) -> u64 {
    blocks as u64 * cfg.block_bytes + u64::from(state) * cfg.state_bytes
}
