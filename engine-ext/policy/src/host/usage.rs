//! Where the host tier's bytes go: each record's written bytes, counted by how the record ended.
//!
//! A record's *written* bytes are the payload bytes its offload stored new (a
//! payload another record already held is shared and charged to the first writer),
//! so the classes below add up to every byte the tier ever wrote. Each record is, by
//! the time it ends (or is read while still held), one of: *restored* (a request
//! restored from it), *returned unused* (its key came back while it was held and did
//! not restore from it — for a hybrid model, the next prompt diverged before its
//! snapshot's boundary), or *never returned* (its key did not come back while it was
//! held: a conversation that ended, or one that came back only after it left).

/// How a host record ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Replaced by its key's next prompt end.
    Superseded,
    /// Evicted to make room for another record.
    Evicted,
    /// Dropped with a payload that failed its checksum.
    Dropped,
}

/// What became of a record's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    /// A request restored from it.
    Restored = 0,
    /// Its key came back while it was held and did not restore from it.
    ReturnedUnused = 1,
    /// Its key did not come back while it was held.
    NeverReturned = 2,
}

/// Records and written bytes of one (fate, use) class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Records.
    pub records: u64,
    /// Bytes their offloads wrote.
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, bytes: u64) {
        self.records += 1;
        self.bytes += bytes;
    }

    fn merge(&mut self, o: &Tally) {
        self.records += o.records;
        self.bytes += o.bytes;
    }
}

/// The host tier's byte accounting ([`crate::host::HostTier::usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostUsage {
    /// Every record offloaded, with the bytes written for it.
    pub written: Tally,
    /// Linear-state snapshots written (hybrid models).
    pub states_written: u64,
    /// Records superseded by their key's next prompt end, by [restored, returned
    /// unused, never returned] (a superseded record's key has returned, so the last
    /// stays empty).
    pub superseded: [Tally; 3],
    /// Records evicted for room, by the same classes.
    pub evicted: [Tally; 3],
    /// Records dropped with a corrupt payload, by the same classes.
    pub dropped: [Tally; 3],
    /// Records still held when read, by the same classes.
    pub resident: [Tally; 3],
}

impl HostUsage {
    /// A record of `bytes` written bytes ended with `fate`.
    pub(crate) fn ended(&mut self, fate: Fate, how: Use, bytes: u64) {
        let classes = match fate {
            Fate::Superseded => &mut self.superseded,
            Fate::Evicted => &mut self.evicted,
            Fate::Dropped => &mut self.dropped,
        };
        classes[how as usize].add(bytes);
    }

    /// A record still held.
    pub(crate) fn held(&mut self, how: Use, bytes: u64) {
        self.resident[how as usize].add(bytes);
    }

    /// Sums another rank's accounting into this one.
    pub fn merge(&mut self, o: &HostUsage) {
        self.written.merge(&o.written);
        self.states_written += o.states_written;
        for (a, b) in [
            (&mut self.superseded, &o.superseded),
            (&mut self.evicted, &o.evicted),
            (&mut self.dropped, &o.dropped),
            (&mut self.resident, &o.resident),
        ] {
            for (x, y) in a.iter_mut().zip(b) {
                x.merge(y);
            }
        }
    }

    /// Records restored from, whatever their fate.
    pub fn used(&self) -> Tally {
        let mut t = Tally::default();
        for pair in [
            &self.superseded,
            &self.evicted,
            &self.dropped,
            &self.resident,
        ] {
            t.merge(&pair[0]);
        }
        t
    }

    /// The classes as (name, tally) rows for a report, unused ones first.
    pub fn rows(&self) -> [(&'static str, Tally); 11] {
        let (s, e, d, r) = (
            &self.superseded,
            &self.evicted,
            &self.dropped,
            &self.resident,
        );
        [
            ("evicted, never returned", e[2]),
            ("held, never returned", r[2]),
            ("dropped, never returned", d[2]),
            ("superseded, unused", s[1]),
            ("evicted, returned unused", e[1]),
            ("held, returned unused", r[1]),
            ("dropped, returned unused", d[1]),
            ("superseded, restored", s[0]),
            ("evicted, restored", e[0]),
            ("held, restored", r[0]),
            ("dropped, restored", d[0]),
        ]
    }
}
