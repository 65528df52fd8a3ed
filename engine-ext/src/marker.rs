//! Turn markers: the gateway's `x-tether-*` request headers, parsed into a typed [`TurnMarker`].
//!
//! The gateway filter (docs/gateway.md) tells the rank where a prompt ends and what
//! kind of turn comes next, and names the retention key with hex hashes (raw tenant,
//! session and subagent ids never leave the gateway). Header names are matched
//! case-insensitively; a malformed value is a typed [`MarkerError`], never a panic,
//! because headers are untrusted input even behind the gateway.

use thiserror::Error;
use xxhash_rust::xxh3::xxh3_128;

/// `x-tether-prompt-end: 1` — this request's prompt is a turn boundary worth retaining.
pub const H_PROMPT_END: &str = "x-tether-prompt-end";
/// `x-tether-turn-kind: first|user|tool|handoff` — what opened this turn (its last message).
pub const H_TURN_KIND: &str = "x-tether-turn-kind";
/// `x-tether-turn: <n>` — turn number within the (session, subagent).
pub const H_TURN: &str = "x-tether-turn";
/// `x-tether-retention-ms: <ms>` — an explicit retention interval (clamped by the policy).
pub const H_RETENTION_MS: &str = "x-tether-retention-ms";
/// `x-tether-tenant: <hex>` — hash of the authenticated tenant.
pub const H_TENANT: &str = "x-tether-tenant";
/// `x-tether-session: <hex>` — hash of the logical agent run.
pub const H_SESSION: &str = "x-tether-session";
/// `x-tether-subagent: <hex>` — hash of the subagent within the run (absent: the main agent).
pub const H_SUBAGENT: &str = "x-tether-subagent";

/// What opened a turn. The policy takes it as the best predictor of the wait after
/// this prompt end (a tool result is usually followed by another tool call), so it
/// selects the retention interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TurnKind {
    /// The first turn of a session (uses the user-reply interval unless configured).
    First,
    /// Waiting for a human reply.
    User,
    /// Waiting for a tool result (usually seconds).
    Tool,
    /// Control passed to a subagent; the parent resumes when it returns.
    Handoff,
}

impl TurnKind {
    /// Parses the header value (ASCII case-insensitive).
    pub fn parse(v: &str) -> Result<Self, MarkerError> {
        let v = v.trim();
        for (name, kind) in [
            ("first", TurnKind::First),
            ("user", TurnKind::User),
            ("tool", TurnKind::Tool),
            ("handoff", TurnKind::Handoff),
        ] {
            if v.eq_ignore_ascii_case(name) {
                return Ok(kind);
            }
        }
        Err(MarkerError::BadValue {
            header: H_TURN_KIND,
            value: clip(v),
        })
    }
}

/// An opaque 128-bit id taken from a hex hash header.
///
/// Up to 32 hex digits are read as a number; longer hashes (up to 64 digits, e.g. a
/// SHA-256) are folded with xxh3-128 so any gateway hash width maps to one key type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HexId(pub u128);

impl HexId {
    /// Parses 1–64 hex digits.
    pub fn parse(header: &'static str, v: &str) -> Result<Self, MarkerError> {
        let v = v.trim();
        if v.is_empty() || v.len() > 64 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(MarkerError::BadValue {
                header,
                value: clip(v),
            });
        }
        if v.len() <= 32 {
            u128::from_str_radix(v, 16)
                .map(HexId)
                .map_err(|_| MarkerError::BadValue {
                    header,
                    value: clip(v),
                })
        } else {
            Ok(HexId(xxh3_128(v.to_ascii_lowercase().as_bytes())))
        }
    }
}

/// Who a retained state belongs to: one record per key, the latest prompt end wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RetentionKey {
    /// Hash of the tenant.
    pub tenant: HexId,
    /// Hash of the session (agent run).
    pub session: HexId,
    /// Hash of the subagent; zero for the main agent.
    pub subagent: HexId,
}

