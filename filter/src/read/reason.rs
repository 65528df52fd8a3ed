//! Why a request got the fallback key (or none): one counter each.

/// Why a request got the fallback key (or none); each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Path is not one of the four APIs: passed through untouched.
    UnknownFormat,
    /// `content-type` is present and not JSON.
    NotJson,
    /// A `content-encoding` the filter does not decode (or a configuration
    /// that must rewrite the body, which it cannot do to a compressed one).
    Compressed,
    /// A compressed body that decodes to more than `max_decompressed_bytes`.
    DecompressedTooLarge,
    /// A compressed body that does not decode: bad magic, corrupt or truncated stream.
    CompressedCorrupt,
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
    pub const ALL: [Reason; 10] = [
        Reason::UnknownFormat,
        Reason::NotJson,
        Reason::Compressed,
        Reason::DecompressedTooLarge,
        Reason::CompressedCorrupt,
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
            Reason::DecompressedTooLarge => "decompressed_too_large",
            Reason::CompressedCorrupt => "compressed_corrupt",
            Reason::MalformedJson => "malformed_json",
            Reason::Truncated => "truncated",
            Reason::TooLarge => "too_large",
            Reason::NoBody => "no_body",
            Reason::NoConversation => "no_conversation",
        }
    }
}
