//! How a layout becomes the prompt members of a request body in each API, and
//! how many structural tokens each message costs there.
//!
//! Under the simulated tokenizer (`tether_rank_engine::prompt`) every JSON string of
//! a prompt member is text and object members are read in key order, so each
//! message here is built by walking its members in that order: the words of
//! its text at the positions the layout gives them, every other string (a role
//! name, a tool-call id, a content-block type) one structural token. The
//! words come first in every shape except a Responses `function_call_output`,
//! whose `call_id` sorts before `output`.

use super::layout::{Call, Kind, Layout};
use crate::trace::{Api, RequestId};
use serde_json::{Value, json};

/// Structural tokens of a message before and after its words (canonical order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Before the words.
    pub before: u64,
    /// After the words.
    pub after: u64,
}

impl Shape {
    const fn new(before: u64, after: u64) -> Self {
        Self { before, after }
    }
    /// All structural tokens.
    pub const fn overhead(self) -> u64 {
        self.before + self.after
    }
}

/// The shape of a message kind in an API.
pub fn shape(api: Api, kind: Kind) -> Shape {
    match (api, kind) {
        // role
        (_, Kind::User) | (_, Kind::Assistant(None)) => Shape::new(0, 1),
        // Chat: role, {function: {arguments, name}, id, type}
        // Messages: text-block type, {id, input, name, type}, role
        // Responses: role; {arguments, call_id, name, type}
        // Completions: marker, call marker, name, id
        (Api::Chat | Api::Messages | Api::Responses, Kind::Assistant(Some(_))) => Shape::new(0, 5),
        (Api::Completions, Kind::Assistant(Some(_))) => Shape::new(0, 4),
        // Chat: role, tool_call_id; Completions: marker, id
        (Api::Chat | Api::Completions, Kind::ToolResult(_)) => Shape::new(0, 2),
        // Messages: tool_use_id, type; role
        (Api::Messages, Kind::ToolResult(_)) => Shape::new(0, 3),
        // Responses: call_id before `output`, type after
        (Api::Responses, Kind::ToolResult(_)) => Shape::new(1, 1),
    }
}

/// Structural tokens of a message kind in an API.
pub fn overhead(api: Api, kind: Kind) -> u64 {
    shape(api, kind).overhead()
}

/// Structural tokens of one tool schema.
pub const fn tool_overhead(api: Api) -> u64 {
    match api {
        // {function: {description, name, parameters: {type}}, type}
        Api::Chat | Api::Responses => 3,
        // {description, input_schema: {type}, name}
        Api::Messages => 2,
        // one marker for all tools
        Api::Completions => 1,
    }
}

/// Structural tokens of the system prompt.
pub const fn system_overhead(api: Api) -> u64 {
    match api {
        // a system message's role; a marker
        Api::Chat | Api::Completions => 1,
        // a top-level string
        Api::Messages | Api::Responses => 0,
    }
}

/// Fewest tokens a tools member can have (one tool, one word).
pub const fn tools_min(api: Api) -> u64 {
    tool_overhead(api) + 1
}

/// Fewest tokens a system prompt can have (one word).
pub const fn system_min(api: Api) -> u64 {
    system_overhead(api) + 1
}

/// Tokens of one tool schema at most; more tools when the schemas are longer.
const TOOL_TOKENS: u64 = 1_000;

/// The tool schemas' word counts for `tokens` tool tokens.
fn tool_split(api: Api, tokens: u64) -> Vec<u64> {
    if api == Api::Completions {
        return vec![tokens - 1];
    }
    let oh = tool_overhead(api);
    let n = tokens.div_ceil(TOOL_TOKENS).min(tokens / (oh + 1)).max(1);
    let words = tokens - n * oh;
    (0..n)
        .map(|i| words / n + u64::from(i < words % n))
        .collect()
}

/// Produces words: `(src, from, to)` → the words of positions `from..to` of
/// request `src`'s prompt.
pub type Words<'a> = dyn FnMut(RequestId, u64, u64) -> String + 'a;

/// Walks the token stream, handing out positions.
struct Cursor<'a, 'b> {
    pos: u64,
    words: &'a mut Words<'b>,
}

