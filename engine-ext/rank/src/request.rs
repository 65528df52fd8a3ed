//! A request body of one of the four APIs, checked and reduced to what the
//! simulated engine needs: prompt tokens ([`crate::prompt`]), output length,
//! streaming options, `cache_salt` and the body turn markers. Untrusted input:
//! every outcome is a value, never a panic.

use crate::prompt::prompt_tokens;
use serde_json::{Map, Value};
use tether_wire::Api;
use tether_wire::TurnMarker;

/// Why a request is refused; each has a counter (`tether_rank_bad_requests_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BadReason {
    /// The path is none of the served endpoints.
    UnknownPath,
    /// A served path with the wrong method.
    Method,
    /// The body is not JSON.
    NotJson,
    /// The body is JSON but not an object.
    NotObject,
    /// A member is missing or has the wrong type or range.
    BadField,
    /// The body is over `--max-body-bytes`.
    TooLarge,
    /// A turn marker (header or body) is malformed.
    BadMarker,
    /// `x-data-parallel-rank` is not a rank of this process.
    BadDpRank,
    /// The prompt is empty, or longer than the engine can hold.
    BadPrompt,
    /// `x-prefiller-host-port` is not one `ip:port` (decode role).
    BadPrefiller,
    /// `x-tether-pull-from` (or `kv_transfer_params.tether.pull_from`) is not
    /// one `ip:port`.
    BadPullFrom,
    /// Responses `previous_response_id` names no response this process
    /// answered (vLLM keeps stored responses in the memory of the server
    /// that made them, and answers 404 alike).
    UnknownResponse,
    /// The engine could not serve it (internal).
    Engine,
}

impl BadReason {
    /// Every reason, in counter order.
    pub const ALL: [BadReason; 13] = [
        BadReason::UnknownPath,
        BadReason::Method,
        BadReason::NotJson,
        BadReason::NotObject,
        BadReason::BadField,
        BadReason::TooLarge,
        BadReason::BadMarker,
        BadReason::BadDpRank,
        BadReason::BadPrompt,
        BadReason::BadPrefiller,
        BadReason::BadPullFrom,
        BadReason::UnknownResponse,
        BadReason::Engine,
    ];

    /// Label value.
    pub fn name(self) -> &'static str {
        match self {
            BadReason::UnknownPath => "unknown_path",
            BadReason::Method => "method",
            BadReason::NotJson => "not_json",
            BadReason::NotObject => "not_object",
            BadReason::BadField => "bad_field",
            BadReason::TooLarge => "too_large",
            BadReason::BadMarker => "bad_marker",
            BadReason::BadDpRank => "bad_dp_rank",
            BadReason::BadPrompt => "bad_prompt",
            BadReason::BadPrefiller => "bad_prefiller",
            BadReason::BadPullFrom => "bad_pull_from",
            BadReason::UnknownResponse => "unknown_response",
            BadReason::Engine => "engine",
        }
    }

    /// HTTP status for this reason.
    pub fn status(self) -> u16 {
        match self {
            BadReason::UnknownPath | BadReason::UnknownResponse => 404,
            BadReason::Method => 405,
            BadReason::TooLarge => 413,
            BadReason::Engine => 500,
            _ => 400,
        }
    }
}

/// A refused request: reason (status, counter) and a message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: BadReason,
    /// Human-readable, names the field.
    pub message: String,
}

impl Refusal {
    /// A refusal for `reason`.
    pub fn new(reason: BadReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

fn bad_field(msg: impl Into<String>) -> Refusal {
    Refusal::new(BadReason::BadField, msg)
}

/// What the engine needs from a body.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The API.
    pub api: Api,
    /// `model`, when sent.
    pub model: Option<String>,
    /// `stream: true`.
    pub stream: bool,
    /// Chat/Completions `stream_options.include_usage`.
    pub include_usage: bool,
    /// Requested output length, when sent.
    pub max_tokens: Option<usize>,
    /// The prompt's token ids.
    pub tokens: Vec<u32>,
    /// `cache_salt`, when sent.
    pub cache_salt: Option<String>,
    /// Marker from `kv_transfer_params.tether`, when present.
    pub body_marker: Option<TurnMarker>,
    /// `kv_transfer_params.tether.pull_from`, when present (a string; read
    /// as an address by the server, with the header's rule).
    pub pull_from: Option<String>,
    /// Responses `previous_response_id`, when sent.
    pub previous_response_id: Option<String>,
}

fn opt_bool(o: &Map<String, Value>, k: &str) -> Result<bool, Refusal> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad_field(format!("`{k}` must be a boolean"))),
    }
}

