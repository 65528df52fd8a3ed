//! The two calls rebalancing adds beside the state pull's lease calls
//! (`docs/rank.md` "Rebalancing in tool gaps"): `POST /pull/adopt`, the home
//! asking a cooler candidate to take a copy of a retained state, and `POST
//! /pull/forget`, the rank that served a key's returning turn telling the
//! other holder to let its copy go. The key and the turn travel as a
//! `"marker"` object in the body-marker grammar (`docs/wire.md` "Markers in
//! the body", read by [`TurnMarker::from_fields`]); block hashes as the lease
//! call spells them (32 hex).

use serde_json::{Value, json};
use std::net::SocketAddr;
use tether_engine::{BlockHash, RetentionKey, TurnMarker};

pub const ADOPT: &str = "/pull/adopt";
pub const FORGET: &str = "/pull/forget";

/// The marker fields of `m` (`kv_transfer_params.tether`'s members).
fn marker_json(m: &TurnMarker) -> Value {
    let mut v = key_json(&m.key);
    v["prompt_end"] = json!(if m.prompt_end { "1" } else { "0" });
    v["turn_kind"] = json!(m.kind.name());
    if let Some(t) = m.turn {
        v["turn"] = json!(t.to_string());
    }
    if let Some(r) = m.retention_ms {
        v["retention_ms"] = json!(r.to_string());
    }
    v
}

fn key_json(k: &RetentionKey) -> Value {
    json!({
        "tenant": format!("{:032x}", k.tenant.0),
        "session": format!("{:032x}", k.session.0),
        "subagent": format!("{:032x}", k.subagent.0),
    })
}

/// Reads the `"marker"` member; `Err` names what is wrong.
fn marker_of(v: &Value) -> Result<TurnMarker, String> {
    let obj = v["marker"]
        .as_object()
        .ok_or("`marker` must be an object of marker fields")?;
    let mut fields = Vec::with_capacity(obj.len());
    for (k, x) in obj {
        let s = x
            .as_str()
            .ok_or_else(|| format!("`marker.{k}` must be a string"))?;
        fields.push((k.as_str(), s));
    }
    TurnMarker::from_fields(fields)
        .map_err(|e| format!("`marker`: {e}"))?
        .ok_or_else(|| "`marker` must name a session".to_owned())
}

fn body(b: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(b).map_err(|e| format!("not JSON: {e}"))?;
    if v.is_object() {
        Ok(v)
    } else {
        Err("not a JSON object".into())
    }
}

/// `POST /pull/adopt`: take a copy of `marker.key`'s retained state from `from`.
#[derive(Debug, Clone, PartialEq)]
pub struct Adopt {
    /// The home holding the state (its address as the gateway lists it).
    pub from: SocketAddr,
    /// The gateway's routing key (`x-tether-key`): picks the DP rank.
    pub route_key: u64,
    /// The key, the turn's kind and interval (a prompt end).
    pub marker: TurnMarker,
    /// The retained blocks' hashes, from block 0.
    pub hashes: Vec<BlockHash>,
    /// The home's model and KV shape (the lease call's).
    pub fingerprint: String,
}

impl Adopt {
    pub fn to_json(&self) -> Value {
        json!({
            "from": self.from.to_string(),
            "route_key": format!("{:016x}", self.route_key),
            "marker": marker_json(&self.marker),
            "hashes": self.hashes.iter().map(|h| format!("{:032x}", h.0)).collect::<Vec<_>>(),
            "fingerprint": self.fingerprint,
        })
    }

