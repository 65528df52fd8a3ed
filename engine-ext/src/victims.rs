//! Ordered index of retention records for eviction: expired first by expiry, then by value.
//!
//! Both orders are fixed while a record is untouched (see [`crate::value::priority`]),
//! so picking a victim is a look at the front of a `BTreeSet`. Callers must remove a
//! record before changing its expiry or last use and insert it again afterwards.

use crate::config::{Millis, PolicyConfig};
use crate::marker::RetentionKey;
use crate::record::RecordMeta;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

/// A priority with a total order (`f64::total_cmp`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prio(pub f64);

impl PartialEq for Prio {
    fn eq(&self, o: &Self) -> bool {
        self.0.total_cmp(&o.0) == Ordering::Equal
    }
}
impl Eq for Prio {}
impl PartialOrd for Prio {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Prio {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// Why a record was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Its interval ran out.
    Expired,
    /// Live, and the least valuable.
    Live,
}

/// The two eviction orders over one set of records.
#[derive(Debug, Default)]
pub(crate) struct VictimIndex {
    by_expiry: BTreeSet<(Millis, RetentionKey)>,
    by_prio: BTreeSet<(Prio, RetentionKey)>,
    entries: HashMap<RetentionKey, (Millis, Prio)>,
}

impl VictimIndex {
    /// Indexes a record (replacing any entry of its key).
    pub(crate) fn insert(&mut self, cfg: &PolicyConfig, m: &RecordMeta) {
        self.remove(&m.key);
        let p = Prio(m.priority(cfg));
        self.by_expiry.insert((m.expires_ms, m.key));
        self.by_prio.insert((p, m.key));
        self.entries.insert(m.key, (m.expires_ms, p));
    }

    /// Forgets a record.
    pub(crate) fn remove(&mut self, key: &RetentionKey) {
        if let Some((e, p)) = self.entries.remove(key) {
            self.by_expiry.remove(&(e, *key));
            self.by_prio.remove(&(p, *key));
        }
    }

    /// The next victim among records accepted by `eligible`: the earliest expired one,
    /// else the lowest priority one below `below` (if given).
    pub(crate) fn pick(
        &self,
        now: Millis,
        below: Option<f64>,
        mut eligible: impl FnMut(&RetentionKey) -> bool,
    ) -> Option<(Class, RetentionKey)> {
        let expired = self
            .by_expiry
            .iter()
            .take_while(|(e, _)| *e <= now)
            .find(|(_, k)| eligible(k));
        if let Some((_, k)) = expired {
            return Some((Class::Expired, *k));
        }
        self.by_prio
            .iter()
            .take_while(|(p, _)| below.is_none_or(|b| p.0 < b))
            .find(|(_, k)| eligible(k))
            .map(|(_, k)| (Class::Live, *k))
    }

    /// True when the index holds exactly these records with their current orders.
    pub(crate) fn matches<'a>(
        &self,
        cfg: &PolicyConfig,
        metas: impl Iterator<Item = &'a RecordMeta>,
    ) -> bool {
        let mut n = 0;
        for m in metas {
            n += 1;
            if self.entries.get(&m.key) != Some(&(m.expires_ms, Prio(m.priority(cfg)))) {
                return false;
            }
        }
        n == self.entries.len() && n == self.by_expiry.len() && n == self.by_prio.len()
    }
}
