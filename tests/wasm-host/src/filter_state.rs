//! The `set_envoy_filter_state` foreign function: its protobuf argument and the
//! object-factory check Envoy applies to the key.

use crate::abi::Status;
use serde::Serialize;
use std::net::SocketAddr;

/// Filter-state keys Envoy 1.40 has object factories for that tether relies on.
pub const DEFAULT_ACCEPTED_KEYS: [&str; 3] = [
    "envoy.network.transport_socket.original_dst_address",
    "envoy.hashable_string",
    "envoy.string",
];

/// One accepted `set_envoy_filter_state` call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FilterStateEntry {
    pub path: String,
    pub value: String,
    /// 0 FilterChain, 1 DownstreamRequest, 2 DownstreamConnection.
    pub span: u64,
}

/// Decodes `SetEnvoyFilterStateArguments{path=1, value=2, span=3}` and applies
/// Envoy's acceptance rules: unknown key → `NotFound`, a value the key's
/// factory cannot build → `BadArgument`, undecodable bytes → `BadArgument`.
pub fn decode_and_check(args: &[u8], accepted: &[String]) -> Result<FilterStateEntry, Status> {
    let entry = decode(args).ok_or(Status::BadArgument)?;
    if !accepted.contains(&entry.path) {
        return Err(Status::NotFound);
    }
    if entry.path == DEFAULT_ACCEPTED_KEYS[0] && entry.value.parse::<SocketAddr>().is_err() {
        return Err(Status::BadArgument);
    }
    Ok(entry)
}

fn decode(mut bytes: &[u8]) -> Option<FilterStateEntry> {
    let mut entry = FilterStateEntry {
        path: String::new(),
        value: String::new(),
        span: 0,
    };
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        match (key >> 3, key & 7) {
            (field, 2) => {
                let len = usize::try_from(varint(&mut bytes)?).ok()?;
                let data = bytes.get(..len)?;
                bytes = &bytes[len..];
                let text = String::from_utf8(data.to_vec()).ok()?;
                match field {
                    1 => entry.path = text,
                    2 => entry.value = text,
                    _ => {}
                }
            }
            (field, 0) => {
                let v = varint(&mut bytes)?;
                if field == 3 {
                    entry.span = v;
                }
            }
            (_, 1) => bytes = bytes.get(8..)?,
            (_, 5) => bytes = bytes.get(4..)?,
            _ => return None,
        }
    }
    Some(entry)
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Encodes the argument, for guests-in-tests and the docs' examples.
pub fn encode(path: &str, value: &str, span: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for (tag, field) in [(0x0a_u8, path), (0x12, value)] {
        out.push(tag);
        put_varint(&mut out, field.len() as u64);
        out.extend_from_slice(field.as_bytes());
    }
    if span != 0 {
        out.push(0x18);
        put_varint(&mut out, span);
    }
    out
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted() -> Vec<String> {
        DEFAULT_ACCEPTED_KEYS
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn accepts_known_keys_and_rejects_others_as_envoy_does() {
        let ok = encode(DEFAULT_ACCEPTED_KEYS[0], "10.0.0.7:8000", 1);
        let entry = decode_and_check(&ok, &accepted()).unwrap();
        assert_eq!((entry.value.as_str(), entry.span), ("10.0.0.7:8000", 1));
        let unknown = encode("my.key", "x", 0);
        assert_eq!(
            decode_and_check(&unknown, &accepted()),
            Err(Status::NotFound)
        );
        let bad_addr = encode(DEFAULT_ACCEPTED_KEYS[0], "not-an-address", 0);
        assert_eq!(
            decode_and_check(&bad_addr, &accepted()),
            Err(Status::BadArgument)
        );
        assert_eq!(
            decode_and_check(&[0x0a, 0x7f], &accepted()),
            Err(Status::BadArgument)
        );
    }
}