/// The turn-boundary facts one request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnMarker {
    /// The retention key.
    pub key: RetentionKey,
    /// True when the request's prompt end should be retained.
    pub prompt_end: bool,
    /// What opened this turn; selects the interval.
    pub kind: TurnKind,
    /// Turn number, when the gateway sent one.
    pub turn: Option<u32>,
    /// Explicit interval from the gateway, when sent.
    pub retention_ms: Option<u64>,
}

/// Why a request's marker headers could not be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MarkerError {
    /// A header carries a value outside its grammar.
    #[error("header {header} has a bad value {value:?}")]
    BadValue {
        /// Header name.
        header: &'static str,
        /// The offending value, clipped to 80 characters.
        value: String,
    },
    /// A header appears twice with different values.
    #[error("header {0} is repeated with different values")]
    Conflict(&'static str),
}

fn clip(v: &str) -> String {
    v.chars().take(80).collect()
}

impl TurnMarker {
    /// Reads the `x-tether-*` headers of a request.
    ///
    /// Returns `Ok(None)` when the request carries no session header (not a tracked
    /// agent turn). Names are case-insensitive; other headers are ignored. A session
    /// without `x-tether-prompt-end: 1` still yields a marker (with `prompt_end: false`)
    /// so a hit can refresh the session's retention.
    pub fn from_headers<'a, I>(headers: I) -> Result<Option<TurnMarker>, MarkerError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        const NAMES: [&str; 7] = [
            H_PROMPT_END,
            H_TURN_KIND,
            H_TURN,
            H_RETENTION_MS,
            H_TENANT,
            H_SESSION,
            H_SUBAGENT,
        ];
        let mut vals: [Option<&str>; 7] = [None; 7];
        for (name, value) in headers {
            let Some(i) = NAMES
                .iter()
                .position(|n| n.eq_ignore_ascii_case(name.trim()))
            else {
                continue;
            };
            match vals[i] {
                Some(prev) if prev.trim() != value.trim() => {
                    return Err(MarkerError::Conflict(NAMES[i]));
                }
                _ => vals[i] = Some(value),
            }
        }
        let [prompt_end, kind, turn, retention, tenant, session, subagent] = vals;
        let Some(session) = session else {
            return Ok(None);
        };
        let prompt_end = match prompt_end.map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(MarkerError::BadValue {
                    header: H_PROMPT_END,
                    value: clip(v),
                });
            }
        };
        // No kind: the gateway decided on a header alone and never read the body
        // (its fast path), so nobody knows what ended the turn. The user-reply
        // interval is the longest default, the safe side for a turn boundary.
        let kind = kind
            .map(TurnKind::parse)
            .transpose()?
            .unwrap_or(TurnKind::User);
        let num = |header: &'static str, v: &str| {
            v.trim().parse::<u64>().map_err(|_| MarkerError::BadValue {
                header,
                value: clip(v),
            })
        };
        let turn = turn
            .map(|v| {
                num(H_TURN, v).and_then(|n| {
                    u32::try_from(n).map_err(|_| MarkerError::BadValue {
                        header: H_TURN,
                        value: clip(v),
                    })
                })
            })
            .transpose()?;
        let retention_ms = retention.map(|v| num(H_RETENTION_MS, v)).transpose()?;
        let key = RetentionKey {
            tenant: tenant
                .map(|v| HexId::parse(H_TENANT, v))
                .transpose()?
                .unwrap_or_default(),
            session: HexId::parse(H_SESSION, session)?,
            subagent: subagent
                .map(|v| HexId::parse(H_SUBAGENT, v))
                .transpose()?
                .unwrap_or_default(),
        };
        Ok(Some(TurnMarker {
            key,
            prompt_end,
            kind,
            turn,
            retention_ms,
        }))
    }
}

#[cfg(test)]
mod tests;
