//! Counter names (proxy-wasm metrics; Envoy shows them in `/stats/prometheus`,
//! see `docs/gateway.md` for the exported names).

use crate::config::Config;
use crate::read::Reason;

/// Prefix of every tether counter.
pub const PREFIX: &str = "tether_";

/// Replaces every byte outside `[a-z0-9_]` with `_` (Prometheus-safe names).
pub fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// One counter per routed request, by the source that produced the key.
pub fn key_source(label: &str) -> String {
    format!("{PREFIX}key_source_{}", sanitize(label))
}

/// One counter per fallback reason.
pub fn fallback(r: Reason) -> String {
    format!("{PREFIX}fallback_{}", r.name())
}

/// Picks per endpoint (pick mode).
pub fn pick(address: &str) -> String {
    format!("{PREFIX}pick_{}", sanitize(address))
}

/// Fixed counters: (name, meaning).
pub const FIXED: &[(&str, &str)] = &[
    (
        "tether_requests_header_path",
        "decided in the header callback",
    ),
    ("tether_requests_body_path", "decided in the body callback"),
    ("tether_requests_untouched", "unknown path, passed through"),
    (
        "tether_bad_header",
        "identity header present but unusable (skipped)",
    ),
    (
        "tether_spoofed_header_removed",
        "client-sent internal header removed",
    ),
    (
        "tether_spoofed_body_marker_removed",
        "client-sent kv_transfer_params.tether removed from the body",
    ),
    (
        "tether_turn_not_counted",
        "body over turn_count_max_bytes: x-tether-turn omitted",
    ),
    (
        "tether_body_middle_read",
        "a needed value sat in the middle: whole body read",
    ),
    (
        "tether_body_rewritten",
        "body rewritten (cache_salt / session_id / routed_dp_rank / kv_transfer_params)",
    ),
    (
        "tether_rejected",
        "refused: the body must be rewritten (cache_salt / kv_transfer_params) and could not be",
    ),
    ("tether_host_error", "a host call failed (value not set)"),
    (
        "tether_load_poll_ok",
        "a rank's /load reply read into the load view",
    ),
    (
        "tether_load_poll_bad",
        "a rank's /load reply unusable (status, size, not a load report; logged)",
    ),
    (
        "tether_load_poll_failed",
        "a /load poll could not be sent (unknown cluster, host refusal)",
    ),
    (
        "tether_load_spilled",
        "a key placed off its primary: the primary is over the load bound",
    ),
    (
        "tether_load_held",
        "a decision read some endpoint's last /load report older than load.max_age_ms beside fresh ones",
    ),
    (
        "tether_load_blind",
        "a pick-mode decision with load configured found no decode endpoint's /load report within load.max_age_ms: the plain rendezvous pick",
    ),
    (
        "tether_pd_disaggregated",
        "prefill sent to a prefill endpoint (x-prefiller-host-port)",
    ),
    (
        "tether_pd_local",
        "P/D on, prefilled on the decode endpoint (expected uncached under the threshold)",
    ),
    (
        "tether_served_by_fallback",
        "pick mode: answered by an endpoint other than the one listed first (after a retry)",
    ),
    (
        "tether_primary_ejected",
        "pick mode: a key's primary was ejected, the request listed its fallbacks first",
    ),
    (
        "tether_endpoint_ejected",
        "pick mode: an endpoint failed `eject.failures` times in a row and was taken out",
    ),
    (
        "tether_residency_stay",
        "residency: to the candidate that holds the key's state",
    ),
    (
        "tether_residency_least",
        "residency: no candidate holds the key, to the least loaded candidate",
    ),
    (
        "tether_residency_migrate",
        "residency: holder over the bound, moved with its state (prefill leg on the old home)",
    ),
    (
        "tether_residency_recompute",
        "residency: holder over the bound, moved and recomputed (transfer costs more)",
    ),
    (
        "tether_residency_bounded",
        "residency: some candidate's summary unknown or stale, bounded-load pick",
    ),
    (
        "tether_residency_unseen",
        "residency: a returning turn (turn markers) that no candidate's fresh summary shows: placed on a view that has not caught up",
    ),
    (
        "tether_residency_bad_version",
        "a rank's residency summary has an unknown version (not used; logged)",
    ),
    (
        "tether_residency_bad_too_many",
        "a rank's residency summary lists more than 16384 entries (not used; logged)",
    ),
    (
        "tether_residency_bad_shape",
        "a rank's residency summary is not 16/8/1 hex digits per entry (not used; logged)",
    ),
    (
        "tether_residency_bad_unsorted",
        "a rank's residency summary keys are not strictly ascending (not used; logged)",
    ),
    (
        "tether_body_decompressed",
        "a gzip/deflate/zstd request body was decoded and read",
    ),
    (
        "tether_chain_hit",
        "a Responses continuation of a plain engine id took the key this gateway learned for it",
    ),
    (
        "tether_chain_unseen",
        "a Responses continuation of a plain engine id not in this gateway's table: keyed by that id",
    ),
    (
        "tether_chain_learned",
        "a Responses answer's id was written to the chain table",
    ),
    (
        "tether_chain_carried",
        "a Responses continuation took its key from the chain id it continues",
    ),
    (
        "tether_chain_forged",
        "a previous_response_id in chain-id form failed its check: keyed as unseen, forwarded as sent",
    ),
    (
        "tether_chain_unwrapped",
        "a request's chain id was replaced by the engine's own id before the engine saw it",
    ),
    (
        "tether_chain_wrapped",
        "a Responses answer's id was replaced by a chain id on its way to the client",
    ),
    (
        "tether_chain_not_wrapped",
        "a 2xx Responses answer kept the engine's id: none found, one a chain id cannot carry, or compressed",
    ),
];

