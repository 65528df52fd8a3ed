//! One HTTP request/response through the filter with Envoy's iteration rules,
//! and the JSON shapes the CLI reads (request description) and prints (outcome).
//!
//! Rules modelled (each has a real-Envoy test in `tests/e2e/tests/host_conformance.rs`):
//! - `Pause` from the request-header callback stops all iteration: no body
//!   callback, nothing upstream, the request stalls (unless the filter resumes).
//! - `Continue` from a header callback releases the headers: from then on the
//!   map is gone for the filter (every map call answers `BadArgument`).
//! - `Pause` from a body callback before end of stream buffers: the next body
//!   callback sees everything buffered so far (`body_size` = total), and
//!   `get_buffer_bytes` can read any range of it.
//! - A local response ends the request (no later request callback) and is then
//!   delivered through the module's own response callbacks, as Envoy 1.40 does:
//!   the response-header callback sees `:status`, the module's headers and, for a
//!   non-empty body, `content-length` (the body's) and `content-type: text/plain`
//!   (unless given); the body callback sees the body; `response.code_details` is
//!   the details with whitespace as `_` (`via_upstream` for upstream responses).

use crate::abi::Action;
use crate::error::HostError;
use crate::filter_state::FilterStateEntry;
use crate::header_map::HeaderMap;
use crate::state::{Access, ForeignCall, HttpCall, LocalResponse, LogRecord, Metric, StreamState};
use crate::vm::FilterVm;
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::Path;

/// A request as the downstream client sends it, plus the upstream's answer.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub headers: HeaderMap,
    /// Body as it arrives, chunk by chunk (empty: no body).
    pub body_chunks: Vec<Vec<u8>>,
    pub trailers: HeaderMap,
    /// Properties of this request (`["source","address"]`, ...).
    pub properties: BTreeMap<Vec<String>, Vec<u8>>,
    /// Dynamic metadata, `{namespace: {key: value}}`, for `metadata.filter_metadata.*`.
    pub metadata: Option<serde_json::Value>,
    pub response: UpstreamResponse,
}

/// What the upstream answers if the request reaches it.
#[derive(Clone, Debug)]
pub struct UpstreamResponse {
    pub headers: HeaderMap,
    pub body_chunks: Vec<Vec<u8>>,
    pub trailers: HeaderMap,
}

impl Default for UpstreamResponse {
    fn default() -> Self {
        Self {
            headers: HeaderMap::from_pairs([(":status", "200")]),
            body_chunks: Vec::new(),
            trailers: HeaderMap::new(),
        }
    }
}

impl Request {
    /// A POST with the given path, headers and body chunks.
    pub fn post(path: &str, headers: &[(&str, &str)], chunks: &[&[u8]]) -> Self {
        let mut map = HeaderMap::from_pairs([
            (":method", "POST"),
            (":path", path),
            (":authority", "gateway"),
            (":scheme", "http"),
        ]);
        for (k, v) in headers {
            map.add(k.as_bytes(), v.as_bytes());
        }
        Self {
            headers: map,
            body_chunks: chunks.iter().map(|c| c.to_vec()).collect(),
            ..Self::default()
        }
    }

    /// Splits one body into chunks of `size` bytes (at least one chunk).
    pub fn chunked(body: &[u8], size: usize) -> Vec<Vec<u8>> {
        if body.is_empty() {
            return Vec::new();
        }
        body.chunks(size.max(1)).map(<[u8]>::to_vec).collect()
    }
}

/// One stream callback as it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallbackRecord {
    pub callback: &'static str,
    /// Header count, or body size as announced to the filter.
    pub size: usize,
    pub end_of_stream: bool,
    pub action: Action,
}

/// What reached the upstream.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Upstream {
    #[serde(serialize_with = "ser_headers")]
    pub headers: HeaderMap,
    #[serde(serialize_with = "ser_bytes")]
    pub body: Vec<u8>,
    #[serde(serialize_with = "ser_headers")]
    pub trailers: HeaderMap,
}

