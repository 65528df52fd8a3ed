//! The response path of a Responses request keyed by its chain: its answer's
//! id is replaced by a chain id as it streams by ([`crate::emit::answer_id`]),
//! or — with `chains.wrap` off, a compressed answer, or an id a chain id
//! cannot carry — learned into this gateway's chain table.

use super::chain_store::{Learned, Learner, table};
use super::host;
use crate::emit::answer_id::{AnswerIds, Found, Step};
use crate::emit::metrics::Fixed;
use crate::read::chain::ChainConfig;
use crate::read::encoding::{self, ContentEncoding};
use proxy_wasm::types::{Action, BufferType, MapType};

/// How one answer carries its chain on.
#[derive(Debug)]
pub enum Answer {
    Wrap { ids: AnswerIds, session: Vec<u8> },
    Learn(Learner),
}

impl Answer {
    /// At the response headers of a request keyed by its chain (`tenant`,
    /// `session`): how its answer carries the chain on, `None` when it
    /// cannot (not 2xx, or no body). A rewritten answer changes length, so
    /// its `content-length` is removed (Envoy then streams it chunked).
    pub fn start(
        cfg: ChainConfig,
        tenant: Vec<u8>,
        session: Vec<u8>,
        end_of_stream: bool,
        count: &dyn Fn(Fixed),
    ) -> Option<Answer> {
        let wanted = |n: &[u8]| n == b":status" || n == b"content-encoding";
        let headers = host::header_pairs(MapType::HttpResponseHeaders, wanted).unwrap_or_default();
        let ok = headers
            .iter()
            .any(|(n, v)| n == ":status" && v.first() == Some(&b'2'));
        if end_of_stream || !ok {
            return None;
        }
        let coding = encoding::of(&headers);
        if cfg.wrap && coding == ContentEncoding::Identity {
            if host::remove_header(MapType::HttpResponseHeaders, "content-length").is_err() {
                count(Fixed::HostError);
            }
            return Some(Answer::Wrap {
                ids: AnswerIds::new(tenant, session.clone()),
                session,
            });
        }
        if cfg.wrap {
            count(Fixed::ChainNotWrapped);
        }
        let mut learner = Learner::new(session);
        learner.coding = coding;
        Some(Answer::Learn(learner))
    }

    /// One response-body callback (`size` bytes held, `end` of stream): the
    /// action, and whether this answer needs no more callbacks.
    pub fn chunk(
        &mut self,
        cfg: ChainConfig,
        size: usize,
        end: bool,
        count: &dyn Fn(Fixed),
    ) -> (Action, bool) {
        let (ids, session) = match self {
            Answer::Learn(learner) => {
                return match learner.chunk(cfg, size, end) {
                    Learned::More => (Action::Continue, false),
                    Learned::Done(true) => {
                        count(Fixed::ChainLearned);
                        (Action::Continue, true)
                    }
                    Learned::Done(false) => {
                        count(Fixed::HostError);
                        (Action::Continue, true)
                    }
                    Learned::GaveUp => (Action::Continue, true),
                };
            }
            Answer::Wrap { ids, session } => (ids, session),
        };
        let bytes = if size == 0 {
            Vec::new()
        } else {
            match host::get_buffer(BufferType::HttpResponseBody, 0, size) {
                Ok(b) => b,
                Err(_) => {
                    count(Fixed::HostError);
                    return (Action::Continue, true);
                }
            }
        };
        let (step, found) = ids.feed(&cfg.key, &bytes, end);
        match found {
            Found::Nothing => {}
            Found::Wrapped => count(Fixed::ChainWrapped),
            Found::NotWrapped(engine) => {
                count(Fixed::ChainNotWrapped);
                if let Some(e) = engine
                    && table(cfg).learn(&e, session)
                {
                    count(Fixed::ChainLearned);
                }
            }
        }
        let action = match step {
            Step::Hold => Action::Pause,
            Step::Pass => Action::Continue,
            Step::Write(out) => {
                if host::set_buffer(BufferType::HttpResponseBody, 0, size, &out).is_err() {
                    count(Fixed::HostError);
                }
                Action::Continue
            }
        };
        (action, !ids.active())
    }

    /// At the response trailers: the bytes a rewrite still kept back go out.
    pub fn trailers(&mut self, count: &dyn Fn(Fixed)) {
        if let Answer::Wrap { ids, .. } = self {
            let kept = ids.finish();
            if !kept.is_empty()
                && host::set_buffer(BufferType::HttpResponseBody, 0, 0, &kept).is_err()
            {
                count(Fixed::HostError);
            }
        }
    }
}
