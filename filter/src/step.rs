//! The steps of one request's decision and of its application, for timing
//! (the `phase-timing` build logs where the time goes, step by step).

/// A step of the body path, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Reading the body's ends (or all of it) and scanning them.
    Scan,
    /// The conversation-head hash.
    Head,
    /// Identity sources and the key.
    Identity,
    /// Turn markers.
    Turn,
    /// Placement (rendezvous, load view, P/D).
    Place,
    /// The body rewrite planned.
    Rewrite,
    /// The plan handed to the host (shell).
    Apply,
    /// Its counters noted (shell).
    Count,
}