    /// Reads a call's body; `Err` names the member at fault (a 400).
    pub fn from_json(b: &[u8]) -> Result<Adopt, String> {
        let v = body(b)?;
        let from = v["from"]
            .as_str()
            .and_then(tether_wire::params::parse_pull_from)
            .ok_or("`from` must be one ip:port")?;
        let route_key = v["route_key"]
            .as_str()
            .filter(|k| (1..=16).contains(&k.len()))
            .and_then(|k| u64::from_str_radix(k, 16).ok())
            .ok_or("`route_key` must be 1-16 hex digits")?;
        let marker = marker_of(&v)?;
        if !marker.prompt_end {
            return Err("`marker.prompt_end` must be \"1\": only a prompt end is retained".into());
        }
        let list = v["hashes"].as_array().ok_or("`hashes` must be an array")?;
        if list.is_empty() || list.len() > crate::pull::MAX_HASHES {
            return Err(format!(
                "`hashes` must hold 1 to {} block hashes",
                crate::pull::MAX_HASHES
            ));
        }
        let hashes = list
            .iter()
            .map(crate::pull::block_hash)
            .collect::<Option<Vec<_>>>()
            .ok_or("`hashes` must be 32-hex-digit strings")?;
        let fingerprint = v["fingerprint"]
            .as_str()
            .ok_or("`fingerprint` must be a string")?
            .to_owned();
        Ok(Adopt {
            from,
            route_key,
            marker,
            hashes,
            fingerprint,
        })
    }
}

/// `POST /pull/forget`: let `key`'s copy go if its chain ends at `last`.
pub fn forget_json(key: &RetentionKey, last: BlockHash) -> Value {
    json!({ "marker": key_json(key), "last": format!("{:032x}", last.0) })
}

/// Reads a forget call: the key and the last block of the copy to let go;
/// `Err` names the member at fault (a 400).
pub fn forget_of(b: &[u8]) -> Result<(RetentionKey, BlockHash), String> {
    let v = body(b)?;
    let key = marker_of(&v)?.key;
    let last =
        crate::pull::block_hash(&v["last"]).ok_or("`last` must be a 32-hex-digit block hash")?;
    Ok((key, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_engine::TurnKind;
    use tether_wire::HexId;

    fn adopt() -> Adopt {
        Adopt {
            from: "127.0.0.1:9".parse().unwrap(),
            route_key: 0xabc,
            marker: TurnMarker {
                key: RetentionKey {
                    tenant: HexId(1),
                    session: HexId(u128::MAX),
                    subagent: HexId(0),
                },
                prompt_end: true,
                kind: TurnKind::Handoff,
                turn: Some(4),
                retention_ms: Some(90_000),
            },
            hashes: vec![BlockHash(5), BlockHash(u128::MAX)],
            fingerprint: "f".into(),
        }
    }

    #[test]
    fn both_calls_round_trip() {
        let a = adopt();
        let b = a.to_json().to_string();
        assert_eq!(Adopt::from_json(b.as_bytes()).unwrap(), a);
        let f = forget_json(&a.marker.key, BlockHash(9)).to_string();
        assert_eq!(
            forget_of(f.as_bytes()).unwrap(),
            (a.marker.key, BlockHash(9))
        );
    }

    #[test]
    fn bad_members_are_named() {
        let good = adopt().to_json();
        let with = |k: &str, x: Value| {
            let mut v = good.clone();
            v[k] = x;
            v.to_string()
        };
        for (body, what) in [
            ("[1]".to_owned(), "object"),
            ("{".to_owned(), "JSON"),
            (with("from", json!("nowhere")), "from"),
            (with("from", json!(7)), "from"),
            (with("route_key", json!("xyz")), "route_key"),
            (with("marker", json!("x")), "marker"),
            (with("marker", json!({"session": 5})), "marker.session"),
            (with("marker", json!({"session": "zz"})), "marker"),
            (with("marker", json!({"tenant": "1"})), "session"),
            (
                with("marker", json!({"session": "1", "prompt_end": "0"})),
                "prompt_end",
            ),
            (with("hashes", json!([])), "hashes"),
            (with("hashes", json!(["12"])), "hashes"),
            (with("fingerprint", json!(null)), "fingerprint"),
        ] {
            let e = Adopt::from_json(body.as_bytes()).unwrap_err();
            assert!(e.contains(what), "{body}: {e}");
        }
        assert!(forget_of(b"{\"marker\": {}}").is_err());
        let e = forget_of(br#"{"marker": {"session": "1"}, "last": "1"}"#).unwrap_err();
        assert!(e.contains("last"), "{e}");
        assert!(forget_of(b"null").is_err());
    }
}