/// What reached the downstream client.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Downstream {
    #[serde(serialize_with = "ser_headers")]
    pub headers: HeaderMap,
    #[serde(serialize_with = "ser_bytes")]
    pub body: Vec<u8>,
    /// True when this is the filter's local response.
    pub local: bool,
}

/// Everything observable about one exchange.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    /// `None` when the request headers never left the filter.
    pub upstream: Option<Upstream>,
    /// Why the exchange did not complete, if it did not (Envoy would hang
    /// until a timeout).
    pub stalled: Option<String>,
    pub downstream: Option<Downstream>,
    pub local_response: Option<LocalResponse>,
    /// Filter state accepted during this exchange.
    pub filter_state: Vec<FilterStateEntry>,
    pub foreign_calls: Vec<ForeignCall>,
    pub route_cache_clears: u32,
    /// Properties the filter set on this stream, keyed as Envoy's filter
    /// state: `wasm.` + path segments joined by `.` (values lossily decoded).
    pub properties_set: BTreeMap<String, String>,
    pub http_calls: Vec<HttpCall>,
    pub callbacks: Vec<CallbackRecord>,
    pub logs: Vec<LogRecord>,
    /// All metrics of the VM after the exchange.
    pub metrics: Vec<Metric>,
    /// Fuel (≈ wasm operators) used per callback in this exchange; empty
    /// when the plugin is not metered.
    pub fuel: BTreeMap<String, u64>,
    /// Wall time spent inside the module during this exchange (host calls
    /// included, the harness's own bookkeeping excluded), in nanoseconds.
    pub wasm_nanos: u64,
    /// `env.proxy_*` calls the guest made during this exchange, by import name.
    pub host_calls: BTreeMap<String, u64>,
    /// Bytes the host copied into guest memory during this exchange.
    pub bytes_to_guest: u64,
}

impl Outcome {
    /// A request header as it went upstream.
    pub fn upstream_header(&self, name: &str) -> Option<&str> {
        self.upstream.as_ref()?.headers.get_str(name)
    }

    /// A filter-state value set during the exchange, by `set_envoy_filter_state`
    /// (key as given) or by `set_property` (key `wasm.<path>`); the last wins.
    pub fn filter_state_value(&self, key: &str) -> Option<&str> {
        self.filter_state
            .iter()
            .rev()
            .find(|e| e.path == key)
            .map(|e| e.value.as_str())
            .or_else(|| self.properties_set.get(key).map(String::as_str))
    }
}

struct Marks {
    logs: usize,
    filter_state: usize,
    foreign: usize,
    clears: u32,
    http: usize,
    fuel: BTreeMap<String, u64>,
    nanos: u64,
    host_calls: BTreeMap<&'static str, u64>,
    bytes_to_guest: u64,
}

enum Stop {
    Local,
    Stalled(String),
}