impl Cursor<'_, '_> {
    /// The words of the next `n` positions, from `src`.
    fn text(&mut self, src: RequestId, n: u64) -> String {
        let s = (self.words)(src, self.pos, self.pos + n);
        self.pos += n;
        s
    }
    /// One structural token.
    fn lit<T: Into<Value>>(&mut self, v: T) -> Value {
        self.pos += 1;
        v.into()
    }
}

fn call_id(api: Api, c: Call) -> String {
    match api {
        Api::Messages => format!("toolu_{}", c.n),
        _ => format!("call_{}", c.n),
    }
}

/// The prompt members of a body (`tools`, `system`/`instructions`,
/// `messages`/`input`, or `prompt`), in the order SDKs write them.
pub fn prompt_members(layout: &Layout, words: &mut Words<'_>) -> Vec<(&'static str, Value)> {
    let api = layout.api;
    let p = layout.preamble;
    let mut c = Cursor { pos: 0, words };
    let tools = |c: &mut Cursor<'_, '_>| -> Option<Value> {
        if p.tools == 0 {
            return None;
        }
        let mut out = Vec::new();
        for (i, n) in tool_split(api, p.tools).into_iter().enumerate() {
            let name = format!("tool_{}", i + 1);
            let t = match api {
                Api::Chat => {
                    let d = c.text(p.src, n);
                    let name = c.lit(name);
                    let obj = c.lit("object");
                    let f = c.lit("function");
                    json!({"type": f, "function": {"name": name, "description": d,
                        "parameters": {"type": obj, "properties": {}}}})
                }
                Api::Responses => {
                    let d = c.text(p.src, n);
                    let name = c.lit(name);
                    let obj = c.lit("object");
                    let f = c.lit("function");
                    json!({"type": f, "name": name, "description": d,
                        "parameters": {"type": obj, "properties": {}}})
                }
                Api::Messages => {
                    let d = c.text(p.src, n);
                    let obj = c.lit("object");
                    let name = c.lit(name);
                    json!({"name": name, "description": d,
                        "input_schema": {"type": obj, "properties": {}}})
                }
                Api::Completions => {
                    let d = c.text(p.src, n);
                    c.pos += 1;
                    json!(format!("{d} <|tools|>"))
                }
            };
            out.push(t);
        }
        Some(Value::Array(out))
    };
    let mut members: Vec<(&'static str, Value)> = Vec::new();
    match api {
        Api::Chat => {
            let t = tools(&mut c);
            let mut msgs = Vec::new();
            if p.system > 0 {
                let w = c.text(p.src, p.system - 1);
                let role = c.lit("system");
                msgs.push(json!({"role": role, "content": w}));
            }
            for m in &layout.msgs {
                msgs.push(chat_message(&mut c, m.kind, m.src, m.len));
            }
            members.push(("messages", Value::Array(msgs)));
            if let Some(t) = t {
                members.push(("tools", t));
            }
        }
        Api::Messages => {
            let system = (p.system > 0).then(|| c.text(p.src, p.system));
            let t = tools(&mut c);
            let msgs: Vec<Value> = layout
                .msgs
                .iter()
                .map(|m| messages_message(&mut c, m.kind, m.src, m.len))
                .collect();
            members.push(("messages", Value::Array(msgs)));
            if let Some(s) = system {
                members.push(("system", Value::String(s)));
            }
            if let Some(t) = t {
                members.push(("tools", t));
            }
        }
        Api::Responses => {
            let instructions = (p.system > 0).then(|| c.text(p.src, p.system));
            let t = tools(&mut c);
            let mut items = Vec::new();
            for m in &layout.msgs {
                items.extend(responses_items(&mut c, m.kind, m.src, m.len));
            }
            members.push(("input", Value::Array(items)));
            if let Some(s) = instructions {
                members.push(("instructions", Value::String(s)));
            }
            if let Some(t) = t {
                members.push(("tools", t));
            }
        }
        Api::Completions => {
            let mut prompt = String::new();
            let mut push = |s: &str| {
                if !s.is_empty() {
                    if !prompt.is_empty() {
                        prompt.push(' ');
                    }
                    prompt.push_str(s);
                }
            };
            if let Some(Value::Array(t)) = tools(&mut c) {
                for v in t {
                    push(v.as_str().unwrap_or_default());
                }
            }
            if p.system > 0 {
                let w = c.text(p.src, p.system - 1);
                c.pos += 1;
                push(&w);
                push("<|system|>");
            }
            for m in &layout.msgs {
                let oh = overhead(api, m.kind);
                let w = c.text(m.src, m.len - oh);
                c.pos += oh;
                push(&w);
                match m.kind {
                    Kind::User => push("<|user|>"),
                    Kind::Assistant(None) => push("<|assistant|>"),
                    Kind::Assistant(Some(call)) => {
                        push(&format!(
                            "<|assistant|> <|call|> {} {}",
                            call.tool.name(),
                            call_id(api, call)
                        ));
                    }
                    Kind::ToolResult(call) => push(&format!("<|tool|> {}", call_id(api, call))),
                }
            }
            members.push(("prompt", Value::String(prompt)));
        }
    }
    members
}

fn chat_message(c: &mut Cursor<'_, '_>, kind: Kind, src: RequestId, len: u64) -> Value {
    let w = c.text(src, len - overhead(Api::Chat, kind));
    match kind {
        Kind::User => json!({"role": c.lit("user"), "content": w}),
        Kind::Assistant(None) => json!({"role": c.lit("assistant"), "content": w}),
        Kind::Assistant(Some(call)) => {
            let role = c.lit("assistant");
            let args = c.lit("{}");
            let name = c.lit(call.tool.name());
            let id = c.lit(call_id(Api::Chat, call));
            let f = c.lit("function");
            json!({"role": role, "content": w, "tool_calls": [
                {"id": id, "type": f, "function": {"name": name, "arguments": args}}]})
        }
        Kind::ToolResult(call) => {
            let role = c.lit("tool");
            let id = c.lit(call_id(Api::Chat, call));
            json!({"role": role, "tool_call_id": id, "content": w})
        }
    }
}

fn messages_message(c: &mut Cursor<'_, '_>, kind: Kind, src: RequestId, len: u64) -> Value {
    let w = c.text(src, len - overhead(Api::Messages, kind));
    match kind {
        Kind::User => json!({"role": c.lit("user"), "content": w}),
        Kind::Assistant(None) => json!({"role": c.lit("assistant"), "content": w}),
        Kind::Assistant(Some(call)) => {
            let text = c.lit("text");
            let id = c.lit(call_id(Api::Messages, call));
            let name = c.lit(call.tool.name());
            let tu = c.lit("tool_use");
            let role = c.lit("assistant");
            json!({"role": role, "content": [
                {"type": text, "text": w},
                {"type": tu, "id": id, "name": name, "input": {}}]})
        }
        Kind::ToolResult(call) => {
            let id = c.lit(call_id(Api::Messages, call));
            let tr = c.lit("tool_result");
            let role = c.lit("user");
            json!({"role": role, "content": [{"type": tr, "tool_use_id": id, "content": w}]})
        }
    }
}

fn responses_items(c: &mut Cursor<'_, '_>, kind: Kind, src: RequestId, len: u64) -> Vec<Value> {
    let words = len - overhead(Api::Responses, kind);
    match kind {
        Kind::User => {
            let w = c.text(src, words);
            vec![json!({"role": c.lit("user"), "content": w})]
        }
        Kind::Assistant(None) => {
            let w = c.text(src, words);
            vec![json!({"role": c.lit("assistant"), "content": w})]
        }
        Kind::Assistant(Some(call)) => {
            let w = c.text(src, words);
            let role = c.lit("assistant");
            let args = c.lit("{}");
            let id = c.lit(call_id(Api::Responses, call));
            let name = c.lit(call.tool.name());
            let t = c.lit("function_call");
            vec![
                json!({"role": role, "content": w}),
                json!({"type": t, "call_id": id, "name": name, "arguments": args}),
            ]
        }
        Kind::ToolResult(call) => {
            let id = c.lit(call_id(Api::Responses, call));
            let w = c.text(src, words);
            let t = c.lit("function_call_output");
            vec![json!({"type": t, "call_id": id, "output": w})]
        }
    }
}
