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
/// "State pull (NIXL)"). Not a marker header: [`crate::TurnMarker`] ignores it.
pub const PULL_FROM: &str = "pull_from";

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
}
