//! The markers as request-body fields, for engines whose connector API sees the
//! body but not the headers (vLLM: `kv_transfer_params` → `request.kv_transfer_params`).
//!
//! The gateway writes `"kv_transfer_params": {"tether": {…}}` with one member per
//! marker header: the header name without `x-tether-`, dashes as underscores
//! (`prompt_end`, `turn_kind`, `turn`, `retention_ms`, `tenant`, `session`,
//! `subagent`); every value a JSON string in the header's grammar. Readers hand
//! the members to [`crate::TurnMarker::from_fields`].

use crate::headers::MARKERS;

/// Member of `kv_transfer_params` that holds tether's markers.
pub const KEY: &str = "tether";

/// Member of the markers object naming the engine (`ip:port`, its API address) that
/// holds a migrated key's state, for the new engine to pull it from (docs/vllm.md,
/// "State pull (NIXL)"). Not a marker: [`crate::TurnMarker`] ignores it. As a
/// header: [`crate::headers::PULL_FROM`] (`x-tether-pull-from`), same value.
pub const PULL_FROM: &str = "pull_from";

/// Reads a `pull_from` value (header or body member): one IP socket address,
/// `1.2.3.4:8000` or `[::1]:8000`, port not 0, surrounding blanks ignored.
/// `None` for anything else (a host name, no port, a list): the reader refuses it.
pub fn parse_pull_from(value: &str) -> Option<std::net::SocketAddr> {
    value
        .trim()
        .parse::<std::net::SocketAddr>()
        .ok()
        .filter(|a| a.port() != 0)
}

/// The body field name of a marker header (`x-tether-prompt-end` → `prompt_end`).
pub fn field_of(header: &str) -> Option<&'static str> {
    FIELDS
        .iter()
        .zip(MARKERS)
        .find(|(_, h)| h.eq_ignore_ascii_case(header))
        .map(|(f, _)| *f)
}

/// The marker header of a body field name (`prompt_end` → `x-tether-prompt-end`).
pub fn header_of(field: &str) -> Option<&'static str> {
    FIELDS
        .iter()
        .zip(MARKERS)
        .find(|(f, _)| **f == field)
        .map(|(_, h)| h)
}

/// Field names, in [`MARKERS`] order.
pub const FIELDS: [&str; MARKERS.len()] = [
    "prompt_end",
    "turn_kind",
    "turn",
    "retention_ms",
    "tenant",
    "session",
    "subagent",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_mirror_headers() {
        for (f, h) in FIELDS.iter().zip(MARKERS) {
            assert_eq!(
                h.strip_prefix("x-tether-")
                    .map(|s| s.replace('-', "_"))
                    .as_deref(),
                Some(*f)
            );
            assert_eq!(field_of(h), Some(*f));
            assert_eq!(header_of(f), Some(h));
        }
        assert_eq!(header_of("x-tether-session"), None);
    }

    #[test]
    fn pull_from_is_one_ip_socket_address() {
        assert_eq!(
            parse_pull_from(" 10.0.0.1:8000 "),
            Some("10.0.0.1:8000".parse().unwrap())
        );
        assert_eq!(
            parse_pull_from("[::1]:80"),
            Some("[::1]:80".parse().unwrap())
        );
        for bad in [
            "",
            "10.0.0.1",
            "10.0.0.1:0",
            "host:80",
            "10.0.0.1:1,10.0.0.2:1",
            "::1:80",
        ] {
            assert_eq!(parse_pull_from(bad), None, "{bad:?}");
        }
    }
}
