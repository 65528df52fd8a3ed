//! The twin memory: for each key this rank copied out (as its home) or
//! adopted (as the target), the other rank holding the same state, so that
//! whichever serves the key's returning turn can tell the other to let its
//! copy go. Bounded: past its capacity the oldest entry is dropped, which
//! only leaves that twin's copy to expire on its own.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use tether_engine::{BlockHash, RetentionKey};

/// Which side of a copy this rank is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// This rank retained the state and copied it out.
    Home,
    /// This rank adopted the state from its home.
    Target,
}

/// The other holder of a key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Twin {
    pub peer: SocketAddr,
    pub side: Side,
    /// The copied chain's last block: a forget names it, so that a newer
    /// state of the key on the twin is never let go for an older one.
    pub last: BlockHash,
    /// The copy has landed (else it is crossing).
    pub landed: bool,
    /// The key's returning turn came here while the copy was crossing: tell
    /// the twin to forget once the copy ends.
    pub returned: bool,
}

/// What to do when a key's returning turn is admitted here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTurn {
    /// No twin: nothing.
    Nothing,
    /// Tell `Twin::peer` to forget now.
    Forget(Twin),
    /// The copy is crossing: marked, settled when it ends.
    Deferred,
}

/// The bounded table.
#[derive(Debug)]
pub struct Twins {
    cap: usize,
    next: u64,
    by_key: HashMap<RetentionKey, (Twin, u64)>,
    /// Insertion order (entries replaced or removed are skipped lazily).
    order: VecDeque<(u64, RetentionKey)>,
}

impl Twins {
    /// Holds at most `cap` keys (≥ 1).
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            next: 0,
            by_key: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn get(&self, key: &RetentionKey) -> Option<Twin> {
        self.by_key.get(key).map(|(t, _)| *t)
    }

    /// Starts a copy of `key`'s chain ending at `last` with `peer`
    /// (crossing), replacing any entry.
    pub fn start(&mut self, key: RetentionKey, peer: SocketAddr, side: Side, last: BlockHash) {
        while self.by_key.len() >= self.cap && !self.by_key.contains_key(&key) {
            let Some((seq, k)) = self.order.pop_front() else {
                break;
            };
            if self.by_key.get(&k).is_some_and(|(_, s)| *s == seq) {
                self.by_key.remove(&k);
            }
        }
        let seq = self.next;
        self.next += 1;
        let twin = Twin {
            peer,
            side,
            last,
            landed: false,
            returned: false,
        };
        self.by_key.insert(key, (twin, seq));
        self.order.push_back((seq, key));
        // Keep the order queue near the table's size when keys are replaced often.
        if self.order.len() > 2 * self.cap {
            let live = &self.by_key;
            self.order
                .retain(|(s, k)| live.get(k).is_some_and(|(_, x)| x == s));
        }
    }

    /// The copy of `key` ended: `ok` it landed. `Some(twin)` when the key's
    /// turn returned meanwhile, so `twin.peer` must be told to forget (the
    /// entry is gone); a failed copy removes the entry.
    pub fn ended(&mut self, key: &RetentionKey, ok: bool) -> Option<Twin> {
        let (t, _) = self.by_key.get_mut(key)?;
        if !ok {
            self.by_key.remove(key);
            return None;
        }
        if t.returned {
            let t = *t;
            self.by_key.remove(key);
            return Some(t);
        }
        t.landed = true;
        None
    }

    /// A turn of `key` was admitted here.
    pub fn on_turn(&mut self, key: &RetentionKey) -> OnTurn {
        let Some((t, _)) = self.by_key.get_mut(key) else {
            return OnTurn::Nothing;
        };
        if !t.landed {
            t.returned = true;
            return OnTurn::Deferred;
        }
        let t = *t;
        self.by_key.remove(key);
        OnTurn::Forget(t)
    }

    /// The twin forgot its copy or told this rank to: nothing to settle.
    pub fn remove(&mut self, key: &RetentionKey) -> Option<Twin> {
        self.by_key.remove(key).map(|(t, _)| t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_wire::HexId;

    fn key(n: u128) -> RetentionKey {
        RetentionKey {
            tenant: HexId(0),
            session: HexId(n),
            subagent: HexId(0),
        }
    }

    fn at(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    #[test]
    fn a_landed_copy_is_settled_by_the_returning_turn() {
        let mut t = Twins::new(8);
        t.start(key(1), at(2), Side::Home, BlockHash(1));
        assert_eq!(t.ended(&key(1), true), None);
        match t.on_turn(&key(1)) {
            OnTurn::Forget(x) => assert_eq!((x.peer, x.side), (at(2), Side::Home)),
            o => panic!("{o:?}"),
        }
        assert_eq!(t.on_turn(&key(1)), OnTurn::Nothing, "settled once");
    }

    #[test]
    fn a_turn_during_the_copy_is_settled_when_it_lands_and_a_failed_copy_is_dropped() {
        let mut t = Twins::new(8);
        t.start(key(1), at(2), Side::Target, BlockHash(1));
        assert_eq!(t.on_turn(&key(1)), OnTurn::Deferred);
        assert_eq!(t.ended(&key(1), true).map(|x| x.peer), Some(at(2)));
        assert!(t.is_empty());
        t.start(key(2), at(3), Side::Home, BlockHash(2));
        assert_eq!(t.ended(&key(2), false), None);
        assert_eq!(t.on_turn(&key(2)), OnTurn::Nothing);
    }

    #[test]
    fn the_oldest_key_goes_past_the_capacity() {
        let mut t = Twins::new(2);
        t.start(key(1), at(1), Side::Home, BlockHash(1));
        t.start(key(2), at(1), Side::Home, BlockHash(2));
        t.start(key(1), at(5), Side::Home, BlockHash(1)); // replaced: now the newest
        t.start(key(3), at(1), Side::Home, BlockHash(3));
        assert_eq!(t.len(), 2);
        assert!(t.get(&key(2)).is_none(), "the oldest left");
        assert_eq!(t.get(&key(1)).map(|x| x.peer), Some(at(5)));
        for i in 10..1000 {
            t.start(key(i), at(1), Side::Home, BlockHash(i));
        }
        assert_eq!(t.len(), 2);
        assert!(t.order.len() <= 5);
    }
}
