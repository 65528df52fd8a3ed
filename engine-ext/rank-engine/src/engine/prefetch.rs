//! Prefetch in tool gaps: when to bring a session's host-tier state back before it returns.
//!
//! Every turn that ends at a retained prompt end gets a plan, so the rank observes
//! the gap to the key's next arrival by the prompt end's kind
//! (`tether_engine::gaps`: RFC 6298 smoothing of mean and deviation). A `tool` or
//! `handoff` prompt end (the session waits on a tool or a subagent, usually
//! seconds) is also due for a prefetch at `end + early return − restore time −
//! margin`, the early return being its kind's mean − 2 × deviation; before any gap
//! of the kind was seen the plan only observes. From its due time the plan is
//! armed: when it fires and whenever the device's contents change (a request
//! admitted, a prompt computed, a request gone), the engine asks the cache to bring the
//! key's retention back from the host tier (`RetentionCache::prefetch`) — once: a
//! success disarms it, and so does the session becoming overdue (its turn ended
//! longer ago than the kind's mean + 4 × deviation), the record expiring or the
//! session returning. A plan whose record is still on the device, or that found no
//! room, stays armed. No attempt runs while a request that has arrived waits for
//! admission: room goes to demand first.
//!
//! Room (the cache's rule): free slots, expired retentions, and live retentions
//! this module says are expected back later ([`Prefetcher::expected_later`]),
//! offloaded only into free host room.
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

/// What the engine tells [`Prefetcher::run`] about the moment it runs at.
#[derive(Debug, Clone, Copy)]
pub(super) struct Moment {
    /// The engine's time.
    pub now: SimMs,
    /// The device's contents changed (a request admitted, a prompt computed, a
    /// request gone); a decode run's inner steps change nothing.
    pub changed: bool,
    /// A request that has arrived is not admitted yet.
    pub demand_waits: bool,
    /// When the host link is free of demand restores.
    pub demand_free_at: SimMs,
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
    /// Plans past due, by due time: tried until one succeeds, the session is
    /// overdue or the plan is forgotten.
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
        let prefetched = matches!(kind, TurnKind::Tool | TurnKind::Handoff);
        let due = self
            .gaps
            .early_return_ms(kind)
            .filter(|_| prefetched)
            .map(|early| {
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

    /// Fires the timers due by `at.now` and, when one fired or the device changed,
    /// unless demand waits (room goes to it first), tries the armed plans.
    pub(super) fn run(
        &mut self,
        at: Moment,
        cache: &mut RetentionCache,
        mover: &mut MetadataOnly,
        model: &LatencyModel,
    ) {
        let Moment {
            now,
            changed,
            demand_waits,
            demand_free_at,
        } = at;
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
        let mut fired = false;
        while let Some(&(t, key)) = self.timers.first() {
            if t as f64 / 1000.0 > now {
                break;
            }
            self.timers.pop_first();
            if self.plans.get(&key).is_some_and(|p| p.due == Some(t)) {
                self.armed.insert((t, key));
                fired = true;
            }
        }
        if demand_waits || !(changed || fired) {
            return;
        }
        let mut done = Vec::new();
        for &(d, key) in &self.armed {
            if self.overdue(&key, now) {
                done.push((d, key));
                continue;
            }
            let later = |k: &RetentionKey| self.expected_later(k, &key, now);
            match cache.prefetch(&key, now as u64, mover, &mut { later }) {
                Ok(got) => {
                    let bytes = bytes_of(cache.config(), got.blocks, got.state);
                    let start = now.max(demand_free_at).max(self.link_free_at);
                    self.link_free_at = start + model.restore_ms(bytes);
                    self.inflight.insert(key, self.link_free_at);
                    done.push((d, key));
                }
                Err(PrefetchSkip::OnDevice) => {}
                Err(PrefetchSkip::NoRoom { .. }) => {}
                Err(_) => done.push((d, key)),
            }
        }
        for e in done {
            self.armed.remove(&e);
        }
    }

    /// True when `key`'s session is overdue: its turn ended longer ago than its
    /// kind's mean + 4 × deviation (the plan stays, to observe the gap).
    fn overdue(&self, key: &RetentionKey, now: SimMs) -> bool {
        self.plans.get(key).is_some_and(|p| {
            self.gaps
                .overdue_ms(p.kind)
                .is_some_and(|o| now - p.ended > o as f64)
        })
    }

    /// The prefetch priority: whether `other`'s retention may yield to `target`'s
    /// prefetch at `now` — it is overdue (its turn ended longer ago than its kind's
    /// mean + 4 × deviation), or expected back (turn end + mean gap of its kind)
    /// after `target` is. A retention whose session is in flight, or whose kind has
    /// no observed gap yet, never yields.
    fn expected_later(&self, other: &RetentionKey, target: &RetentionKey, now: SimMs) -> bool {
        let expected = |k: &RetentionKey| {
            let p = self.plans.get(k)?;
            Some((
                p.ended,
                self.gaps.mean_ms(p.kind)?,
                self.gaps.overdue_ms(p.kind)?,
            ))
        };
        let (Some((ended, mean, overdue)), Some((t_ended, t_mean, _))) =
            (expected(other), expected(target))
        else {
            return false;
        };
        now - ended > overdue as f64 || ended + mean as f64 > t_ended + t_mean as f64
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

#[cfg(test)]
mod tests {
    use super::*;
    use tether_wire::HexId;

    fn key(s: u128) -> RetentionKey {
        RetentionKey {
            tenant: HexId(0),
            session: HexId(s),
            subagent: HexId(0),
        }
    }

    /// Tool gaps of exactly 2 s, user gaps of exactly 20 s (deviation decayed away).
    fn learned() -> Prefetcher {
        let mut p = Prefetcher::default();
        for _ in 0..100 {
            p.gaps.observe(TurnKind::Tool, 2_000);
            p.gaps.observe(TurnKind::User, 20_000);
        }
        p
    }

    fn plan(p: &mut Prefetcher, k: u128, kind: TurnKind, ended: SimMs) {
        let plan = Plan {
            ended,
            kind,
            due: None,
            forget: u64::MAX,
        };
        p.plans.insert(key(k), plan);
    }

    #[test]
    fn only_retentions_expected_back_later_or_overdue_yield() {
        let mut p = learned();
        let now = 10_000.0;
        plan(&mut p, 1, TurnKind::Tool, 9_000.0); // the target: back at ~11 s
        plan(&mut p, 2, TurnKind::User, 8_000.0); // back at ~28 s: later
        plan(&mut p, 3, TurnKind::Tool, 9_500.0); // back at ~11.5 s: later
        plan(&mut p, 4, TurnKind::Tool, 8_500.0); // back at ~10.5 s: sooner
        plan(&mut p, 5, TurnKind::Tool, 7_000.0); // 3 s since its end: overdue (2 s + 4 × 0)
        let yields = |k| p.expected_later(&key(k), &key(1), now);
        assert!(yields(2));
        assert!(yields(3));
        assert!(!yields(4));
        assert!(yields(5));
        assert!(
            !yields(6),
            "a key with no plan (its request in flight) never yields"
        );
        assert!(!Prefetcher::default().expected_later(&key(2), &key(1), now));
    }
}