/// The [`FIXED`] counters by position, so a request counts by index instead
/// of by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fixed {
    HeaderPath,
    BodyPath,
    Untouched,
    BadHeader,
    SpoofedHeaderRemoved,
    SpoofedBodyMarkerRemoved,
    TurnNotCounted,
    BodyMiddleRead,
    BodyRewritten,
    Rejected,
    HostError,
    LoadPollOk,
    LoadPollBad,
    LoadPollFailed,
    LoadSpilled,
    LoadHeld,
    LoadBlind,
    PdDisaggregated,
    PdLocal,
    ServedByFallback,
    PrimaryEjected,
    EndpointEjected,
    ResidencyStay,
    ResidencyLeast,
    ResidencyMigrate,
    ResidencyRecompute,
    ResidencyBounded,
    ResidencyUnseen,
    ResidencyBadVersion,
    ResidencyBadTooMany,
    ResidencyBadShape,
    ResidencyBadUnsorted,
    BodyDecompressed,
    ChainHit,
    ChainUnseen,
    ChainLearned,
    ChainCarried,
    ChainForged,
    ChainUnwrapped,
    ChainWrapped,
    ChainNotWrapped,
}

impl Fixed {
    pub const ALL: [Fixed; 41] = [
        Fixed::HeaderPath,
        Fixed::BodyPath,
        Fixed::Untouched,
        Fixed::BadHeader,
        Fixed::SpoofedHeaderRemoved,
        Fixed::SpoofedBodyMarkerRemoved,
        Fixed::TurnNotCounted,
        Fixed::BodyMiddleRead,
        Fixed::BodyRewritten,
        Fixed::Rejected,
        Fixed::HostError,
        Fixed::LoadPollOk,
        Fixed::LoadPollBad,
        Fixed::LoadPollFailed,
        Fixed::LoadSpilled,
        Fixed::LoadHeld,
        Fixed::LoadBlind,
        Fixed::PdDisaggregated,
        Fixed::PdLocal,
        Fixed::ServedByFallback,
        Fixed::PrimaryEjected,
        Fixed::EndpointEjected,
        Fixed::ResidencyStay,
        Fixed::ResidencyLeast,
        Fixed::ResidencyMigrate,
        Fixed::ResidencyRecompute,
        Fixed::ResidencyBounded,
        Fixed::ResidencyUnseen,
        Fixed::ResidencyBadVersion,
        Fixed::ResidencyBadTooMany,
        Fixed::ResidencyBadShape,
        Fixed::ResidencyBadUnsorted,
        Fixed::BodyDecompressed,
        Fixed::ChainHit,
        Fixed::ChainUnseen,
        Fixed::ChainLearned,
        Fixed::ChainCarried,
        Fixed::ChainForged,
        Fixed::ChainUnwrapped,
        Fixed::ChainWrapped,
        Fixed::ChainNotWrapped,
    ];

    /// The counter of a placement by residency.
    pub fn of_how(h: tether_placement::How) -> Fixed {
        use tether_placement::How;
        match h {
            How::Stay => Fixed::ResidencyStay,
            How::Least => Fixed::ResidencyLeast,
            How::Migrate { .. } => Fixed::ResidencyMigrate,
            How::Recompute { .. } => Fixed::ResidencyRecompute,
            How::Bounded => Fixed::ResidencyBounded,
        }
    }

    /// The counter of a refused residency summary.
    pub fn of_bad_summary(b: &tether_placement::residency::BadSummary) -> Fixed {
        use tether_placement::residency::BadSummary;
        match b {
            BadSummary::Version(_) => Fixed::ResidencyBadVersion,
            BadSummary::TooMany(_) => Fixed::ResidencyBadTooMany,
            BadSummary::Shape => Fixed::ResidencyBadShape,
            BadSummary::Unsorted => Fixed::ResidencyBadUnsorted,
        }
    }

    /// The counter's name (its row in [`FIXED`]).
    pub fn name(self) -> &'static str {
        FIXED.get(self as usize).map_or("", |(n, _)| n)
    }
}

