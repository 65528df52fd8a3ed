//! The turn markers as a request-body field for engines whose connector sees
//! the body but no custom header (vLLM: body `kv_transfer_params` →
//! `request.kv_transfer_params`): `"kv_transfer_params": {"tether": {…}}`,
//! merged into the object the client sent, whose own `tether` member never
//! survives (a client must not be able to spoof markers). Format:
//! `tether_wire::params`, `docs/wire.md` ("Markers in the body").

use super::markers;
use crate::config::Config;
use crate::config::outputs::Sink;
use crate::json::{self, Value};
use crate::read::Reading;
use crate::read::identity::hex16_bytes;
use tether_wire::params;

/// The top-level member holding the markers' object.
pub const FIELD: &str = "kv_transfer_params";

/// The `tether` object for a reading: one string member per marker known
/// (prompt end, turn kind, turn count when counted, interval), then the
/// tenant, session and subagent hashes, then `pull_from` (the old holder's
/// `ip:port`) when the turn is a migration that pulls its state.
pub fn tether_object(cfg: &Config, read: &Reading, pull_from: Option<&str>) -> String {
    let mut out = String::with_capacity(192);
    out.push('{');
    let mut member = |name: &str, value: &[u8]| {
        if out.len() > 1 {
            out.push(',');
        }
        out.push('"');
        out.push_str(name);
        out.push_str("\":\"");
        // Marker values are hex digits, decimals and kind names: nothing to escape.
        out.push_str(&String::from_utf8_lossy(value));
        out.push('"');
    };
    markers::for_each_marker(cfg, read, |o, value| {
        if let Sink::Header(h) = o.sink()
            && let Some(name) = params::field_of(h)
        {
            member(name, value);
        }
    });
    let id = &read.identity;
    for (header, hash) in [
        (tether_wire::headers::TENANT, id.tenant_hash()),
        (tether_wire::headers::SESSION, id.session_hash()),
        (tether_wire::headers::SUBAGENT, id.subagent_hash()),
    ] {
        if let Some(name) = params::field_of(header) {
            member(name, &hex16_bytes(hash));
        }
    }
    if let Some(addr) = pull_from {
        // An endpoint address (`ip:port`, `[v6]:port`): nothing to escape.
        member(params::PULL_FROM, addr.as_bytes());
    }
    out.push('}');
    out
}

/// Whether the client's `kv_transfer_params` holds a `tether` member of its
/// own (any spelling of the key): what the rewrite removes.
pub fn has_markers(client: Option<Value<'_>>) -> bool {
    client
        .filter(Value::is_object)
        .is_some_and(|obj| obj.members().any(|(k, _)| json::key_eq(k, params::KEY)))
}

/// The new `kv_transfer_params` value: ours first, then every member of the
/// client's object except any `tether` (duplicates and escaped spellings
/// included). A client value that is not an object (null, a string, …) is
/// replaced: an engine expects an object there.
pub fn merged(tether: &str, client: Option<Value<'_>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(tether.len() + 16);
    out.extend_from_slice(b"{\"");
    out.extend_from_slice(params::KEY.as_bytes());
    out.extend_from_slice(b"\":");
    out.extend_from_slice(tether.as_bytes());
    if let Some(obj) = client.filter(Value::is_object) {
        for (k, v) in obj.members() {
            if json::key_eq(k, params::KEY) {
                continue;
            }
            out.push(b',');
            out.push(b'"');
            out.extend_from_slice(k);
            out.extend_from_slice(b"\":");
            out.extend_from_slice(v.bytes());
        }
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests;
