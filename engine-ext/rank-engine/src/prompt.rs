//! The simulated tokenizer: how a request body becomes the token ids the rank
//! hashes into KV blocks.
//!
//! The contract, which the trace synthesizer (`tether-fleet`) builds requests
//! against:
//!
//! - **One word = one token.** A word is a maximal run of bytes that are not
//!   ASCII whitespace; its token id is the low 32 bits of `xxh3_64(word)`. Equal
//!   text prefixes therefore give equal token prefixes, whatever the words are.
//! - **Which text counts, in which order** (canonical, whatever the order of the
//!   members in the body — Anthropic SDKs put `system` after `messages`):
//!   - Chat Completions: `tools`, then `messages`;
//!   - Responses: `instructions`, `tools`, then `input`;
//!   - Anthropic Messages: `system`, `tools`, then `messages`;
//!   - legacy Completions: `prompt`.
//!
//!   Within each member, every JSON string value of its subtree: array
//!   elements in order, object members in ascending order of their keys (so
//!   the order of keys inside a message does not matter either). Object keys
//!   are not text; numbers, booleans and nulls are not text. So a role name (`"user"`), a content-part type (`"text"`) or a
//!   tool-call id is a token, as template tokens are in a real engine, and
//!   a client that wants an exact prompt length counts with [`prompt_tokens`].
//! - Everything else in the body (model, sampling, metadata, identity fields)
//!   is not prompt.

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

use tether_wire::Api;

/// The body members that hold the prompt of `api`, in canonical order.
pub const fn prompt_members(api: Api) -> &'static [&'static str] {
    match api {
        Api::Chat => &["tools", "messages"],
        Api::Responses => &["instructions", "tools", "input"],
        Api::Messages => &["system", "tools", "messages"],
        Api::Completions => &["prompt"],
    }
}

/// Token id of one word.
pub fn token_of(word: &[u8]) -> u32 {
    xxh3_64(word) as u32
}

/// Appends the tokens of `text` to `out`.
pub fn tokenize_into(text: &str, out: &mut Vec<u32>) {
    out.extend(
        text.as_bytes()
            .split(u8::is_ascii_whitespace)
            .filter(|w| !w.is_empty())
            .map(token_of),
    );
}

/// Number of tokens `text` counts for.
pub fn count_tokens(text: &str) -> usize {
    text.as_bytes()
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty())
        .count()
}

fn walk(v: &Value, out: &mut Vec<u32>) {
    match v {
        Value::String(s) => tokenize_into(s, out),
        Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
        Value::Object(members) => {
            // Sorted explicitly: serde_json's map order depends on a crate feature.
            let mut keys: Vec<&String> = members.keys().collect();
            keys.sort_unstable();
            for k in keys {
                if let Some(m) = members.get(k) {
                    walk(m, out);
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The prompt's token ids for a parsed request body of `api`.
pub fn prompt_tokens(api: Api, body: &Value) -> Vec<u32> {
    let mut out = Vec::new();
    for m in prompt_members(api) {
        if let Some(v) = body.get(m) {
            walk(v, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_order_ignores_member_order_and_keys() {
        let a = json!({"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "hi there"}]});
        let b: Value = serde_json::from_str(
            r#"{"messages":[{"content":"hi there","role":"user"}],"max_tokens":5,"system":"be brief"}"#,
        )
        .unwrap();
        let t = prompt_tokens(Api::Messages, &a);
        assert_eq!(t.len(), 5);
        // Keys are walked sorted, so role/content order inside one message is canonical too.
        assert_eq!(t, prompt_tokens(Api::Messages, &b));
        assert_eq!(t[0], token_of(b"be"));
    }

    #[test]
    fn equal_text_prefix_means_equal_token_prefix() {
        let turn1 = json!({"messages": [{"role": "system", "content": "s1 s2"}, {"role": "user", "content": "u1 u2 u3"}]});
        let turn2 = json!({"messages": [{"role": "system", "content": "s1 s2"}, {"role": "user", "content": "u1 u2 u3"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u4"}]});
        let (a, b) = (
            prompt_tokens(Api::Chat, &turn1),
            prompt_tokens(Api::Chat, &turn2),
        );
        assert_eq!(b[..a.len()], a[..]);
        assert_eq!(b.len(), a.len() + 4);
        assert_eq!(count_tokens("  a\tb\n c  "), 3);
    }
}
