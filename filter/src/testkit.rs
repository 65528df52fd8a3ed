//! Test bodies: conversations in each API's shape, serialized in the official
//! SDKs' key order or in hand-written orders, and a fetch over a slice that
//! records what the filter read.

use crate::api::Api;
use serde_json::{Value, json};

/// Key orders seen with the official SDKs (DESIGN.md) and hand-written ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Chat `{"model","messages",…,"metadata","user"}`; Responses
    /// `{"model","input","instructions","prompt_cache_key"}`; Anthropic
    /// `{"max_tokens","messages","model","metadata","system"}`.
    Sdk,
    /// Identity and head fields first, conversation last.
    IdsFirst,
    /// Identity fields in the middle, the conversation first.
    Middle,
}

/// Serializes `members` (name, value) as one object in the given order of names.
pub fn object(members: &[(&str, Value)], order: &[&str]) -> Vec<u8> {
    let mut out = b"{".to_vec();
    let mut first = true;
    let mut push = |k: &str, v: &Value| {
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(serde_json::to_string(k).unwrap_or_default().as_bytes());
        out.push(b':');
        out.extend_from_slice(serde_json::to_string(v).unwrap_or_default().as_bytes());
    };
    for name in order {
        if let Some((k, v)) = members.iter().find(|(k, _)| k == name) {
            push(k, v);
        }
    }
    for (k, v) in members {
        if !order.contains(k) {
            push(k, v);
        }
    }
    out.push(b'}');
    out
}

/// Key order for an API.
pub fn order_of(api: Api, order: Order) -> Vec<&'static str> {
    let v: &[&str] = match (api, order) {
        (Api::Chat, Order::Sdk) => &["model", "messages", "stream", "tools", "metadata", "user"],
        (Api::Responses, Order::Sdk) => &[
            "model",
            "input",
            "instructions",
            "prompt_cache_key",
            "tools",
        ],
        (Api::Messages, Order::Sdk) => &[
            "max_tokens",
            "messages",
            "model",
            "metadata",
            "system",
            "tools",
        ],
        (Api::Completions, Order::Sdk) => &["model", "prompt", "user"],
        (_, Order::IdsFirst) => &[
            "session_id",
            "prompt_cache_key",
            "user",
            "metadata",
            "vllm_xargs",
            "nvext",
            "system",
            "instructions",
            "tools",
            "model",
            "max_tokens",
            "messages",
            "input",
            "prompt",
        ],
        (_, Order::Middle) => &[
            "messages",
            "input",
            "prompt",
            "model",
            "session_id",
            "prompt_cache_key",
            "user",
            "metadata",
            "vllm_xargs",
            "nvext",
            "system",
            "instructions",
            "tools",
        ],
    };
    v.to_vec()
}

/// One agent conversation, format-neutral: system prompt, tools, turns.
#[derive(Debug, Clone)]
pub struct Convo {
    pub system: String,
    pub tools: Vec<&'static str>,
    pub first_user: String,
    /// Later turns, in order.
    pub turns: Vec<Step>,
    /// Extra top-level members (identity fields).
    pub extra: Vec<(&'static str, Value)>,
}

/// A step after the first user message.
#[derive(Debug, Clone)]
pub enum Step {
    /// Assistant answer, then a user reply.
    User(String),
    /// Assistant calls `tool` (id), then its result.
    Tool {
        id: String,
        tool: String,
        result: String,
    },
    /// Assistant calls several tools at once, then all results.
    Parallel(Vec<(String, String)>),
}

impl Convo {
    pub fn new(system: &str, first_user: &str) -> Self {
        Self {
            system: system.to_owned(),
            tools: vec!["Read", "Task"],
            first_user: first_user.to_owned(),
            turns: Vec::new(),
            extra: Vec::new(),
        }
    }

    pub fn with(mut self, step: Step) -> Self {
        self.turns.push(step);
        self
    }

    pub fn extra(mut self, k: &'static str, v: Value) -> Self {
        self.extra.push((k, v));
        self
    }

