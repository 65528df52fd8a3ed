//! The output set: headers (or, on the body path, filter-state values that
//! Envoy copies into headers) handed to the rank for one decision.

use crate::config::{Config, Mode};
use crate::decide::Decision;
use crate::identity::hex16;
use crate::placement::Placement;
use crate::turn::TurnKind;

/// Output header names (lower case, as Envoy stores them).
pub mod names {
    pub const KEY: &str = "x-tether-key";
    pub const KEY_SOURCE: &str = "x-tether-key-source";
    pub const TENANT: &str = "x-tether-tenant";
    pub const SESSION: &str = "x-tether-session";
    pub const SUBAGENT: &str = "x-tether-subagent";
    pub const PARENT: &str = "x-tether-parent";
    pub const PROMPT_END: &str = "x-tether-prompt-end";
    pub const TURN_KIND: &str = "x-tether-turn-kind";
    pub const TURN: &str = "x-tether-turn";
    pub const RETENTION_MS: &str = "x-tether-retention-ms";
    pub const DESTINATION: &str = "x-gateway-destination-endpoint";
    pub const DP_RANK: &str = "x-data-parallel-rank";
    pub const SESSION_ID: &str = "x-session-id";
    pub const DEBUG: &str = "x-tether-debug";
}

/// Filter-state key (without Envoy's `wasm.` prefix) carrying `header` on the body path.
pub fn state_key(header: &str) -> String {
    format!("tether.{header}")
}

/// Every header this filter may set on a request (for Envoy `header_mutation` configs).
pub const ALL_REQUEST_HEADERS: [&str; 13] = [
    names::KEY,
    names::KEY_SOURCE,
    names::TENANT,
    names::SESSION,
    names::SUBAGENT,
    names::PARENT,
    names::PROMPT_END,
    names::TURN_KIND,
    names::TURN,
    names::RETENTION_MS,
    names::DESTINATION,
    names::DP_RANK,
    names::SESSION_ID,
];

/// The request headers for a decision, in a stable order.
pub fn request_headers(
    cfg: &Config,
    placement: &Placement,
    d: &Decision,
) -> Vec<(&'static str, String)> {
    let id = &d.identity;
    let key = hex16(id.key());
    let mut out = vec![
        (names::KEY, key.clone()),
        (names::KEY_SOURCE, d.source.clone()),
        (names::TENANT, hex16(id.tenant_hash())),
        (names::SESSION, hex16(id.session_hash())),
        (names::SUBAGENT, hex16(id.subagent_hash())),
    ];
    if let Some(p) = id.parent_hash() {
        out.push((names::PARENT, hex16(p)));
    }
    if let Some(t) = d.turn {
        out.push((
            names::PROMPT_END,
            if t.prompt_end { "1" } else { "0" }.to_owned(),
        ));
        out.push((names::TURN_KIND, t.kind.name().to_owned()));
        if let Some(n) = t.count {
            out.push((names::TURN, n.to_string()));
        }
        out.push((names::RETENTION_MS, retention(cfg, t.kind).to_string()));
    }
    if let (Mode::Pick, Some(p)) = (cfg.mode, &d.pick) {
        out.push((names::DESTINATION, placement.destination(p)));
        out.push((names::DP_RANK, p.rank.to_string()));
    }
    if cfg.engine.session_header {
        out.push((names::SESSION_ID, key));
    }
    out
}

/// `retention_ms[kind]`.
pub fn retention(cfg: &Config, kind: TurnKind) -> u64 {
    let r = &cfg.retention_ms;
    match kind {
        TurnKind::First => r.first,
        TurnKind::User => r.user,
        TurnKind::Tool => r.tool,
        TurnKind::Handoff => r.handoff,
    }
}

/// `x-tether-debug` response value: `source=…;key=…;endpoint=…;rank=…;kind=…`.
pub fn debug_value(placement: &Placement, d: &Decision) -> String {
    let endpoint = d
        .pick
        .as_ref()
        .and_then(|p| p.order.first())
        .and_then(|i| placement.endpoints().get(*i))
        .map_or("-", |e| e.address.as_str());
    let rank = d
        .pick
        .as_ref()
        .map_or_else(|| "-".to_owned(), |p| p.rank.to_string());
    let kind = d.turn.map_or("-", |t| t.kind.name());
    format!(
        "source={};key={};endpoint={endpoint};rank={rank};kind={kind};path={}",
        d.source,
        hex16(d.identity.key()),
        if d.header_path { "header" } else { "body" }
    )
}