/// One counter a request bumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Fixed(Fixed),
    /// `tether_key_source_<label>` of `session_sources[i]`.
    Source(usize),
    /// `tether_key_source_head`.
    Head,
    /// `tether_key_source_fallback`.
    FallbackSource,
    /// `tether_fallback_<reason>`.
    Fallback(Reason),
    /// `tether_pick_<address>` of endpoint `i`.
    Pick(usize),
}

/// Every counter a request may bump, resolved to ids once per VM (the root
/// context): `id` is whatever the host's define call returned, `None` when it
/// failed. Names that sanitize alike share one id, as they share one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterIds {
    pub fixed: [Option<u32>; Fixed::ALL.len()],
    /// By index into `session_sources`.
    pub source: Vec<Option<u32>>,
    pub head: Option<u32>,
    pub fallback_source: Option<u32>,
    /// By [`Reason::index`].
    pub fallback: [Option<u32>; 10],
    /// By endpoint index.
    pub pick: Vec<Option<u32>>,
}

impl CounterIds {
    /// Resolves every counter of `cfg` through `id_of(name)`.
    pub fn new(cfg: &Config, mut id_of: impl FnMut(&str) -> Option<u32>) -> Self {
        Self {
            fixed: Fixed::ALL.map(|f| id_of(f.name())),
            source: cfg
                .session_sources
                .iter()
                .map(|s| id_of(&key_source(&s.label)))
                .collect(),
            head: id_of(&key_source("head")),
            fallback_source: id_of(&key_source("fallback")),
            fallback: Reason::ALL.map(|r| id_of(&fallback(r))),
            pick: cfg
                .endpoints
                .iter()
                .map(|e| id_of(&pick(&e.address)))
                .collect(),
        }
    }

    /// The id of one counter.
    pub fn id(&self, c: Counter) -> Option<u32> {
        match c {
            Counter::Fixed(f) => self.fixed(f),
            Counter::Source(i) => self.source.get(i).copied().flatten(),
            Counter::Head => self.head,
            Counter::FallbackSource => self.fallback_source,
            Counter::Fallback(r) => self.fallback(r),
            Counter::Pick(i) => self.pick.get(i).copied().flatten(),
        }
    }

    pub fn fixed(&self, f: Fixed) -> Option<u32> {
        self.fixed.get(f as usize).copied().flatten()
    }

    pub fn fallback(&self, r: Reason) -> Option<u32> {
        self.fallback.get(r.index()).copied().flatten()
    }
}

/// Every counter name the filter defines for a configuration.
pub fn all_names(cfg: &Config) -> Vec<String> {
    let mut out: Vec<String> = FIXED.iter().map(|(n, _)| (*n).to_owned()).collect();
    out.extend(cfg.session_sources.iter().map(|s| key_source(&s.label)));
    out.push(key_source("head"));
    out.push(key_source("fallback"));
    out.extend(Reason::ALL.iter().map(|r| fallback(*r)));
    out.extend(cfg.endpoints.iter().map(|e| pick(&e.address)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_resolve_to_the_counters_of_the_same_names() {
        let cfg = Config::parse(
            br#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000"},{"address":"10.0.0.2:8000"}]}"#,
        )
        .unwrap();
        let names = all_names(&cfg);
        let id_of = |n: &str| names.iter().position(|m| m == n).map(|i| i as u32);
        let ids = CounterIds::new(&cfg, id_of);
        for f in Fixed::ALL {
            assert_eq!(
                ids.fixed(f).map(|i| names[i as usize].as_str()),
                Some(f.name())
            );
        }
        assert_eq!(
            ids.fixed(Fixed::SpoofedHeaderRemoved)
                .map(|i| names[i as usize].as_str()),
            Some("tether_spoofed_header_removed")
        );
        for r in Reason::ALL {
            assert_eq!(
                ids.fallback(r).map(|i| names[i as usize].clone()),
                Some(fallback(r))
            );
        }
        for (i, s) in cfg.session_sources.iter().enumerate() {
            assert_eq!(
                ids.source[i].map(|i| names[i as usize].clone()),
                Some(key_source(&s.label))
            );
        }
        assert_eq!(
            ids.head.map(|i| names[i as usize].as_str()),
            Some("tether_key_source_head")
        );
        assert_eq!(
            ids.pick[1].map(|i| names[i as usize].as_str()),
            Some("tether_pick_10_0_0_2_8000")
        );
        // Every fixed counter is reachable by exactly one variant; reasons index ALL.
        assert_eq!(Fixed::ALL.len(), FIXED.len());
        for (i, f) in Fixed::ALL.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
        assert_eq!(Fixed::HostError.name(), "tether_host_error");
        assert_eq!(Fixed::HeaderPath.name(), "tether_requests_header_path");
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        // A name the host refused stays unresolved instead of borrowing another id.
        let ids = CounterIds::new(&cfg, |n| id_of(n).filter(|_| n != "tether_host_error"));
        assert_eq!(ids.fixed(Fixed::HostError), None);
    }
}
