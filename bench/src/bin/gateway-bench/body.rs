//! Deterministic agent-shaped Chat Completions bodies for the gateway benchmark:
//! a system prompt, a tool schema, then user / assistant-tool-call / tool-result
//! turns until the target size, with the identity field after the messages.
//!
//! Real agent prompts are mostly tool results (file contents, command output)
//! with escapes and some non-ASCII text; the generator mixes those in so a
//! body scanner meets what it meets in production. Same inputs, same bytes.

use serde_json::{Value, json};

/// The session id every benchmark request carries (body field or header).
pub const SESSION_ID: &str = "bench-session-7f3a";

/// A splitmix64 stream: tiny, deterministic, good enough to vary words.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

const WORDS: &[&str] = &[
    "the", "function", "returns", "config", "request", "handler", "error", "value", "path", "test",
    "build", "cache", "session", "module", "server", "client", "token", "buffer", "parse", "route",
    "rank", "retry", "timeout", "struct", "field", "option", "result", "string", "vector", "index",
    "file", "line", "commit", "branch", "deploy", "metric", "latency", "upstream", "header",
    "body", "größe", "naïve", "→",
];

const CODE: &[&str] = &[
    "fn main() {\n    let cfg = Config::load(\"app.toml\")?;\n    serve(cfg).await\n}\n",
    "if (x < 0) { throw new Error(\"negative: \" + x); }\n",
    "def handler(event, ctx):\n    return {\"status\": 200, \"body\": json.dumps(event)}\n",
    "SELECT id, name FROM users WHERE created_at > '2026-01-01' ORDER BY id;\n",
    "\tpath := filepath.Join(dir, \"data\\\\out.json\")\n",
    "error[E0382]: borrow of moved value: `buf`\n  --> src/lib.rs:42:9\n",
];

fn sentence(rng: &mut Rng, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(rng.pick(WORDS));
    }
    s.push('.');
    s
}

fn tool_output(rng: &mut Rng, lines: usize) -> String {
    let mut s = String::new();
    for i in 0..lines {
        if i.is_multiple_of(3) {
            s.push_str(rng.pick(CODE));
        } else {
            s.push_str(&format!("{:>4} | {}\n", i + 1, sentence(rng, 10)));
        }
    }
    s
}

fn tools() -> Value {
    let tool = |name: &str, desc: &str, props: Value, required: &[&str]| {
        json!({"type": "function", "function": {
            "name": name, "description": desc,
            "parameters": {"type": "object", "properties": props, "required": required}
        }})
    };
    json!([
        tool(
            "read_file",
            "Read a file from the workspace and return its contents with line numbers.",
            json!({"path": {"type": "string", "description": "Path relative to the workspace root"},
                    "offset": {"type": "integer"}, "limit": {"type": "integer"}}),
            &["path"]
        ),
        tool(
            "run_command",
            "Run a shell command in the sandbox and return stdout, stderr and the exit code.",
            json!({"command": {"type": "string"}, "timeout_ms": {"type": "integer", "minimum": 1}}),
            &["command"]
        ),
        tool(
            "edit_file",
            "Replace an exact string in a file.",
            json!({"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}),
            &["path", "old", "new"]
        ),
        tool(
            "Task",
            "Delegate a self-contained subtask to a subagent and return its final answer.",
            json!({"description": {"type": "string"}, "prompt": {"type": "string"}}),
            &["prompt"]
        ),
    ])
}

/// A Chat Completions request of at least `target_bytes` (the last tool output
/// is cut to fit, so it overshoots by about one short turn). With `body_key`, `prompt_cache_key` = [`SESSION_ID`] follows
/// the messages, as the OpenAI SDK orders it; without, no identity is in the body.
pub fn chat_completion(target_bytes: usize, body_key: bool) -> Vec<u8> {
    let mut rng = Rng(0x7e7e_4e55_0000_0001 ^ target_bytes as u64);
    let system = json!({"role": "system", "content": format!(
        "You are a coding agent working in a large repository. {} Use the tools; \
         never guess file contents. {}", sentence(&mut rng, 40), sentence(&mut rng, 30))});
    let first = json!({"role": "user", "content": format!(
        "Fix the failing test in the retry module. {}", sentence(&mut rng, 25))});
    let tools = tools().to_string();
    let tail_fields = if body_key {
        format!(r#","prompt_cache_key":"{SESSION_ID}""#)
    } else {
        String::new()
    };
    // Everything but the turns: `{"model":…,"messages":[…],"tools":…,…}`.
    let envelope = 200 + tools.len() + tail_fields.len();

    let mut messages = vec![system.to_string(), first.to_string()];
    let mut size = envelope + messages.iter().map(|m| m.len() + 1).sum::<usize>();
    let mut turn = 0u32;
    while size < target_bytes {
        turn += 1;
        let call_id = format!("call_{turn:04}_{:08x}", rng.next() as u32);
        let (name, args) = match turn % 3 {
            0 => (
                "run_command",
                json!({"command": format!("cargo test -p retry -- case_{turn}")}),
            ),
            1 => (
                "read_file",
                json!({"path": format!("src/retry/part_{turn}.rs"), "limit": 200}),
            ),
            _ => (
                "edit_file",
                json!({"path": "src/retry/mod.rs", "old": sentence(&mut rng, 6), "new": sentence(&mut rng, 6)}),
            ),
        };
        let assistant = json!({"role": "assistant", "content": sentence(&mut rng, 12), "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]});
        // Tool outputs run 8-31 lines (~70 bytes each), fewer near the target size.
        let room = target_bytes.saturating_sub(size + 400) / 70;
        let lines = (8 + (rng.next() % 24) as usize).min(room.max(1));
        let result = json!({"role": "tool", "tool_call_id": call_id, "content": tool_output(&mut rng, lines)});
        for m in [assistant.to_string(), result.to_string()] {
            size += m.len() + 1;
            messages.push(m);
        }
        if turn.is_multiple_of(7) {
            let user = json!({"role": "user", "content": sentence(&mut rng, 15)}).to_string();
            size += user.len() + 1;
            messages.push(user);
        }
    }
    format!(
        r#"{{"model":"qwen3-coder-30b","messages":[{}],"tools":{tools},"tool_choice":"auto","temperature":0.2,"max_tokens":4096,"stream":false{tail_fields}}}"#,
        messages.join(",")
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_deterministic_json_of_the_requested_size() {
        for target in [4 * 1024, 400 * 1024] {
            let a = chat_completion(target, true);
            assert_eq!(
                a,
                chat_completion(target, true),
                "same inputs must give the same bytes"
            );
            assert!(
                a.len() >= target && a.len() < target + 2 * 1024,
                "size {} for target {target}",
                a.len()
            );
            let v: Value = serde_json::from_slice(&a).expect("valid JSON");
            assert_eq!(v["prompt_cache_key"], SESSION_ID);
            let messages = v["messages"].as_array().expect("messages");
            assert_eq!(messages[0]["role"], "system");
            assert!(
                messages.iter().any(|m| m["role"] == "tool"),
                "tool results present"
            );
        }
    }

    #[test]
    fn the_identity_field_follows_the_messages_and_can_be_left_out() {
        let with = String::from_utf8(chat_completion(4096, true)).expect("utf-8");
        let messages_at = with.find(r#""messages""#).expect("messages");
        let key_at = with.find(r#""prompt_cache_key""#).expect("key");
        assert!(key_at > messages_at);
        let without = chat_completion(4096, false);
        let v: Value = serde_json::from_slice(&without).expect("valid JSON");
        assert!(v.get("prompt_cache_key").is_none());
    }
}
