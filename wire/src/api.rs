//! The request APIs tether speaks: one enum, its names and paths, defined once.
//!
//! The filter, the ranks, the replay client, the trace model and the end-to-end
//! tests all import this type; none keeps its own path table.

/// A request API: which wire format a request body follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Api {
    /// OpenAI Chat Completions, `POST /v1/chat/completions`: `messages` with roles
    /// `system`/`developer`/`user`/`assistant`/`tool`.
    Chat,
    /// OpenAI Responses, `POST /v1/responses`: `input` items (messages,
    /// `function_call`, `function_call_output`, …) and `instructions`.
    Responses,
    /// Anthropic Messages, `POST /v1/messages`: `messages` of `user`/`assistant`
    /// with content blocks and a top-level `system`.
    Messages,
    /// Legacy Completions, `POST /v1/completions`: `prompt`.
    Completions,
}

impl Api {
    /// Every API, in the order of the docs.
    pub const ALL: [Api; 4] = [Api::Chat, Api::Responses, Api::Messages, Api::Completions];

    /// Short lower-case name: trace files, logs, the debug header, hashes.
    pub const fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Responses => "responses",
            Api::Messages => "messages",
            Api::Completions => "completions",
        }
    }

    /// The request path.
    pub const fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
            Api::Completions => "/v1/completions",
        }
    }

    /// Parses a [`name`](Api::name).
    pub fn parse(name: &str) -> Option<Api> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The API served at `path` (query string and one trailing `/` ignored);
    /// `None` for any other path.
    pub fn from_path(path: &[u8]) -> Option<Api> {
        let path = path.split(|&b| b == b'?').next().unwrap_or_default();
        let path = path.strip_suffix(b"/").unwrap_or(path);
        Self::ALL.into_iter().find(|a| a.path().as_bytes() == path)
    }

    /// The top-level body member holding the conversation.
    pub const fn conversation_key(self) -> &'static str {
        match self {
            Api::Chat | Api::Messages => "messages",
            Api::Responses => "input",
            Api::Completions => "prompt",
        }
    }

    /// The top-level body member that bounds the answer's length.
    pub const fn max_output_key(self) -> &'static str {
        match self {
            Api::Responses => "max_output_tokens",
            Api::Chat | Api::Messages | Api::Completions => "max_tokens",
        }
    }
}

impl std::fmt::Display for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths_round_trip() {
        for a in Api::ALL {
            assert_eq!(Api::parse(a.name()), Some(a));
            assert_eq!(Api::from_path(a.path().as_bytes()), Some(a));
            let slash = format!("{}/", a.path());
            assert_eq!(Api::from_path(slash.as_bytes()), Some(a));
            let query = format!("{}?beta=true", a.path());
            assert_eq!(Api::from_path(query.as_bytes()), Some(a));
        }
    }

    #[test]
    fn other_paths_are_none() {
        for p in [
            "",
            "/",
            "/v1",
            "/v1/chat",
            "/v1/messages//",
            "/v2/responses",
            "v1/messages",
        ] {
            assert_eq!(Api::from_path(p.as_bytes()), None, "{p}");
        }
        assert_eq!(Api::parse("Chat"), None);
    }
}
