//! Why a request got the fallback key (or none): one counter each.

/// Why a request got the fallback key (or none); each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Path is not one of the four APIs: passed through untouched.
    UnknownFormat,
    /// `content-type` is present and not JSON.
    NotJson,
    /// `content-encoding` other than `identity`.
    Compressed,
    /// The body is not a JSON object.
    MalformedJson,
    /// The body ends before its object does (or the host could not give the bytes).
    Truncated,
    /// The body is over `max_body_bytes`.
    TooLarge,
    /// No body although the key had to come from it.
    NoBody,
    /// A JSON object with no identity field and no conversation to hash.
    NoConversation,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::UnknownFormat,
        Reason::NotJson,
        Reason::Compressed,
        Reason::MalformedJson,
        Reason::Truncated,
        Reason::TooLarge,
        Reason::NoBody,
        Reason::NoConversation,
    ];

    /// Position in [`Reason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Reason::UnknownFormat => "unknown_format",
            Reason::NotJson => "not_json",
            Reason::Compressed => "compressed",
            Reason::MalformedJson => "malformed_json",
            Reason::Truncated => "truncated",
            Reason::TooLarge => "too_large",
            Reason::NoBody => "no_body",
            Reason::NoConversation => "no_conversation",
        }
    }
}