impl FilterVm {
    /// Runs one request through a fresh HTTP context and reports what happened.
    pub fn run(&mut self, request: &Request) -> Result<Outcome, HostError> {
        let s = self.state();
        let marks = Marks {
            logs: s.logs.len(),
            filter_state: s.filter_state.len(),
            foreign: s.foreign_calls.len(),
            clears: s.route_cache_clears,
            http: s.http_calls.len(),
            fuel: s.fuel.by_callback.clone(),
            nanos: s.fuel.nanos_by_callback.values().sum(),
            host_calls: s.host_calls.clone(),
            bytes_to_guest: s.bytes_to_guest,
        };
        let ctx = self.create_http_context()?;
        let mut out = Outcome::default();
        {
            let stream = self.stream(ctx)?;
            stream.request_headers = request.headers.clone();
            stream.properties = request.properties.clone();
            if let Some(meta) = &request.metadata {
                stream
                    .properties
                    .insert(vec!["$metadata".into()], meta.to_string().into_bytes());
            }
        }
        let stop = match self.request_path(ctx, request, &mut out)? {
            None => {
                self.stream(ctx)?.response_code_details = Some("via_upstream".into());
                self.response_path(ctx, &request.response, &mut out)?
            }
            Some(Stop::Local) => self.local_reply(ctx, &mut out)?,
            stop => stop,
        };
        let stream = self.finish_stream(ctx)?;
        out.properties_set = stream
            .set_properties
            .iter()
            .map(|(k, v)| {
                (
                    format!("wasm.{}", k.join(".")),
                    String::from_utf8_lossy(v).into_owned(),
                )
            })
            .collect();
        match stop {
            Some(Stop::Local) => {
                // A second local reply from a response callback of the first:
                // the client gets the first as sent.
                if let Some(l) = &out.local_response {
                    out.downstream = Some(Downstream {
                        headers: local_reply_headers(l),
                        body: l.body.clone(),
                        local: true,
                    });
                }
            }
            Some(Stop::Stalled(why)) => out.stalled = Some(why),
            None => {}
        }
        let s = self.state();
        out.filter_state = s.filter_state[marks.filter_state..].to_vec();
        out.foreign_calls = s.foreign_calls[marks.foreign..].to_vec();
        out.route_cache_clears = s.route_cache_clears - marks.clears;
        out.http_calls = s.http_calls[marks.http..].to_vec();
        out.logs = s.logs[marks.logs..].to_vec();
        out.metrics = s.metrics.clone();
        out.fuel = s
            .fuel
            .by_callback
            .iter()
            .map(|(k, v)| (k.clone(), v - marks.fuel.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect();
        out.wasm_nanos = s.fuel.nanos_by_callback.values().sum::<u64>() - marks.nanos;
        out.host_calls = s
            .host_calls
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v - marks.host_calls.get(k).copied().unwrap_or(0),
                )
            })
            .filter(|(_, v)| *v > 0)
            .collect();
        out.bytes_to_guest = s.bytes_to_guest - marks.bytes_to_guest;
        Ok(out)
    }

    /// Delivers the filter's local reply through its own response callbacks
    /// (Envoy runs the encoder chain on it), then reports it downstream.
    fn local_reply(&mut self, ctx: u32, out: &mut Outcome) -> Result<Option<Stop>, HostError> {
        let stream = self.stream(ctx)?;
        let Some(local) = stream.local_response.take() else {
            return Ok(None);
        };
        stream.response_code_details = Some(
            local
                .details
                .chars()
                .map(|c| if c.is_whitespace() { '_' } else { c })
                .collect(),
        );
        let reply = UpstreamResponse {
            headers: local_reply_headers(&local),
            body_chunks: Request::chunked(&local.body, local.body.len()),
            trailers: HeaderMap::new(),
        };
        out.local_response = Some(local);
        let stop = self.response_path(ctx, &reply, out)?;
        if let Some(down) = &mut out.downstream {
            down.local = true;
        }
        Ok(stop)
    }

    fn stream(&mut self, ctx: u32) -> Result<&mut StreamState, HostError> {
        self.state_mut()
            .streams
            .get_mut(&ctx)
            .ok_or(HostError::UnknownContext(ctx))
    }

    /// Calls one stream callback and the deferred work after it; returns the
    /// effective action (a `proxy_continue_stream` during it counts as Continue)
    /// or a stop when the filter answered locally.
    fn step(
        &mut self,
        ctx: u32,
        callback: &'static str,
        size: usize,
        eos: Option<bool>,
        out: &mut Outcome,
    ) -> Result<Result<Action, Stop>, HostError> {
        let action = match eos {
            Some(eos) => {
                self.call_action(callback, ctx, (ctx as i32, size as i32, i32::from(eos)))?
            }
            None => self.call_action(callback, ctx, (ctx as i32, size as i32))?,
        };
        out.callbacks.push(CallbackRecord {
            callback,
            size,
            end_of_stream: eos.unwrap_or(true),
            action,
        });
        self.run_deferred()?;
        let stream = self.stream(ctx)?;
        if stream.local_response.is_some() {
            return Ok(Err(Stop::Local));
        }
        let resumed = if callback.contains("request") {
            std::mem::take(&mut stream.resume_request)
        } else {
            std::mem::take(&mut stream.resume_response)
        };
        Ok(Ok(if resumed { Action::Continue } else { action }))
    }

    fn request_path(
        &mut self,
        ctx: u32,
        req: &Request,
        out: &mut Outcome,
    ) -> Result<Option<Stop>, HostError> {
        let has_body = !req.body_chunks.is_empty();
        let has_trailers = !req.trailers.is_empty();
        self.stream(ctx)?.request_headers_access = Access::ReadWrite;
        let n = req.headers.len();
        let action = match self.step(
            ctx,
            "proxy_on_request_headers",
            n,
            Some(!has_body && !has_trailers),
            out,
        )? {
            Ok(a) => a,
            Err(stop) => return Ok(Some(stop)),
        };
        if action == Action::Pause {
            // Envoy maps Pause to StopAllIteration: body is buffered, never delivered.
            return Ok(Some(Stop::Stalled(
                "request headers paused: body not delivered, nothing sent upstream".into(),
            )));
        }
        let stream = self.stream(ctx)?;
        stream.request_headers_access = Access::Gone;
        // One allocation for the whole body (Envoy's buffer grows too, but the
        // harness should not charge a filter for Vec doubling).
        stream
            .request_body
            .reserve(req.body_chunks.iter().map(Vec::len).sum());
        let mut upstream = Upstream {
            headers: stream.request_headers.clone(),
            ..Upstream::default()
        };
        let mut body_paused = false;
        for (i, chunk) in req.body_chunks.iter().enumerate() {
            let eos = i + 1 == req.body_chunks.len() && !has_trailers;
            let stream = self.stream(ctx)?;
            stream.request_body.extend_from_slice(chunk);
            stream.request_body_access = Access::ReadWrite;
            let size = stream.request_body.len();
            let step = self.step(ctx, "proxy_on_request_body", size, Some(eos), out)?;
            let stream = self.stream(ctx)?;
            stream.request_body_access = Access::Gone;
            match step {
                Err(stop) => {
                    out.upstream = Some(upstream);
                    return Ok(Some(stop));
                }
                Ok(Action::Continue) => {
                    release(&mut upstream.body, &mut stream.request_body);
                    body_paused = false;
                }
                Ok(Action::Pause) => body_paused = true,
            }
        }
        if has_trailers {
            let stream = self.stream(ctx)?;
            stream.request_trailers = req.trailers.clone();
            stream.request_trailers_access = Access::ReadWrite;
            let step = self.step(
                ctx,
                "proxy_on_request_trailers",
                req.trailers.len(),
                None,
                out,
            )?;
            let stream = self.stream(ctx)?;
            stream.request_trailers_access = Access::Gone;
            match step {
                Err(stop) => {
                    out.upstream = Some(upstream);
                    return Ok(Some(stop));
                }
                Ok(Action::Continue) => {
                    release(&mut upstream.body, &mut stream.request_body);
                    upstream.trailers = stream.request_trailers.clone();
                    body_paused = false;
                }
                Ok(Action::Pause) => {
                    out.upstream = Some(upstream);
                    return Ok(Some(Stop::Stalled("request trailers paused".into())));
                }
            }
        }
        out.upstream = Some(upstream);
        if body_paused {
            return Ok(Some(Stop::Stalled(
                "request body paused at end of stream: upstream got headers only".into(),
            )));
        }
        Ok(None)
    }

    fn response_path(
        &mut self,
        ctx: u32,
        resp: &UpstreamResponse,
        out: &mut Outcome,
    ) -> Result<Option<Stop>, HostError> {
        let has_body = !resp.body_chunks.is_empty();
        let has_trailers = !resp.trailers.is_empty();
        let stream = self.stream(ctx)?;
        stream.response_headers = resp.headers.clone();
        stream.response_headers_access = Access::ReadWrite;
        let step = self.step(
            ctx,
            "proxy_on_response_headers",
            resp.headers.len(),
            Some(!has_body && !has_trailers),
            out,
        )?;
        match step {
            Err(stop) => return Ok(Some(stop)),
            Ok(Action::Pause) => return Ok(Some(Stop::Stalled("response headers paused".into()))),
            Ok(Action::Continue) => {}
        }
        let stream = self.stream(ctx)?;
        stream.response_headers_access = Access::Gone;
        let mut down = Downstream {
            headers: stream.response_headers.clone(),
            ..Downstream::default()
        };
        let mut body_paused = false;
        for (i, chunk) in resp.body_chunks.iter().enumerate() {
            let eos = i + 1 == resp.body_chunks.len() && !has_trailers;
            let stream = self.stream(ctx)?;
            stream.response_body.extend_from_slice(chunk);
            stream.response_body_access = Access::ReadWrite;
            let size = stream.response_body.len();
            let step = self.step(ctx, "proxy_on_response_body", size, Some(eos), out)?;
            let stream = self.stream(ctx)?;
            stream.response_body_access = Access::Gone;
            match step {
                Err(stop) => return Ok(Some(stop)),
                Ok(Action::Continue) => {
                    release(&mut down.body, &mut stream.response_body);
                    body_paused = false;
                }
                Ok(Action::Pause) => body_paused = true,
            }
        }
        if has_trailers {
            let stream = self.stream(ctx)?;
            stream.response_trailers = resp.trailers.clone();
            stream.response_trailers_access = Access::ReadWrite;
            let step = self.step(
                ctx,
                "proxy_on_response_trailers",
                resp.trailers.len(),
                None,
                out,
            )?;
            let stream = self.stream(ctx)?;
            stream.response_trailers_access = Access::Gone;
            match step {
                Err(stop) => return Ok(Some(stop)),
                Ok(Action::Continue) => {
                    release(&mut down.body, &mut stream.response_body);
                    body_paused = false;
                }
                Ok(Action::Pause) => {
                    return Ok(Some(Stop::Stalled("response trailers paused".into())));
                }
            }
        }
        out.downstream = Some(down);
        if body_paused {
            return Ok(Some(Stop::Stalled(
                "response body paused at end of stream".into(),
            )));
        }
        Ok(None)
    }
}

