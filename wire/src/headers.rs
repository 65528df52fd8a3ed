//! Every header name of the contract, lower case (as Envoy stores them).
//!
//! The gateway writes the `x-tether-*` markers and the placement headers; a
//! client may never send any of the [`is_internal`] names (the gateway strips
//! them before deciding). Readers match names ASCII case-insensitively.

/// Routing key: 16 hex digits, `xxh3(tenant ‖ session ‖ subagent)`. Envoy's
/// `hash_policy` / Istio `consistentHash.httpHeaderName` reads it in hash mode.
pub const KEY: &str = "x-tether-key";
/// Where the key came from: `header:<name>`, `body:<path>`, `head`, `fallback:<reason>`.
pub const KEY_SOURCE: &str = "x-tether-key-source";
/// Hash of the authenticated tenant (hex).
pub const TENANT: &str = "x-tether-tenant";
/// Hash of the logical agent run (hex).
pub const SESSION: &str = "x-tether-session";
/// Hash of the subagent within the run (hex); absent or zero = the main agent.
pub const SUBAGENT: &str = "x-tether-subagent";
/// Hash of the parent run or agent (hex), when the request names one.
pub const PARENT: &str = "x-tether-parent";
/// `1`: this prompt ends at a turn boundary worth retaining; `0`: it does not
/// (the prompt ends with an assistant prefill).
pub const PROMPT_END: &str = "x-tether-prompt-end";
/// [`crate::TurnKind`] name of what opened this turn.
pub const TURN_KIND: &str = "x-tether-turn-kind";
/// Turn number within the (session, subagent), decimal.
pub const TURN: &str = "x-tether-turn";
/// Retention interval for this prompt end, decimal milliseconds.
pub const RETENTION_MS: &str = "x-tether-retention-ms";
/// Response header with the decision, when the gateway's `debug_header` is on.
pub const DEBUG: &str = "x-tether-debug";

/// `ip:port[,fallback…]` for Envoy `override_host` / an `ORIGINAL_DST` cluster
/// (the Gateway API Inference Extension convention).
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// vLLM data-parallel rank on the chosen endpoint, decimal.
pub const DP_RANK: &str = "x-data-parallel-rank";
/// `ip:port` of the prefill endpoint of a disaggregated request (llm-d convention).
pub const PREFILLER: &str = "x-prefiller-host-port";
/// Engine-native session header (vLLM/SGLang `request.session_id`).
pub const SESSION_ID: &str = "x-session-id";
/// `ip:port` of the engine that holds a migrated key's state (the old holder,
/// exactly as the gateway's `endpoints` name it): the engine serving the turn
/// pulls the state from there (docs/rank.md "State pull"; in the body:
/// [`crate::params::PULL_FROM`]). Internal: an `x-tether-*` name.
pub const PULL_FROM: &str = "x-tether-pull-from";

/// Prefix shared by every tether marker.
pub const TETHER_PREFIX: &str = "x-tether-";

/// Non-prefixed headers a client may not send: the gateway or the mesh sets them.
pub const INTERNAL_EXACT: [&str; 3] = [DP_RANK, DESTINATION, PREFILLER];

/// The marker headers the engine reads back into a [`crate::TurnMarker`].
pub const MARKERS: [&str; 7] = [
    PROMPT_END,
    TURN_KIND,
    TURN,
    RETENTION_MS,
    TENANT,
    SESSION,
    SUBAGENT,
];

/// Whether a client-sent header with this name must be stripped: any
/// `x-tether-*` and the [`INTERNAL_EXACT`] names, in any case. Compares in
/// place (the gateway checks every request header).
pub fn is_internal(name: &[u8]) -> bool {
    let prefix = TETHER_PREFIX.as_bytes();
    name.get(..prefix.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
        || INTERNAL_EXACT
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_names_in_any_case() {
        for n in [
            KEY,
            "X-Tether-Anything",
            DP_RANK,
            "X-Gateway-Destination-Endpoint",
            PREFILLER,
            PULL_FROM,
            "X-Tether-Pull-From",
        ] {
            assert!(is_internal(n.as_bytes()), "{n}");
        }
        for n in [
            SESSION_ID,
            "x-tether",
            "content-type",
            "x-data-parallel-rank2",
            "",
        ] {
            assert!(!is_internal(n.as_bytes()), "{n}");
        }
        for n in MARKERS {
            assert!(is_internal(n.as_bytes()));
        }
    }
}

/// Response headers a `tether-rank` sets (simulated timing in milliseconds of
/// simulated time; docs/rank.md) and `tether replay` reads back. They travel
/// rank → client, so [`is_internal`] (a request-side rule) does not apply.
pub mod reply {
    /// The rank process that served the request (`--rank-id`, by default its
    /// bound `ip:port`): lets a client behind a gateway see where it landed.
    pub const RANK: &str = "x-tether-rank";
    /// DP rank that served the request.
    pub const DP_RANK: &str = "x-tether-rank-dp";
    /// Simulated arrival time, ms since the rank started.
    pub const SIM_ARRIVAL_MS: &str = "x-tether-sim-arrival-ms";
    /// Simulated time waiting for admission.
    pub const SIM_QUEUE_MS: &str = "x-tether-sim-queue-ms";
    /// Simulated time to first token.
    pub const SIM_TTFT_MS: &str = "x-tether-sim-ttft-ms";
    /// Simulated end-to-end latency (non-streaming responses only).
    pub const SIM_E2E_MS: &str = "x-tether-sim-e2e-ms";
    /// Simulated mean inter-token latency (non-streaming responses only).
    pub const SIM_ITL_MS: &str = "x-tether-sim-itl-ms";
    /// Prompt tokens served from cache (device hit + host restore).
    pub const CACHED_TOKENS: &str = "x-tether-cached-tokens";
    /// Decode role: the prefiller (`ip:port`) whose KV this answer decoded from.
    pub const PREFILLED_BY: &str = "x-tether-prefilled-by";
    /// The holder (`ip:port`) whose retained state this answer pulled (a
    /// granted lease; docs/rank.md "State pull").
    pub const PULLED_FROM: &str = "x-tether-pulled-from";
}
