//! What each request API's conversation looks like inside a body (the API itself is `tether_wire::Api`).

use crate::json::Value;

pub use tether_wire::Api;

/// How each API's conversation looks inside a body: what the filter needs to
/// find the head and the turn that just ended without a DOM.
pub trait ApiShape: Copy {
    /// A system/developer message at the start of the conversation (part of the head).
    fn is_preamble(self, v: Value<'_>) -> bool;
    /// Whether an array element looks like a conversation entry of this API
    /// (and not, say, a tool schema): used to recognise the conversation from its tail.
    fn looks_like_turn(self, v: Value<'_>) -> bool;
    /// A tool result entry (its call, in an earlier assistant entry, names the tool).
    fn is_tool_result(self, v: Value<'_>) -> bool;
    /// [`ApiShape::looks_like_turn`] judged from the first two members only (where
    /// SDKs put `role` / `type`): cheap on large non-turn elements such as tool schemas.
    fn looks_like_turn_fast(self, v: Value<'_>) -> bool;
    /// From the end of a conversation, the first entry that is neither a tool
    /// result nor a tool call: everything after it is the turn that just ended.
    fn ends_turn_run(self, v: Value<'_>) -> bool;
    /// Where the walk back from a conversation's end may stop: an entry that
    /// ends the run of tool traffic and is not the user's (an assistant entry,
    /// a preamble), so the turn that just ended and the last assistant entry
    /// before it are both in view (the P/D estimate's new bytes).
    fn ends_tail_walk(self, v: Value<'_>) -> bool;
}

impl ApiShape for Api {
    fn is_preamble(self, v: Value<'_>) -> bool {
        match self {
            Api::Chat | Api::Responses => v
                .get("role")
                .is_some_and(|r| r.str_is("system") || r.str_is("developer")),
            Api::Messages | Api::Completions => false,
        }
    }

    fn looks_like_turn(self, v: Value<'_>) -> bool {
        let role = v.get("role");
        let role_ok = |allowed: &[&str]| {
            role.and_then(|r| r.str())
                .is_some_and(|r| allowed.contains(&r.as_ref()))
        };
        match self {
            Api::Chat => role_ok(&[
                "system",
                "developer",
                "user",
                "assistant",
                "tool",
                "function",
            ]),
            Api::Messages => role_ok(&["user", "assistant"]),
            Api::Responses => {
                role_ok(&["system", "developer", "user", "assistant"])
                    || v.get("type").and_then(|t| t.str()).is_some_and(|t| {
                        t == "message"
                            || t == "reasoning"
                            || t == "item_reference"
                            || t.ends_with("_call")
                            || t.ends_with("_call_output")
                    })
            }
            Api::Completions => true,
        }
    }

    // Anthropic puts `tool_result` blocks first in a user message, so only the
    // first block is looked at, without walking the (often large) result.
    fn is_tool_result(self, v: Value<'_>) -> bool {
        match self {
            Api::Chat => v
                .get("role")
                .is_some_and(|r| r.str_is("tool") || r.str_is("function")),
            Api::Responses => v
                .get("type")
                .and_then(|t| t.str())
                .is_some_and(|t| t.ends_with("_call_output")),
            Api::Messages => {
                if !v.get("role").is_some_and(|r| r.str_is("user")) {
                    return false;
                }
                let Some(content) = v.get_head("content") else {
                    return false;
                };
                // SDK order puts `type` first in a block: peek without walking the result.
                let near = content
                    .first_element_head()
                    .and_then(|b| b.get_near("type", 2));
                let ty = near.or_else(|| content.elements().next().and_then(|b| b.get("type")));
                ty.is_some_and(|t| t.str_is("tool_result"))
            }
            Api::Completions => false,
        }
    }

    fn looks_like_turn_fast(self, v: Value<'_>) -> bool {
        (v.get_near("role", 2).is_some() || v.get_near("type", 2).is_some())
            && self.looks_like_turn(v)
    }

    fn ends_tail_walk(self, v: Value<'_>) -> bool {
        let role_in = |allowed: &[&str]| {
            v.get("role")
                .is_some_and(|r| allowed.iter().any(|a| r.str_is(a)))
        };
        match self {
            Api::Chat => role_in(&["assistant", "system", "developer"]),
            Api::Messages => role_in(&["assistant"]),
            Api::Responses => {
                self.looks_like_turn(v) && self.ends_turn_run(v) && !role_in(&["user"])
            }
            Api::Completions => self.looks_like_turn_fast(v) && self.ends_turn_run(v),
        }
    }

    fn ends_turn_run(self, v: Value<'_>) -> bool {
        if self.is_tool_result(v) {
            return false;
        }
        !(self == Api::Responses
            && v.get("type")
                .and_then(|t| t.str())
                .is_some_and(|t| t.ends_with("_call")))
    }
}
