//! The response path of chain ids: a Responses answer's id (the JSON
//! object's `id`, every SSE event's `response.id`) becomes the chain id that
//! carries the request's session, as the answer streams by.
//!
//! The id is found in the answer's first bytes (held until it is, at most
//! [`ID_WINDOW`]); from then on every JSON string equal to it, `"<id>"`, is
//! replaced, chunk by chunk. A chunk that ends inside a possible occurrence
//! keeps those bytes (fewer than the quoted id) for the next chunk, so
//! memory stays bounded and an event never waits unless it was cut inside
//! the id. Host-free: the shell hands each callback's bytes over and writes
//! back what [`AnswerIds::feed`] returns.

use crate::read::chain::{ID_WINDOW, response_id};
use crate::read::chain_id::{self, MacKey};

/// What to do with one callback's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Hold them (pause): the id is not in them yet.
    Hold,
    /// Replace them with these.
    Write(Vec<u8>),
    /// Leave them as they are.
    Pass,
}

/// What one callback found, for the counters and the chain table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Nothing,
    /// The id was found and is being replaced (`tether_chain_wrapped`).
    Wrapped,
    /// The answer keeps the engine's id (`tether_chain_not_wrapped`): none
    /// in its first bytes, or `Some(id)`, one a chain id cannot carry (learn it instead).
    NotWrapped(Option<Vec<u8>>),
}

#[derive(Debug)]
enum State {
    Finding,
    Replacing(Box<Replacing>),
    Done,
}

/// The id found: what is replaced by what, and the bytes kept back.
#[derive(Debug)]
struct Replacing {
    /// Finds the quoted engine id (built once per answer).
    from: memchr::memmem::Finder<'static>,
    to: Vec<u8>,
    /// The end of the last chunk, a possible start of `from`.
    tail: Vec<u8>,
}

/// One answer's id rewrite.
#[derive(Debug)]
pub struct AnswerIds {
    tenant: Vec<u8>,
    session: Vec<u8>,
    state: State,
}

impl AnswerIds {
    pub fn new(tenant: Vec<u8>, session: Vec<u8>) -> Self {
        Self {
            tenant,
            session,
            state: State::Finding,
        }
    }

    /// False once nothing more will be rewritten (no need to read chunks).
    pub fn active(&self) -> bool {
        !matches!(self.state, State::Done)
    }

    /// One body callback: `bytes` is what the host holds — everything so
    /// far while held, else this chunk; `end` = the answer's last bytes.
    pub fn feed(&mut self, key: &MacKey, bytes: &[u8], end: bool) -> (Step, Found) {
        match &mut self.state {
            State::Done => (Step::Pass, Found::Nothing),
            State::Replacing(r) => {
                let Replacing { from, to, tail } = r.as_mut();
                (replace(from, to, tail, bytes, end).0, Found::Nothing)
            }
            State::Finding => self.find(key, bytes, end),
        }
    }

    fn find(&mut self, key: &MacKey, bytes: &[u8], end: bool) -> (Step, Found) {
        let window = bytes.get(..bytes.len().min(ID_WINDOW)).unwrap_or_default();
        let Some(engine) = response_id(window) else {
            if end || bytes.len() >= ID_WINDOW {
                self.state = State::Done;
                return (Step::Pass, Found::NotWrapped(None));
            }
            return (Step::Hold, Found::Nothing);
        };
        let Some(sealed) = chain_id::seal(key, &self.tenant, &self.session, &engine) else {
            self.state = State::Done;
            return (Step::Pass, Found::NotWrapped(Some(engine)));
        };
        let from = memchr::memmem::Finder::new(&quoted(&engine)).into_owned();
        let to = quoted(&sealed);
        let mut tail = Vec::new();
        let (step, hits) = replace(&from, &to, &mut tail, bytes, end);
        if hits == 0 {
            // Written with escapes the raw bytes do not match: left alone.
            self.state = State::Done;
            return (Step::Pass, Found::NotWrapped(Some(engine)));
        }
        self.state = State::Replacing(Box::new(Replacing { from, to, tail }));
        (step, Found::Wrapped)
    }

    /// At the answer's trailers: the bytes still kept back, to be sent.
    pub fn finish(&mut self) -> Vec<u8> {
        let kept = match &mut self.state {
            State::Replacing(r) => std::mem::take(&mut r.tail),
            State::Finding | State::Done => Vec::new(),
        };
        self.state = State::Done;
        kept
    }
}

fn quoted(id: &[u8]) -> Vec<u8> {
    crate::emit::unwrap::quoted(id)
}

/// Replaces every `from` in `tail ‖ bytes`, keeping back (in `tail`) an end
/// that may begin another `from` unless `end`; [`Step::Pass`] when nothing
/// changed. Also returns how many were replaced.
fn replace(
    finder: &memchr::memmem::Finder<'_>,
    to: &[u8],
    tail: &mut Vec<u8>,
    bytes: &[u8],
    end: bool,
) -> (Step, usize) {
    let from = finder.needle();
    // The usual chunk (a delta event): no id, no cut id, nothing kept: no copy.
    if tail.is_empty()
        && finder.find(bytes).is_none()
        && (end || kept_from(bytes, 0, from) == bytes.len())
    {
        return (Step::Pass, 0);
    }
    let had_tail = !tail.is_empty();
    let mut all = std::mem::take(tail);
    all.extend_from_slice(bytes);
    let mut out = Vec::new();
    let (mut at, mut hits) = (0, 0);
    for hit in finder.find_iter(&all) {
        out.extend_from_slice(all.get(at..hit).unwrap_or_default());
        out.extend_from_slice(to);
        at = hit + from.len();
        hits += 1;
    }
    let keep = if end {
        all.len()
    } else {
        kept_from(&all, at, from)
    };
    if hits == 0 && keep == all.len() && !had_tail {
        return (Step::Pass, 0);
    }
    out.extend_from_slice(all.get(at..keep).unwrap_or_default());
    *tail = all.get(keep..).unwrap_or_default().to_vec();
    (Step::Write(out), hits)
}

/// Where the kept-back end of `all` starts: the earliest position after
/// `after` (the last replacement) from which the rest is a proper prefix of
/// `from` (which begins with a quote); `all.len()` when there is none.
fn kept_from(all: &[u8], after: usize, from: &[u8]) -> usize {
    let lo = all
        .len()
        .saturating_sub(from.len().saturating_sub(1))
        .max(after);
    let window = all.get(lo..).unwrap_or_default();
    memchr::memchr_iter(b'"', window)
        .map(|i| lo + i)
        .find(|&p| all.get(p..).is_some_and(|rest| from.starts_with(rest)))
        .unwrap_or(all.len())
}

#[cfg(test)]
mod tests;
