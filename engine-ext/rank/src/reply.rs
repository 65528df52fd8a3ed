//! What the rank answers, in each API's own wire format: non-streaming JSON
//! bodies, SSE event streams, usage objects (with the `tether` timing extension)
//! and API-shaped errors.
//!
//! Formats follow the public APIs and vLLM's server: Chat Completions chunks
//! (`chat.completion.chunk`, a role chunk first, `finish_reason` on the last
//! chunk, a `choices: []` usage chunk when `stream_options.include_usage`,
//! `data: [DONE]`); legacy Completions (`text_completion`, same framing);
//! Responses (`event:`-named semantic events with `sequence_number`, ending with
//! `response.completed`, no `[DONE]`); Anthropic Messages (`message_start`,
//! `content_block_start`, `ping`, `content_block_delta`…, `content_block_stop`,
//! `message_delta`, `message_stop`). Errors: `{"error": {message, type, param,
//! code}}` (vLLM's shape) for the OpenAI APIs and unknown paths; `{"type":
//! "error", "error": {type, message}}` for Anthropic.

use crate::engine::Outcome;
use crate::request::BadReason;
use serde_json::{Value, json};
use tether_wire::Api;

/// Response header names carrying simulated timing: defined once in the wire
/// contract (`tether_wire::headers::reply`, docs/wire.md).
pub use tether_wire::headers::reply as headers;

/// Words of the simulated model's answer; each is one token under the prompt
/// contract, and none needs JSON escaping.
const WORDS: [&str; 32] = [
    "the", "agent", "reads", "a", "file", "and", "runs", "tests", "then", "edits", "code", "so",
    "every", "turn", "keeps", "its", "cache", "warm", "while", "tools", "return", "results",
    "quickly", "to", "one", "rank", "that", "holds", "prompt", "state", "for", "reuse",
];

/// The `i`-th piece of the answer (leading space after the first).
pub fn piece(i: usize) -> String {
    let w = WORDS[i % WORDS.len()];
    if i == 0 {
        w.to_owned()
    } else {
        format!(" {w}")
    }
}

/// The whole answer of `n` tokens.
pub fn answer(n: usize) -> String {
    let mut s = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[i % WORDS.len()]);
    }
    s
}

/// Identity of one response.
#[derive(Debug, Clone)]
pub struct Meta {
    /// Unique number, rendered into the API's id format.
    pub id: u64,
    /// Model name echoed back.
    pub model: String,
    /// Unix seconds at arrival.
    pub created: u64,
    /// DP rank that serves it.
    pub dp_rank: usize,
}

impl Meta {
    fn id_for(&self, api: Api) -> String {
        match api {
            Api::Chat => format!("chatcmpl-{:016x}", self.id),
            Api::Completions => format!("cmpl-{:016x}", self.id),
            Api::Responses => format!("resp_{:016x}", self.id),
            Api::Messages => format!("msg_{:016x}", self.id),
        }
    }

    fn item_id(&self) -> String {
        format!("msg_{:016x}", self.id)
    }
}