/// The headers of a local reply as Envoy hands them to the encoder filters:
/// `:status`, the module's headers, and for a non-empty body its
/// `content-length` and (unless the module gave one) `content-type: text/plain`.
fn local_reply_headers(local: &LocalResponse) -> HeaderMap {
    let mut headers = HeaderMap::from_pairs([(":status", local.status.to_string().as_str())]);
    for (k, v) in local.headers.iter() {
        if k != ":status" {
            headers.add(k.as_bytes(), v);
        }
    }
    if !local.body.is_empty() {
        headers.replace(b"content-length", local.body.len().to_string().as_bytes());
        if headers.get(b"content-type").is_none() {
            headers.add(b"content-type", b"text/plain");
        }
    }
    headers
}

/// Moves released bytes on: a swap when nothing went before (no copy).
fn release(sent: &mut Vec<u8>, buffered: &mut Vec<u8>) {
    if sent.is_empty() {
        std::mem::swap(sent, buffered);
    } else {
        sent.append(buffered);
    }
}

/// The request description the CLI reads (JSON).
///
/// ```json
/// {"headers": [[":method","POST"],[":path","/v1/chat/completions"],["x-session-id","s1"]],
///  "body": "{\"model\":\"m\"}", "chunk_size": 16384,
///  "source_address": "10.0.0.9:5555",
///  "metadata": {"envoy.lb": {"tenant": "acme"}},
///  "response": {"headers": {":status": "200"}, "body": "ok"}}
/// ```
/// `headers` is a list of pairs or an object; the body is `body` (text),
/// `body_chunks` (list of texts, delivered as given) or `body_file` (path
/// relative to the description), split by `chunk_size` if set.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestDescription {
    #[serde(default)]
    pub headers: HeaderList,
    pub body: Option<String>,
    pub body_chunks: Option<Vec<String>>,
    pub body_file: Option<String>,
    pub chunk_size: Option<usize>,
    #[serde(default)]
    pub trailers: HeaderList,
    pub source_address: Option<String>,
    pub destination_address: Option<String>,
    pub metadata: Option<serde_json::Value>,
    /// Extra properties: dotted path (`"node.id"`) → string value.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    pub response: Option<ResponseDescription>,
}

