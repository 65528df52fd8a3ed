//! The Responses chain table's slots in Envoy shared data (one table per
//! Envoy process, seen by every worker's VM), and the response-path reader
//! that learns each answer's id ([`crate::read::chain`]).

use super::host;
use crate::read::chain::{self, ChainConfig, SlotStore, Table};
use crate::read::encoding::ContentEncoding;
use proxy_wasm::types::BufferType;

/// Shared data as a [`SlotStore`].
#[derive(Debug, Clone, Copy)]
pub struct SharedSlots;

impl SlotStore for SharedSlots {
    fn get(&self, slot: u32) -> Option<Vec<u8>> {
        host::get_shared(&chain::slot_key(slot)).ok()?.0
    }

    fn set(&self, slot: u32, value: &[u8]) -> bool {
        // Last writer wins: a lost race only costs one continuation its hit.
        host::set_shared(&chain::slot_key(slot), value, 0).is_ok()
    }
}

/// The table now.
pub fn table(cfg: ChainConfig) -> Table<'static, SharedSlots> {
    Table {
        store: &SharedSlots,
        cfg,
        now_ms: host::now_ms().unwrap_or(0),
    }
}

/// A Responses answer whose id is still to be learned under `session`.
#[derive(Debug)]
pub struct Learner {
    pub session: Vec<u8>,
    /// The answer's `content-encoding` (set from its headers).
    pub coding: ContentEncoding,
    /// The answer's first bytes so far (up to [`chain::ID_WINDOW`]).
    seen: Vec<u8>,
}

/// What one response-body callback did to a learner.
#[derive(Debug, PartialEq, Eq)]
pub enum Learned {
    /// Keep reading.
    More,
    /// Written to the table (true) or the host refused (false).
    Done(bool),
    /// No id in the first bytes, or the answer ended.
    GaveUp,
}

impl Learner {
    pub fn new(session: Vec<u8>) -> Self {
        Self {
            session,
            coding: ContentEncoding::Identity,
            seen: Vec::new(),
        }
    }

    /// Reads this callback's chunk (`size` bytes) and learns the id once seen.
    pub fn chunk(&mut self, cfg: ChainConfig, size: usize, end_of_stream: bool) -> Learned {
        let want = size.min(chain::ID_WINDOW.saturating_sub(self.seen.len()));
        if want > 0
            && let Ok(bytes) = host::get_buffer(BufferType::HttpResponseBody, 0, want)
        {
            self.seen.extend_from_slice(&bytes);
        }
        match chain::coded_response_id(self.coding, &self.seen) {
            Some(id) => Learned::Done(table(cfg).learn(&id, &self.session)),
            None if end_of_stream || self.seen.len() >= chain::ID_WINDOW => Learned::GaveUp,
            None => Learned::More,
        }
    }
}