/// The `tether` usage extension: simulated timing and where the cached tokens came from.
pub fn tether_usage(o: &Outcome, dp_rank: usize) -> Value {
    json!({
        "dp_rank": dp_rank,
        "sim_arrival_ms": round3(o.arrival),
        "sim_queue_ms": round3(o.queue_ms()),
        "sim_ttft_ms": round3(o.ttft_ms()),
        "sim_itl_ms": round3(o.itl_ms()),
        "sim_e2e_ms": round3(o.e2e_ms()),
        "sim_restore_ms": round3(o.restore_ms),
        "device_cached_tokens": o.device_cached_tokens,
        "restored_tokens": o.restored_tokens,
        "computed_tokens": o.computed_tokens(),
        "transferred_tokens": o.transferred_tokens,
        "sim_transfer_ms": round3(o.transfer_ms),
        "restore_miss": o.restore_miss,
    })
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// The API's usage object for a finished request.
pub fn usage(api: Api, o: &Outcome, dp_rank: usize) -> Value {
    let (p, c, n) = (o.prompt_tokens, o.cached_tokens, o.output_tokens);
    let ext = tether_usage(o, dp_rank);
    match api {
        Api::Chat | Api::Completions => json!({
            "prompt_tokens": p,
            "completion_tokens": n,
            "total_tokens": p + n,
            "prompt_tokens_details": {"cached_tokens": c},
            "tether": ext,
        }),
        Api::Responses => json!({
            "input_tokens": p,
            "input_tokens_details": {"cached_tokens": c},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + n,
            "tether": ext,
        }),
        // Anthropic counts cache reads apart from input: input + cache_read = prompt.
        Api::Messages => json!({
            "input_tokens": p - c,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": c,
            "output_tokens": n,
            "tether": ext,
        }),
    }
}

fn response_object(meta: &Meta, status: &str, output: Value, usage: Value) -> Value {
    json!({
        "id": meta.id_for(Api::Responses),
        "object": "response",
        "created_at": meta.created,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "metadata": {},
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": true,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "usage": usage,
    })
}

fn message_item(meta: &Meta, status: &str, text: Option<&str>) -> Value {
    let content = match text {
        Some(t) => json!([{"type": "output_text", "text": t, "annotations": []}]),
        None => json!([]),
    };
    json!({"id": meta.item_id(), "type": "message", "status": status, "role": "assistant", "content": content})
}

/// The non-streaming response body.
pub fn body(api: Api, meta: &Meta, o: &Outcome) -> Vec<u8> {
    let text = answer(o.output_tokens);
    let u = usage(api, o, meta.dp_rank);
    let v = match api {
        Api::Chat => json!({
            "id": meta.id_for(api),
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": u,
        }),
        Api::Completions => json!({
            "id": meta.id_for(api),
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "stop"}],
            "usage": u,
        }),
        Api::Responses => response_object(
            meta,
            "completed",
            json!([message_item(meta, "completed", Some(&text))]),
            u,
        ),
        Api::Messages => json!({
            "id": meta.id_for(api),
            "type": "message",
            "role": "assistant",
            "model": meta.model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": u,
        }),
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The error body for `reason` in the shape of `api` (`None`: an unknown path,
/// answered in the OpenAI shape).
pub fn error_body(api: Option<Api>, reason: BadReason, message: &str) -> Vec<u8> {
    let status = reason.status();
    let v = if api == Some(Api::Messages) {
        let kind = match status {
            404 => "not_found_error",
            413 => "request_too_large",
            500 => "api_error",
            _ => "invalid_request_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    } else {
        let kind = match status {
            404 => "NotFoundError",
            405 => "MethodNotAllowed",
            413 => "RequestEntityTooLarge",
            500 => "InternalServerError",
            _ => "BadRequestError",
        };
        json!({"error": {"message": message, "type": kind, "param": null, "code": status}})
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

fn data(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(b"data: ");
    let _ = serde_json::to_writer(&mut *out, v);
    out.extend_from_slice(b"\n\n");
}

fn event(out: &mut Vec<u8>, name: &str, v: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.push(b'\n');
    data(out, v);
}

/// Renders one streaming response, frame by frame.
#[derive(Debug)]
pub struct Stream {
    api: Api,
    meta: Meta,
    include_usage: bool,
    seq: u64,
    sent: usize,
    text: String,
    /// Bytes before and after the token text in a token frame.
    token_frame: (Vec<u8>, Vec<u8>),
}

impl Stream {
    /// A stream for `api`.
    pub fn new(api: Api, meta: Meta, include_usage: bool) -> Self {
        // A token frame is a fixed JSON with the token text spliced in; the
        // placeholder never occurs elsewhere in it.
        const HOLE: &str = "\u{1}HOLE\u{1}";
        let mut s = Self {
            api,
            meta,
            include_usage,
            seq: 0,
            sent: 0,
            text: String::new(),
            token_frame: (Vec::new(), Vec::new()),
        };
        let mut frame = Vec::new();
        match api {
            Api::Chat => data(
                &mut frame,
                &s.chat_chunk(json!({"content": HOLE}), Value::Null),
            ),
            Api::Completions => data(&mut frame, &s.completion_chunk(HOLE, Value::Null)),
            Api::Messages => event(
                &mut frame,
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": HOLE}}),
            ),
            // Responses frames carry a sequence number: rendered per token.
            Api::Responses => {}
        }
        let hole = serde_json::to_string(HOLE).unwrap_or_default();
        let hole = &hole[1..hole.len() - 1];
        if let Some(at) = find(&frame, hole.as_bytes()) {
            s.token_frame = (frame[..at].to_vec(), frame[at + hole.len()..].to_vec());
        }
        s
    }

    fn chat_chunk(&self, delta: Value, finish: Value) -> Value {
        let mut v = json!({
            "id": self.meta.id_for(Api::Chat),
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn completion_chunk(&self, text: &str, finish: Value) -> Value {
        let mut v = json!({
            "id": self.meta.id_for(Api::Completions),
            "object": "text_completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    fn resp_event(&mut self, name: &str, mut v: Value, out: &mut Vec<u8>) {
        v["type"] = json!(name);
        v["sequence_number"] = json!(self.next_seq());
        event(out, name, &v);
    }

    /// Frames up to and including the first token; `prompt` and `cached` fill
    /// the usage the API announces before the answer (Anthropic `message_start`).
    pub fn start(&mut self, prompt: usize, cached: usize, out: &mut Vec<u8>) {
        let m = self.meta.clone();
        match self.api {
            Api::Chat => {
                data(
                    out,
                    &self.chat_chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                );
            }
            Api::Completions => {}
            Api::Responses => {
                let r = response_object(&m, "in_progress", json!([]), Value::Null);
                self.resp_event("response.created", json!({"response": r}), out);
                self.resp_event("response.in_progress", json!({"response": r}), out);
                self.resp_event(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": message_item(&m, "in_progress", None)}),
                    out,
                );
                self.resp_event(
                    "response.content_part.added",
                    json!({"item_id": m.item_id(), "output_index": 0, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": []}}),
                    out,
                );
            }
            Api::Messages => {
                event(
                    out,
                    "message_start",
                    &json!({"type": "message_start", "message": {
                    "id": m.id_for(Api::Messages), "type": "message", "role": "assistant",
                    "model": m.model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": prompt - cached.min(prompt), "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": cached, "output_tokens": 1}}}),
                );
                event(
                    out,
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
                );
                event(out, "ping", &json!({"type": "ping"}));
            }
        }
        self.token(out);
    }

    /// The next token's frame.
    pub fn token(&mut self, out: &mut Vec<u8>) {
        let p = piece(self.sent);
        self.sent += 1;
        if self.api == Api::Responses {
            self.text.push_str(&p);
            let id = self.meta.item_id();
            self.resp_event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": p, "logprobs": []}),
                out,
            );
            return;
        }
        out.extend_from_slice(&self.token_frame.0);
        out.extend_from_slice(p.as_bytes());
        out.extend_from_slice(&self.token_frame.1);
    }

    /// Tokens not yet sent, then the closing frames with usage.
    pub fn finish(&mut self, o: &Outcome, out: &mut Vec<u8>) {
        while self.sent < o.output_tokens {
            self.token(out);
        }
        let u = usage(self.api, o, self.meta.dp_rank);
        let m = self.meta.clone();
        match self.api {
            Api::Chat => {
                data(out, &self.chat_chunk(json!({}), json!("stop")));
                if self.include_usage {
                    let mut v = self.chat_chunk(json!({}), Value::Null);
                    v["choices"] = json!([]);
                    v["usage"] = u;
                    data(out, &v);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Api::Completions => {
                data(out, &self.completion_chunk("", json!("stop")));
                if self.include_usage {
                    let mut v = self.completion_chunk("", Value::Null);
                    v["choices"] = json!([]);
                    v["usage"] = u;
                    data(out, &v);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            Api::Responses => {
                let text = std::mem::take(&mut self.text);
                let id = m.item_id();
                self.resp_event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
                    out,
                );
                self.resp_event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": 0, "content_index": 0,
                           "part": {"type": "output_text", "text": text, "annotations": []}}),
                    out,
                );
                let item = message_item(&m, "completed", Some(&text));
                self.resp_event(
                    "response.output_item.done",
                    json!({"output_index": 0, "item": item}),
                    out,
                );
                let r = response_object(&m, "completed", json!([item]), u);
                self.resp_event("response.completed", json!({"response": r}), out);
            }
            Api::Messages => {
                event(
                    out,
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                );
                event(
                    out,
                    "message_delta",
                    &json!({"type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": u}),
                );
                event(out, "message_stop", &json!({"type": "message_stop"}));
            }
        }
    }

    /// An error after the stream began.
    pub fn error(&mut self, message: &str, out: &mut Vec<u8>) {
        match self.api {
            Api::Messages => event(
                out,
                "error",
                &json!({"type": "error",
                "error": {"type": "api_error", "message": message}}),
            ),
            Api::Responses => {
                let mut r = response_object(&self.meta.clone(), "failed", json!([]), Value::Null);
                r["error"] = json!({"code": "server_error", "message": message});
                self.resp_event("response.failed", json!({"response": r}), out);
            }
            Api::Chat | Api::Completions => {
                data(
                    out,
                    &json!({"error": {"message": message, "type": "InternalServerError",
                    "param": null, "code": 500}}),
                );
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
    }
}

/// Splits an SSE body into frames: each frame's `event:` name (if any) and its
/// `data:`. Refuses lines of any other kind (this server writes no others).
pub fn parse_sse(text: &str) -> Result<Vec<(Option<String>, String)>, String> {
    let mut frames = Vec::new();
    for f in text.split("\n\n").filter(|f| !f.trim().is_empty()) {
        let mut name = None;
        let mut data = String::new();
        for line in f.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_owned());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = d.to_owned();
            } else {
                return Err(format!("unexpected SSE line {line:?}"));
            }
        }
        frames.push((name, data));
    }
    Ok(frames)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests;