/// The scripted upstream response in a request description.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseDescription {
    #[serde(default)]
    pub headers: HeaderList,
    pub body: Option<String>,
    #[serde(default)]
    pub trailers: HeaderList,
}

/// Headers as a list of pairs or as an object.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum HeaderList {
    Pairs(Vec<(String, String)>),
    Object(BTreeMap<String, String>),
}

impl Default for HeaderList {
    fn default() -> Self {
        HeaderList::Pairs(Vec::new())
    }
}

impl HeaderList {
    fn to_map(&self) -> HeaderMap {
        match self {
            HeaderList::Pairs(p) => {
                HeaderMap::from_pairs(p.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            }
            HeaderList::Object(o) => {
                HeaderMap::from_pairs(o.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            }
        }
    }
}

/// A request description could not be turned into a request.
#[derive(Debug, thiserror::Error)]
pub enum DescriptionError {
    #[error("give at most one of body, body_chunks, body_file")]
    TwoBodies,
    #[error("cannot read body_file {path}: {source}")]
    BodyFile {
        path: String,
        source: std::io::Error,
    },
}

impl RequestDescription {
    /// Builds the request; `base` resolves a relative `body_file`.
    pub fn into_request(self, base: &Path) -> Result<Request, DescriptionError> {
        let given = [
            self.body.is_some(),
            self.body_chunks.is_some(),
            self.body_file.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(DescriptionError::TwoBodies);
        }
        let mut chunks: Vec<Vec<u8>> = match (self.body, self.body_chunks, self.body_file) {
            (Some(b), _, _) => vec![b.into_bytes()],
            (_, Some(c), _) => c.into_iter().map(String::into_bytes).collect(),
            (_, _, Some(f)) => {
                let path = base.join(&f);
                vec![
                    std::fs::read(&path).map_err(|source| DescriptionError::BodyFile {
                        path: path.display().to_string(),
                        source,
                    })?,
                ]
            }
            _ => Vec::new(),
        };
        chunks.retain(|c| !c.is_empty());
        if let Some(size) = self.chunk_size {
            chunks = Request::chunked(&chunks.concat(), size);
        }
        let mut properties: BTreeMap<Vec<String>, Vec<u8>> = self
            .properties
            .into_iter()
            .map(|(k, v)| (k.split('.').map(str::to_owned).collect(), v.into_bytes()))
            .collect();
        for (prefix, addr) in [
            ("source", self.source_address),
            ("destination", self.destination_address),
        ] {
            if let Some(addr) = addr {
                if let Some((_, port)) = addr.rsplit_once(':')
                    && let Ok(port) = port.parse::<i64>()
                {
                    properties.insert(
                        vec![prefix.into(), "port".into()],
                        port.to_le_bytes().to_vec(),
                    );
                }
                properties.insert(vec![prefix.into(), "address".into()], addr.into_bytes());
            }
        }
        let response = match self.response {
            None => UpstreamResponse::default(),
            Some(r) => {
                let mut headers = r.headers.to_map();
                if headers.get(b":status").is_none() {
                    headers.add(b":status", b"200");
                }
                UpstreamResponse {
                    headers,
                    body_chunks: r
                        .body
                        .filter(|b| !b.is_empty())
                        .map(|b| vec![b.into_bytes()])
                        .unwrap_or_default(),
                    trailers: r.trailers.to_map(),
                }
            }
        };
        Ok(Request {
            headers: self.headers.to_map(),
            body_chunks: chunks,
            trailers: self.trailers.to_map(),
            properties,
            metadata: self.metadata,
            response,
        })
    }
}

/// Headers as a JSON list of `[name, value]` pairs (values lossily decoded).
pub fn ser_headers<S: Serializer>(map: &HeaderMap, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(map.iter().map(|(k, v)| (k, String::from_utf8_lossy(v))))
}

/// Bytes as text (lossily decoded).
pub fn ser_bytes<S: Serializer, B: AsRef<[u8]>>(bytes: &B, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(bytes.as_ref()))
}