fn opt_count(o: &Map<String, Value>, k: &str) -> Result<Option<usize>, Refusal> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(v) if v >= 1 => Ok(Some(usize::try_from(v).unwrap_or(usize::MAX))),
            _ => Err(bad_field(format!("`{k}` must be an integer of at least 1"))),
        },
        Some(_) => Err(bad_field(format!("`{k}` must be an integer"))),
    }
}

fn opt_str(o: &Map<String, Value>, k: &str) -> Result<Option<String>, Refusal> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad_field(format!("`{k}` must be a string"))),
    }
}

fn require_array(o: &Map<String, Value>, k: &str) -> Result<(), Refusal> {
    match o.get(k) {
        Some(Value::Array(_)) => Ok(()),
        None | Some(Value::Null) => Err(bad_field(format!("`{k}` is required"))),
        Some(_) => Err(bad_field(format!("`{k}` must be an array"))),
    }
}

fn require_text(o: &Map<String, Value>, k: &str) -> Result<(), Refusal> {
    match o.get(k) {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(items)) => {
            if items.iter().any(|i| i.is_number()) {
                Err(bad_field(format!(
                    "`{k}` holds token ids; the simulated tokenizer reads text only"
                )))
            } else {
                Ok(())
            }
        }
        None | Some(Value::Null) => Err(bad_field(format!("`{k}` is required"))),
        Some(_) => Err(bad_field(format!("`{k}` must be a string or an array"))),
    }
}

fn optional_text(o: &Map<String, Value>, k: &str) -> Result<(), Refusal> {
    match o.get(k) {
        None | Some(Value::Null) | Some(Value::String(_)) | Some(Value::Array(_)) => Ok(()),
        Some(_) => Err(bad_field(format!("`{k}` must be a string or an array"))),
    }
}

/// Reads `kv_transfer_params.tether` into a marker (`docs/wire.md`).
fn body_marker(o: &Map<String, Value>) -> Result<Option<TurnMarker>, Refusal> {
    let params = match o.get("kv_transfer_params") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(bad_field("`kv_transfer_params` must be an object")),
    };
    let fields = match params.get(tether_wire::params::KEY) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(_) => {
            return Err(Refusal::new(
                BadReason::BadMarker,
                "`kv_transfer_params.tether` must be an object",
            ));
        }
    };
    let mut pairs = Vec::with_capacity(fields.len());
    for (k, v) in fields {
        match v {
            Value::String(s) => pairs.push((k.as_str(), s.as_str())),
            _ if tether_wire::params::header_of(k).is_none() => {}
            _ => {
                return Err(Refusal::new(
                    BadReason::BadMarker,
                    format!("`kv_transfer_params.tether.{k}` must be a string"),
                ));
            }
        }
    }
    TurnMarker::from_fields(pairs).map_err(|e| {
        Refusal::new(
            BadReason::BadMarker,
            format!("kv_transfer_params.tether: {e}"),
        )
    })
}

/// Reads `kv_transfer_params.tether.pull_from` (`docs/wire.md`): a string,
/// or a refusal (`bad_pull_from`).
fn body_pull_from(o: &Map<String, Value>) -> Result<Option<String>, Refusal> {
    let member = o
        .get("kv_transfer_params")
        .and_then(|p| p.get(tether_wire::params::KEY))
        .and_then(|t| t.get(tether_wire::params::PULL_FROM));
    match member {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Refusal::new(
            BadReason::BadPullFrom,
            "`kv_transfer_params.tether.pull_from` must be a string",
        )),
    }
}