    fn tools_json(&self, api: Api) -> Value {
        let t: Vec<Value> = self
            .tools
            .iter()
            .map(|n| match api {
                Api::Messages => json!({"name": n, "description": format!("tool {n}"), "input_schema": {"type": "object"}}),
                Api::Responses => json!({"type": "function", "name": n, "parameters": {"type": "object"}}),
                _ => json!({"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}),
            })
            .collect();
        Value::Array(t)
    }

    /// The conversation array in the API's shape.
    pub fn conversation(&self, api: Api) -> Value {
        let mut m: Vec<Value> = Vec::new();
        match api {
            Api::Chat => {
                m.push(json!({"role": "system", "content": self.system}));
                m.push(json!({"role": "user", "content": self.first_user}));
                for s in &self.turns {
                    match s {
                        Step::User(t) => {
                            m.push(json!({"role": "assistant", "content": "ok"}));
                            m.push(json!({"role": "user", "content": t}));
                        }
                        Step::Tool { id, tool, result } => {
                            m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": tool, "arguments": "{}"}}]}));
                            m.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                        }
                        Step::Parallel(calls) => {
                            let tc: Vec<Value> = calls.iter().map(|(id, tool)| json!({"id": id, "type": "function", "function": {"name": tool, "arguments": "{}"}})).collect();
                            m.push(json!({"role": "assistant", "content": null, "tool_calls": tc}));
                            for (id, _) in calls {
                                m.push(json!({"role": "tool", "tool_call_id": id, "content": "r"}));
                            }
                        }
                    }
                }
            }
            Api::Responses => {
                m.push(json!({"role": "user", "content": self.first_user}));
                for s in &self.turns {
                    match s {
                        Step::User(t) => {
                            m.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}));
                            m.push(json!({"type": "message", "role": "user", "content": t}));
                        }
                        Step::Tool { id, tool, result } => {
                            m.push(json!({"type": "reasoning", "summary": []}));
                            m.push(json!({"type": "function_call", "call_id": id, "name": tool, "arguments": "{}"}));
                            m.push(json!({"type": "function_call_output", "call_id": id, "output": result}));
                        }
                        Step::Parallel(calls) => {
                            for (id, tool) in calls {
                                m.push(json!({"type": "function_call", "call_id": id, "name": tool, "arguments": "{}"}));
                            }
                            for (id, _) in calls {
                                m.push(json!({"type": "function_call_output", "call_id": id, "output": "r"}));
                            }
                        }
                    }
                }
            }
            Api::Messages => {
                // Claude Code style: cache_control sits on the newest user message only.
                let n = self.turns.len();
                let cc = |i: usize| {
                    if i == n {
                        json!({"type": "ephemeral"})
                    } else {
                        Value::Null
                    }
                };
                let mut first =
                    json!({"role": "user", "content": [{"type": "text", "text": self.first_user}]});
                if n == 0 {
                    first["content"][0]["cache_control"] = cc(0);
                }
                m.push(first);
                for (i, s) in self.turns.iter().enumerate() {
                    match s {
                        Step::User(t) => {
                            m.push(json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}));
                            let mut u =
                                json!({"role": "user", "content": [{"type": "text", "text": t}]});
                            if i + 1 == n {
                                u["content"][0]["cache_control"] = cc(n);
                            }
                            m.push(u);
                        }
                        Step::Tool { id, tool, result } => {
                            m.push(json!({"role": "assistant", "content": [{"type": "text", "text": "calling"}, {"type": "tool_use", "id": id, "name": tool, "input": {}}]}));
                            m.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": result}]}));
                        }
                        Step::Parallel(calls) => {
                            let uses: Vec<Value> = calls.iter().map(|(id, tool)| json!({"type": "tool_use", "id": id, "name": tool, "input": {}})).collect();
                            m.push(json!({"role": "assistant", "content": uses}));
                            let res: Vec<Value> = calls.iter().map(|(id, _)| json!({"type": "tool_result", "tool_use_id": id, "content": "r"})).collect();
                            m.push(json!({"role": "user", "content": res}));
                        }
                    }
                }
            }
            Api::Completions => {
                return Value::String(format!("{}\n{}", self.system, self.first_user));
            }
        }
        Value::Array(m)
    }

    /// The request body for `api` in `order`.
    pub fn body(&self, api: Api, order: Order) -> Vec<u8> {
        let mut members: Vec<(&str, Value)> = vec![("model", json!("m"))];
        members.push((api.conversation_key(), self.conversation(api)));
        match api {
            Api::Chat => members.push(("tools", self.tools_json(api))),
            Api::Responses => {
                members.push(("instructions", json!(self.system)));
                members.push(("tools", self.tools_json(api)));
            }
            Api::Messages => {
                members.push(("max_tokens", json!(1024)));
                members.push(("system", json!([{"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}])));
                members.push(("tools", self.tools_json(api)));
            }
            Api::Completions => {}
        }
        for (k, v) in &self.extra {
            members.retain(|(n, _)| n != k);
            members.push((k, v.clone()));
        }
        object(&members, &order_of(api, order))
    }
}

/// A fetch over a body slice that records the bytes handed out.
pub struct SliceFetch<'a> {
    pub body: &'a [u8],
    pub fetched: usize,
}

impl<'a> SliceFetch<'a> {
    pub fn new(body: &'a [u8]) -> Self {
        Self { body, fetched: 0 }
    }

    pub fn fetch(&mut self, start: usize, len: usize) -> Option<Vec<u8>> {
        let end = start.checked_add(len)?.min(self.body.len());
        let v = self.body.get(start..end)?.to_vec();
        self.fetched += v.len();
        Some(v)
    }
}

/// Headers as the host gives them.
pub fn headers(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect()
}

pub const ALL_APIS: [Api; 4] = [Api::Chat, Api::Responses, Api::Messages, Api::Completions];
pub const ALL_ORDERS: [Order; 3] = [Order::Sdk, Order::IdsFirst, Order::Middle];

/// A view holding the whole body (as a read that took it all).
pub fn whole_view(body: &[u8]) -> crate::read::scan::View {
    crate::read::scan::View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    }
}

/// `body` compressed as a client would send it with `content-encoding: enc`.
pub fn compress(enc: crate::read::encoding::Encoding, body: &[u8]) -> Vec<u8> {
    use crate::read::encoding::Encoding;
    use std::io::Write;
    match enc {
        Encoding::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            let _ = e.write_all(body);
            e.finish().unwrap_or_default()
        }
        Encoding::Deflate => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            let _ = e.write_all(body);
            e.finish().unwrap_or_default()
        }
        Encoding::Zstd => {
            ruzstd::encoding::compress_to_vec(body, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}
