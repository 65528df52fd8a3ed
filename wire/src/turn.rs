//! What ended a turn: the best predictor of the wait before the session returns.

/// What opened a turn (its last message). The engine takes it as the best
/// predictor of the wait after this prompt end (a tool result is usually
/// followed by another tool call within seconds), so it selects the retention
/// interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TurnKind {
    /// The first user message of a run (or of a subagent that has no parent link).
    First,
    /// A user reply: the session waits for a human.
    User,
    /// A tool result: the session waits for a tool (usually seconds).
    Tool,
    /// A subagent handing back, or a subagent's first turn: control passed between agents.
    Handoff,
}

impl TurnKind {
    /// Every kind, in wire order.
    pub const ALL: [TurnKind; 4] = [
        TurnKind::First,
        TurnKind::User,
        TurnKind::Tool,
        TurnKind::Handoff,
    ];

    /// The wire name (`x-tether-turn-kind` value, trace `opened_by` value).
    pub const fn name(self) -> &'static str {
        match self {
            TurnKind::First => "first",
            TurnKind::User => "user",
            TurnKind::Tool => "tool",
            TurnKind::Handoff => "handoff",
        }
    }

    /// Parses a wire name, ASCII case-insensitive, surrounding whitespace ignored.
    pub fn parse(v: &str) -> Option<Self> {
        let v = v.trim();
        Self::ALL
            .into_iter()
            .find(|k| v.eq_ignore_ascii_case(k.name()))
    }
}

impl std::fmt::Display for TurnKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_any_case() {
        for k in TurnKind::ALL {
            assert_eq!(TurnKind::parse(k.name()), Some(k));
            assert_eq!(
                TurnKind::parse(&format!(" {} ", k.name().to_uppercase())),
                Some(k)
            );
        }
        assert_eq!(TurnKind::parse("tools"), None);
        assert_eq!(TurnKind::parse(""), None);
    }
}
