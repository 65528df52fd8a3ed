//! The one table of retention intervals per turn kind.

use crate::TurnKind;

/// Retention interval per turn kind, in milliseconds.
///
/// The gateway sends the interval of the kind it detected
/// (`x-tether-retention-ms`); the engine uses the same table when a request
/// carries a kind but no interval, and the `user` entry when it carries
/// neither (the gateway's header fast path never reads the body, so nobody
/// knows what ended the turn: the longest common wait is the safe side).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RetentionMs {
    /// First turn of a run.
    pub first: u64,
    /// Waiting for a human reply.
    pub user: u64,
    /// Waiting for a tool result.
    pub tool: u64,
    /// Control passed to or back from a subagent.
    pub handoff: u64,
}

impl RetentionMs {
    /// The defaults, and why:
    /// - `user` 300 s: the prompt-cache lifetime agent harnesses are built
    ///   around (Anthropic's 5-minute cache write, llm-d's 300 s session TTL);
    ///   a human who answers later pays one re-prefill.
    /// - `first` 300 s: a first turn waits for the same human.
    /// - `tool` 120 s: most tool calls (reads, edits, searches) return in
    ///   seconds, builds and test runs in a minute or two; beyond that the
    ///   value model, not the pin, decides.
    /// - `handoff` 300 s: a parent waits while its subagent runs its own
    ///   multi-turn loop, which takes minutes.
    pub const DEFAULT: RetentionMs = RetentionMs {
        first: 300_000,
        user: 300_000,
        tool: 120_000,
        handoff: 300_000,
    };

    /// The interval for `kind`.
    pub const fn get(&self, kind: TurnKind) -> u64 {
        match kind {
            TurnKind::First => self.first,
            TurnKind::User => self.user,
            TurnKind::Tool => self.tool,
            TurnKind::Handoff => self.handoff,
        }
    }

    /// The slot for `kind`, to set one entry by name (configuration parsers).
    pub fn get_mut(&mut self, kind: TurnKind) -> &mut u64 {
        match kind {
            TurnKind::First => &mut self.first,
            TurnKind::User => &mut self.user,
            TurnKind::Tool => &mut self.tool,
            TurnKind::Handoff => &mut self.handoff,
        }
    }
}

impl Default for RetentionMs {
    fn default() -> Self {
        Self::DEFAULT
    }
}
