//! Agent conversations as the wire APIs send them (Anthropic Messages, OpenAI
//! Chat Completions, OpenAI Responses; legacy Completions as one flattened
//! prompt), growing turn by turn.
//!
//! Bodies are written with a fixed top-level key order, as the official SDKs
//! send them (identity fields after the conversation array), which a
//! `serde_json::Value` map cannot do (it sorts keys).

use serde_json::{Value, json};

pub use tether_wire::Api;

/// One conversation: a system prompt, tools, and the items so far.
#[derive(Debug, Clone)]
pub struct Conversation {
    api: Api,
    system: String,
    tools: Vec<String>,
    items: Vec<Value>,
}

impl Conversation {
    /// A conversation opened by `first_user`, with these tool names.
    pub fn new(api: Api, system: &str, tools: &[&str], first_user: &str) -> Self {
        let mut c = Self {
            api,
            system: system.to_owned(),
            tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            items: Vec::new(),
        };
        c.user(first_user);
        c
    }

    pub fn api(&self) -> Api {
        self.api
    }

    /// Items in the conversation array (system excluded).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// A user message.
    pub fn user(&mut self, text: &str) {
        self.items.push(json!({"role": "user", "content": text}));
    }

    /// An assistant text reply.
    pub fn assistant(&mut self, text: &str) {
        let item = match self.api {
            Api::Messages => {
                json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
            }
            Api::Chat | Api::Completions => json!({"role": "assistant", "content": text}),
            Api::Responses => {
                json!({"role": "assistant", "content": [{"type": "output_text", "text": text}]})
            }
        };
        self.items.push(item);
    }

    /// An assistant tool call followed by its result (what the agent harness
    /// sends on the next turn).
    pub fn tool_round(&mut self, call_id: &str, tool: &str, args: Value, result: &str) {
        match self.api {
            Api::Messages => {
                self.items.push(json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": call_id, "name": tool, "input": args}]}));
                self.items.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call_id, "content": result}]}));
            }
            Api::Chat | Api::Completions => {
                self.items.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": tool, "arguments": args.to_string()}}]}));
                self.items
                    .push(json!({"role": "tool", "tool_call_id": call_id, "content": result}));
            }
            Api::Responses => {
                self.items.push(json!({"type": "function_call", "call_id": call_id, "name": tool, "arguments": args.to_string()}));
                self.items.push(
                    json!({"type": "function_call_output", "call_id": call_id, "output": result}),
                );
            }
        }
    }

    /// Legacy Completions has no roles: the system prompt and every item as
    /// `role: text` lines, the way a completion-style harness flattens a chat.
    fn flat_prompt(&self) -> String {
        let mut out = self.system.clone();
        for item in &self.items {
            let role = item["role"].as_str().unwrap_or("tool");
            let text = match &item["content"] {
                Value::String(t) => t.clone(),
                Value::Null => item["tool_calls"].to_string(),
                other => other.to_string(),
            };
            out.push_str(&format!("\n\n{role}: {text}"));
        }
        out
    }

    fn tool_schemas(&self) -> Value {
        let schema = json!({"type": "object", "properties": {"arg": {"type": "string"}}});
        Value::Array(
            self.tools
                .iter()
                .map(|t| match self.api {
                    Api::Messages => json!({"name": t, "description": format!("tool {t}"), "input_schema": schema}),
                    Api::Chat | Api::Completions => json!({"type": "function", "function": {"name": t, "parameters": schema}}),
                    Api::Responses => json!({"type": "function", "name": t, "parameters": schema}),
                })
                .collect(),
        )
    }

    /// The request body with `identity` fields (top-level, e.g.
    /// `("metadata", {"user_id": …})` or `("prompt_cache_key", "…")`) placed
    /// where the SDKs put them: after the conversation.
    pub fn body(&self, identity: &[(&str, Value)]) -> String {
        let items = Value::Array(self.items.clone());
        let mut fields: Vec<(&str, Value)> = match self.api {
            Api::Messages => vec![
                ("max_tokens", json!(1024)),
                ("messages", items),
                ("model", json!("claude-sonnet-4-5")),
            ],
            Api::Chat => {
                let mut msgs = vec![json!({"role": "system", "content": self.system})];
                msgs.extend(self.items.iter().cloned());
                vec![("model", json!("gpt-5")), ("messages", Value::Array(msgs))]
            }
            Api::Responses => vec![
                ("model", json!("gpt-5")),
                ("input", items),
                ("instructions", json!(self.system)),
            ],
            Api::Completions => vec![
                ("model", json!("gpt-3.5-turbo-instruct")),
                ("prompt", json!(self.flat_prompt())),
            ],
        };
        if self.api == Api::Messages {
            fields.push(("system", json!(self.system)));
        }
        if !self.tools.is_empty() && self.api != Api::Completions {
            fields.push(("tools", self.tool_schemas()));
        }
        fields.extend(identity.iter().cloned());
        ordered_object(&fields)
    }
}

/// A JSON object with keys in the given order.
pub fn ordered_object(fields: &[(&str, Value)]) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::String((*k).to_owned()).to_string());
        out.push(':');
        out.push_str(&v.to_string());
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_valid_json_with_sdk_key_order() {
        let mut c = Conversation::new(Api::Messages, "You plan.", &["Task"], "fix the bug");
        c.tool_round("t1", "Task", json!({"arg": "x"}), "done");
        let body = c.body(&[("metadata", json!({"user_id": "u"}))]);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["messages"].as_array().unwrap().len(), 3);
        let (m, s, md) = (
            body.find("\"messages\"").unwrap(),
            body.find("\"system\"").unwrap(),
            body.find("\"metadata\"").unwrap(),
        );
        assert!(
            m < s && s < md,
            "SDK order: messages, system, metadata: {body}"
        );
    }

    #[test]
    fn each_api_shapes_tool_rounds_its_own_way() {
        for (api, marker) in [
            (Api::Messages, "tool_result"),
            (Api::Chat, "\"role\":\"tool\""),
            (Api::Responses, "function_call_output"),
            (Api::Completions, "\\n\\ntool: r"),
        ] {
            let mut c = Conversation::new(api, "s", &["grep"], "q");
            c.tool_round("c1", "grep", json!({}), "r");
            let body = c.body(&[]);
            assert!(body.contains(marker), "{api:?}: {body}");
            serde_json::from_str::<Value>(&body).unwrap();
        }
    }
}
