//! P/D roles behind the server: what a decode-role rank does with
//! `x-prefiller-host-port` (llm-d's routing sidecar) — send the prefill leg, a
//! one-token copy of the request, to the named prefiller, then decode here with
//! the prompt's KV counted as transferred over the KV link.
//!
//! The pure parts (reading the header, rewriting the body) are plain functions;
//! [`prefill_leg`] is the one network call.

use crate::request::{BadReason, Refusal};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use std::net::SocketAddr;
use tether_wire::Api;
use tether_wire::headers::{DP_RANK, PREFILLER};

/// The HTTP client a decode rank sends its prefill legs with.
pub type LegClient = Client<HttpConnector, Full<Bytes>>;

/// The prefiller named by the request: `None` without the header; a refusal
/// (`bad_prefiller`) when it is repeated, not ASCII or not `ip:port`.
pub fn prefiller<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<SocketAddr>, Refusal> {
    let bad = |why: String| Refusal::new(BadReason::BadPrefiller, why);
    let mut it = values.into_iter();
    let Some(v) = it.next() else {
        return Ok(None);
    };
    if it.next().is_some() {
        return Err(bad(format!("{PREFILLER} is repeated")));
    }
    let s = std::str::from_utf8(v).map_err(|_| bad(format!("{PREFILLER} is not ASCII")))?;
    s.trim().parse::<SocketAddr>().map(Some).map_err(|_| {
        bad(format!(
            "{PREFILLER} must be ip:port, got {:?}",
            s.chars().take(60).collect::<String>()
        ))
    })
}

/// The prefill leg's body: the client's request asking for one token, not
/// streamed, with vLLM's P/D `kv_transfer_params` (`do_remote_decode`) in place
/// of anything the client or gateway put there — so the prefiller neither
/// streams nor retains the turn for itself (its KV goes to the decode rank).
pub fn prefill_body(api: Api, body: &[u8]) -> Result<Vec<u8>, String> {
    let mut v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let o = v
        .as_object_mut()
        .ok_or_else(|| "not a JSON object".to_owned())?;
    for k in [
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "stream_options",
    ] {
        o.remove(k);
    }
    o.insert(api.max_output_key().into(), json!(1));
    o.insert("stream".into(), json!(false));
    o.insert(
        "kv_transfer_params".into(),
        json!({"do_remote_decode": true, "do_remote_prefill": false}),
    );
    serde_json::to_vec(&v).map_err(|e| e.to_string())
}

/// Sends the prefill leg to `to` (same path, same DP rank) and waits for its
/// answer; `Err` says why it failed (connection, status), for the log-less
/// counter and the local fallback.
pub async fn prefill_leg(
    client: &LegClient,
    to: SocketAddr,
    path: &str,
    dp: usize,
    body: Vec<u8>,
) -> Result<(), String> {
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{to}{path}"))
        .header("content-type", "application/json")
        .header(DP_RANK, dp.to_string())
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = client.request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    // Read the answer whole: the prefiller's KV is ready once it has answered.
    let _ = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("prefiller {to} answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_one_ip_port() {
        assert_eq!(prefiller(std::iter::empty()).unwrap(), None);
        assert_eq!(
            prefiller([&b"10.0.0.1:8000"[..]]).unwrap(),
            Some("10.0.0.1:8000".parse().unwrap())
        );
        for bad in [&b"host:80"[..], b"10.0.0.1", b"\xff", b""] {
            let e = prefiller([bad]).unwrap_err();
            assert_eq!(e.reason, BadReason::BadPrefiller);
        }
        let e = prefiller([&b"10.0.0.1:1"[..], b"10.0.0.2:1"]).unwrap_err();
        assert!(e.message.contains("repeated"), "{}", e.message);
    }

    #[test]
    fn the_leg_asks_for_one_token_without_streaming_or_markers() {
        let b = br#"{"messages":[{"role":"user","content":"a"}],"max_completion_tokens":50,"stream":true,
            "stream_options":{"include_usage":true},"kv_transfer_params":{"tether":{"prompt_end":true}}}"#;
        let v: Value = serde_json::from_slice(&prefill_body(Api::Chat, b).unwrap()).unwrap();
        assert_eq!(v["max_tokens"], 1);
        assert!(v.get("max_completion_tokens").is_none());
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["stream"], false);
        assert_eq!(v["kv_transfer_params"]["do_remote_decode"], true);
        assert!(v["kv_transfer_params"].get("tether").is_none());
        assert_eq!(v["messages"][0]["content"], "a");
        let r: Value = serde_json::from_slice(
            &prefill_body(Api::Responses, br#"{"input":"x","max_output_tokens":9}"#).unwrap(),
        )
        .unwrap();
        assert_eq!(r["max_output_tokens"], 1);
        assert!(prefill_body(Api::Chat, b"[1]").is_err());
        assert!(prefill_body(Api::Chat, b"{").is_err());
    }
}
