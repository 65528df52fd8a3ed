//! The plan for one request: what was read, where it goes, the body edit and
//! the refusal, with the outputs and counters it yields — what the shell
//! applies, and what native tests, tools and benchmarks compare against.

use super::markers;
use super::metrics::{Counter, Fixed};
use super::rewrite::Edit;
use crate::config::Config;
use crate::config::outputs::{HASHABLE_KEY, ORIGINAL_DST_KEY, Output};
use crate::place::{LoadRead, Placed, Pools, Prefill};
use crate::read::chain::ChainFrom;
use crate::read::identity::{KeySource, hex16};
use crate::read::{Reading, Reject};

/// Everything decided for one routed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub read: Reading,
    pub placed: Placed,
    /// Body edit at end of stream (salting / engine body fields).
    pub edit: Option<Edit>,
    /// The client's `kv_transfer_params` held its own `tether` member, which
    /// the edit removes (counter `tether_spoofed_body_marker_removed`).
    pub spoofed_markers: bool,
    /// Refuse the request with this local reply (status, body): salting or
    /// body markers are on and the body cannot be rewritten.
    pub reject: Option<Reject>,
}

impl Plan {
    /// The request headers (header path) or their filter-state copies (body
    /// path), each handed to `emit` from stack buffers, in a stable order.
    pub fn for_each_header(
        &self,
        cfg: &Config,
        pools: &Pools,
        emit: impl FnMut(&'static str, &[u8]),
    ) {
        markers::for_each_request_header(cfg, pools, &self.read, &self.placed, emit);
    }

    /// [`Plan::for_each_header`] collected.
    pub fn request_headers(&self, cfg: &Config, pools: &Pools) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(8);
        self.for_each_header(cfg, pools, |name, value| {
            out.push((name, String::from_utf8_lossy(value).into_owned()));
        });
        out
    }

    /// The Envoy filter-state objects (both paths): the routing key for a
    /// `hash_policy` on filter state, the primary endpoint for `ORIGINAL_DST`.
    pub fn for_each_filter_state(
        &self,
        cfg: &Config,
        pools: &Pools,
        mut emit: impl FnMut(&'static str, &str),
    ) {
        if cfg.outputs.has(Output::HashableString) {
            emit(HASHABLE_KEY, &hex16(self.read.key));
        }
        if cfg.outputs.has(Output::OriginalDst)
            && let Some(e) = self
                .placed
                .primary()
                .and_then(|i| pools.decode.endpoints().get(i))
        {
            emit(ORIGINAL_DST_KEY, &e.address);
        }
    }

    /// `x-tether-debug` response value.
    pub fn debug_value(&self, pools: &Pools) -> String {
        markers::debug_value(pools, &self.read, &self.placed)
    }

    /// The counters this decision bumps, one call per count. A refused
    /// request counts only as refused. What applying the plan does (a body
    /// rewritten, a host error) the shell counts.
    pub fn for_each_counter(&self, cfg: &Config, mut count: impl FnMut(Counter)) {
        if self.reject.is_some() {
            count(Counter::Fixed(Fixed::Rejected));
            return;
        }
        let r = &self.read;
        count(Counter::Fixed(if r.header_path {
            Fixed::HeaderPath
        } else {
            Fixed::BodyPath
        }));
        match &r.identity.source {
            KeySource::Fallback(reason) => {
                count(Counter::FallbackSource);
                count(Counter::Fallback(*reason));
            }
            KeySource::Head => count(Counter::Head),
            KeySource::Source(i) => count(Counter::Source(*i)),
            KeySource::Chain(ChainFrom::Id) => count(Counter::Fixed(Fixed::ChainCarried)),
            KeySource::Chain(ChainFrom::Table) => count(Counter::Fixed(Fixed::ChainHit)),
            KeySource::Chain(ChainFrom::Unseen) => count(Counter::Fixed(Fixed::ChainUnseen)),
            // Counted below, whatever keyed the request.
            KeySource::Chain(ChainFrom::Forged) => {}
        }
        if r.chain.forged {
            count(Counter::Fixed(Fixed::ChainForged));
        }
        if r.decoded {
            count(Counter::Fixed(Fixed::BodyDecompressed));
        }
        for _ in 0..r.bad_headers {
            count(Counter::Fixed(Fixed::BadHeader));
        }
        if !r.header_path && r.turn.is_some() && !r.stats.full && cfg.outputs.has(Output::Turn) {
            count(Counter::Fixed(Fixed::TurnNotCounted));
        }
        if r.stats.middle {
            count(Counter::Fixed(Fixed::BodyMiddleRead));
        }
        if let Some(i) = self.placed.primary() {
            count(Counter::Pick(i));
        }
        if self.placed.ejected {
            count(Counter::Fixed(Fixed::PrimaryEjected));
        }
        if self.placed.spilled {
            count(Counter::Fixed(Fixed::LoadSpilled));
        }
        match self.placed.load {
            LoadRead::Off | LoadRead::Fresh => {}
            LoadRead::Held => count(Counter::Fixed(Fixed::LoadHeld)),
            LoadRead::Blind => count(Counter::Fixed(Fixed::LoadBlind)),
        }
        match self.placed.prefill {
            Prefill::Off => {}
            Prefill::Local => count(Counter::Fixed(Fixed::PdLocal)),
            Prefill::Remote(_) => count(Counter::Fixed(Fixed::PdDisaggregated)),
            // A migration: counted as `tether_residency_migrate` below.
            Prefill::Holder(_) | Prefill::Pull(_) => {}
        }
        if let Some(h) = self.placed.how {
            count(Counter::Fixed(Fixed::of_how(h)));
            // Every candidate's summary fresh, none lists the key, yet the
            // markers say an earlier turn was answered: the view lags.
            if h == tether_placement::How::Least && r.turn.is_some_and(|t| t.returning(r.api)) {
                count(Counter::Fixed(Fixed::ResidencyUnseen));
            }
        }
    }
}
