//! Counter names (proxy-wasm metrics; Envoy shows them in `/stats/prometheus`,
//! see `docs/gateway.md` for the exported names).

use crate::config::Config;
use crate::decide::Reason;

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
        "tether_turn_not_counted",
        "body over turn_count_max_bytes: x-tether-turn omitted",
    ),
    (
        "tether_body_middle_read",
        "a needed value sat in the middle: whole body read",
    ),
    (
        "tether_body_rewritten",
        "body rewritten (cache_salt / session_id / routed_dp_rank)",
    ),
    (
        "tether_rejected",
        "refused: salting is on and the body could not be rewritten",
    ),
    ("tether_host_error", "a host call failed (value not set)"),
];

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
