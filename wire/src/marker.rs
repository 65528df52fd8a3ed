//! Turn markers: the gateway's `x-tether-*` request headers, parsed into a typed [`TurnMarker`].
//!
//! The gateway tells the rank where a prompt ends and what kind of turn comes
//! next, and names the retention key with hex hashes (raw tenant, session and
//! subagent ids never leave the gateway). Names are matched case-insensitively;
//! a malformed value is a typed [`MarkerError`], never a panic, because headers
//! are untrusted input even behind the gateway.

use crate::TurnKind;
use crate::headers::{
    MARKERS, PROMPT_END, RETENTION_MS, SESSION, SUBAGENT, TENANT, TURN, TURN_KIND,
};

/// An opaque 128-bit id read from a hex hash.
///
/// Up to 32 hex digits are read as a number; longer hashes (up to 64 digits,
/// e.g. a SHA-256) are folded with FNV-1a-128 over their lower-case digits, so
/// any gateway hash width maps onto one key type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HexId(pub u128);

impl HexId {
    /// Parses 1–64 hex digits (surrounding whitespace ignored); `header` names
    /// the field in the error.
    pub fn parse(header: &'static str, v: &str) -> Result<Self, MarkerError> {
        let v = v.trim();
        let bad = || MarkerError::bad(header, v);
        if v.is_empty() || v.len() > 64 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        if v.len() <= 32 {
            return u128::from_str_radix(v, 16).map(HexId).map_err(|_| bad());
        }
        const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
        const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
        let h = v.bytes().fold(OFFSET, |h, b| {
            (h ^ u128::from(b.to_ascii_lowercase())).wrapping_mul(PRIME)
        });
        Ok(HexId(h))
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerError {
    /// A header carries a value outside its grammar.
    BadValue {
        /// Header name.
        header: &'static str,
        /// The offending value, clipped to 80 characters.
        value: String,
    },
    /// A header appears twice with different values.
    Conflict(&'static str),
}

impl MarkerError {
    fn bad(header: &'static str, v: &str) -> Self {
        MarkerError::BadValue {
            header,
            value: v.chars().take(80).collect(),
        }
    }
}

impl std::fmt::Display for MarkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MarkerError::BadValue { header, value } => {
                write!(f, "header {header} has a bad value {value:?}")
            }
            MarkerError::Conflict(h) => write!(f, "header {h} is repeated with different values"),
        }
    }
}

impl std::error::Error for MarkerError {}

impl TurnMarker {
    /// Reads the markers from body fields (`kv_transfer_params.tether`, see
    /// [`crate::params`]): the same grammar and outcomes as [`Self::from_headers`];
    /// unknown fields are ignored.
    pub fn from_fields<'a, I>(fields: I) -> Result<Option<TurnMarker>, MarkerError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        Self::from_headers(
            fields
                .into_iter()
                .filter_map(|(f, v)| crate::params::header_of(f).map(|h| (h, v))),
        )
    }

    /// Reads the `x-tether-*` headers of a request.
    ///
    /// Returns `Ok(None)` when the request carries no session header (not a
    /// tracked agent turn). Names are case-insensitive; other headers are
    /// ignored. A session without `x-tether-prompt-end: 1` still yields a marker
    /// (with `prompt_end: false`) so a hit can refresh the session's retention.
    /// No turn kind (the gateway's header fast path never reads the body) reads
    /// as [`TurnKind::User`], whose interval is the longest common wait.
    pub fn from_headers<'a, I>(headers: I) -> Result<Option<TurnMarker>, MarkerError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut vals: [Option<&str>; MARKERS.len()] = [None; MARKERS.len()];
        for (name, value) in headers {
            let Some(i) = MARKERS
                .iter()
                .position(|n| n.eq_ignore_ascii_case(name.trim()))
            else {
                continue;
            };
            match vals[i] {
                Some(prev) if prev.trim() != value.trim() => {
                    return Err(MarkerError::Conflict(MARKERS[i]));
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
            Some(v) => return Err(MarkerError::bad(PROMPT_END, v)),
        };
        let kind = match kind {
            None => TurnKind::User,
            Some(v) => TurnKind::parse(v).ok_or_else(|| MarkerError::bad(TURN_KIND, v))?,
        };
        let turn = turn
            .map(|v| {
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| MarkerError::bad(TURN, v))
            })
            .transpose()?;
        let retention_ms = retention
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| MarkerError::bad(RETENTION_MS, v))
            })
            .transpose()?;
        let id = |header, v: Option<&str>| {
            v.map(|v| HexId::parse(header, v))
                .transpose()
                .map(Option::unwrap_or_default)
        };
        let key = RetentionKey {
            tenant: id(TENANT, tenant)?,
            session: HexId::parse(SESSION, session)?,
            subagent: id(SUBAGENT, subagent)?,
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
