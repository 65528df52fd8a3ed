//! Ordered index of retention records for eviction: expired first by expiry, then
//! least recently used.
//!
//! Both orders are fixed while a record is untouched (see [`RecordMeta::priority`]),
//! so picking a victim is a look at the front of a `BTreeSet`. Callers must remove a
//! record before changing its expiry or last use and insert it again afterwards.

use crate::config::Millis;
use crate::marker::RetentionKey;
use crate::record::RecordMeta;
use std::collections::{BTreeSet, HashMap};

/// Why a record was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Its interval ran out.
    Expired,
    /// Live, and the least recently used.
    Live,
}

/// The two eviction orders over one set of records.
#[derive(Debug, Default)]
pub(crate) struct VictimIndex {
    by_expiry: BTreeSet<(Millis, RetentionKey)>,
    by_prio: BTreeSet<(Millis, RetentionKey)>,
    entries: HashMap<RetentionKey, (Millis, Millis)>,
}

impl VictimIndex {
    /// Indexes a record (replacing any entry of its key).
    pub(crate) fn insert(&mut self, m: &RecordMeta) {
        self.remove(&m.key);
        let p = m.priority();
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
        below: Option<Millis>,
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
            .take_while(|(p, _)| below.is_none_or(|b| *p < b))
            .find(|(_, k)| eligible(k))
            .map(|(_, k)| (Class::Live, *k))
    }

    /// Whether the record of `key` has expired at `now`.
    pub(crate) fn class_of(&self, key: &RetentionKey, now: Millis) -> Class {
        match self.entries.get(key) {
            Some((e, _)) if *e <= now => Class::Expired,
            _ => Class::Live,
        }
    }

    /// The least recently used record, expired or not.
    pub(crate) fn least_recent(&self) -> Option<RetentionKey> {
        self.by_prio.first().map(|(_, k)| *k)
    }

    /// The records expired at `now`, earliest expiry first.
    pub(crate) fn expired(&self, now: Millis) -> Vec<RetentionKey> {
        self.by_expiry
            .iter()
            .take_while(|(e, _)| *e <= now)
            .map(|(_, k)| *k)
            .collect()
    }

    /// Every record, least recently used first.
    pub(crate) fn by_recency(&self) -> impl Iterator<Item = RetentionKey> + '_ {
        self.by_prio.iter().map(|(_, k)| *k)
    }

    /// True when the index holds exactly these records with their current orders.
    pub(crate) fn matches<'a>(&self, metas: impl Iterator<Item = &'a RecordMeta>) -> bool {
        let mut n = 0;
        for m in metas {
            n += 1;
            if self.entries.get(&m.key) != Some(&(m.expires_ms, m.priority())) {
                return false;
            }
        }
        n == self.entries.len() && n == self.by_expiry.len() && n == self.by_prio.len()
    }
}