/// Parses and checks a request body of `api`.
pub fn parse(api: Api, body: &[u8]) -> Result<Parsed, Refusal> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Refusal::new(BadReason::NotJson, format!("body is not valid JSON: {e}")))?;
    let Value::Object(o) = &v else {
        return Err(Refusal::new(
            BadReason::NotObject,
            "body must be a JSON object",
        ));
    };
    let model = opt_str(o, "model")?;
    let stream = opt_bool(o, "stream")?;
    let cache_salt = opt_str(o, "cache_salt")?;
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => opt_bool(so, "include_usage")?,
        Some(_) => return Err(bad_field("`stream_options` must be an object")),
    };
    if let Some(n) = opt_count(o, "n")?
        && n != 1
    {
        return Err(bad_field(
            "`n` must be 1: the simulated engine returns one choice",
        ));
    }
    let max_tokens = match api {
        Api::Chat => {
            require_array(o, "messages")?;
            match opt_count(o, "max_completion_tokens")? {
                Some(n) => Some(n),
                None => opt_count(o, "max_tokens")?,
            }
        }
        Api::Completions => {
            require_text(o, "prompt")?;
            opt_count(o, "max_tokens")?
        }
        Api::Responses => {
            require_text(o, "input")?;
            optional_text(o, "instructions")?;
            opt_count(o, "max_output_tokens")?
        }
        Api::Messages => {
            require_array(o, "messages")?;
            optional_text(o, "system")?;
            match opt_count(o, "max_tokens")? {
                Some(n) => Some(n),
                None => return Err(bad_field("`max_tokens` is required")),
            }
        }
    };
    if let Some(t) = o.get("tools")
        && !(t.is_array() || t.is_null())
    {
        return Err(bad_field("`tools` must be an array"));
    }
    let body_marker = body_marker(o)?;
    let pull_from = body_pull_from(o)?;
    let tokens = prompt_tokens(api, &v);
    Ok(Parsed {
        api,
        model,
        stream,
        include_usage,
        max_tokens,
        tokens,
        cache_salt,
        body_marker,
        pull_from,
        previous_response_id: match api {
            Api::Responses => opt_str(o, "previous_response_id")?,
            _ => None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_fields_are_read() {
        let p = parse(
            Api::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"a b c"}],"max_tokens":7,"stream":true,
               "stream_options":{"include_usage":true},"cache_salt":"t1",
               "kv_transfer_params":{"tether":{"session":"ab","prompt_end":"1","turn_kind":"tool"}}}"#,
        )
        .unwrap();
        assert_eq!(p.tokens.len(), 4); // "a b c" and the role "user"
        assert_eq!(p.max_tokens, Some(7));
        assert!(p.stream && p.include_usage);
        assert_eq!(p.cache_salt.as_deref(), Some("t1"));
        let m = p.body_marker.unwrap();
        assert!(m.prompt_end);
        assert_eq!(m.key.session.0, 0xab);
    }

    #[test]
    fn bad_bodies_are_refused_by_reason() {
        let r = |api, b: &[u8]| parse(api, b).unwrap_err().reason;
        assert_eq!(r(Api::Chat, b"{nope"), BadReason::NotJson);
        assert_eq!(r(Api::Chat, b"[1,2]"), BadReason::NotObject);
        assert_eq!(r(Api::Chat, br#"{"messages":"x"}"#), BadReason::BadField);
        assert_eq!(r(Api::Chat, br#"{}"#), BadReason::BadField);
        assert_eq!(
            r(Api::Chat, br#"{"messages":[],"max_tokens":"5"}"#),
            BadReason::BadField
        );
        assert_eq!(
            r(Api::Chat, br#"{"messages":[],"max_tokens":0}"#),
            BadReason::BadField
        );
        assert_eq!(
            r(Api::Chat, br#"{"messages":[],"stream":"yes"}"#),
            BadReason::BadField
        );
        assert_eq!(r(Api::Messages, br#"{"messages":[]}"#), BadReason::BadField);
        assert_eq!(
            r(Api::Completions, br#"{"prompt":[1,2,3]}"#),
            BadReason::BadField
        );
        assert_eq!(
            r(
                Api::Chat,
                br#"{"messages":[],"kv_transfer_params":{"tether":{"session":"xyz"}}}"#
            ),
            BadReason::BadMarker
        );
        assert_eq!(
            r(
                Api::Chat,
                br#"{"messages":[],"kv_transfer_params":{"tether":{"turn":7}}}"#
            ),
            BadReason::BadMarker
        );
    }

    #[test]
    fn pull_from_is_read_from_the_markers() {
        let p = parse(
            Api::Chat,
            br#"{"messages":[],"kv_transfer_params":{"tether":{"session":"1","pull_from":"10.0.0.1:80"}}}"#,
        )
        .unwrap();
        assert_eq!(p.pull_from.as_deref(), Some("10.0.0.1:80"));
        assert!(p.body_marker.is_some());
        let e = parse(
            Api::Chat,
            br#"{"messages":[],"kv_transfer_params":{"tether":{"pull_from":8000}}}"#,
        )
        .unwrap_err();
        assert_eq!(e.reason, BadReason::BadPullFrom);
    }

    #[test]
    fn unknown_marker_members_are_ignored() {
        let p = parse(
            Api::Responses,
            br#"{"input":"hi","kv_transfer_params":{"tether":{"session":"1","future":3},"other":1}}"#,
        )
        .unwrap();
        assert!(p.body_marker.is_some());
    }
}
