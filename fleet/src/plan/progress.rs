//! What a long plan reports as it goes: phases (the search's candidates, the
//! whole-trace simulation's requests) with their length, the position in
//! each, and what runs now. The CLI draws it as a progress bar with an ETA
//! (`cli/plan.rs`); the library draws nothing.

/// Receives a plan's progress. Every method has a do-nothing default.
pub trait Observer: Sync {
    /// A phase of `len` units starts (`unit` names them: `candidates`, `requests`).
    fn phase(&self, _name: &str, _len: u64, _unit: &str) {}
    /// The phase's length changed (the search found more to try).
    fn grow(&self, _len: u64) {}
    /// `done` units of the phase are done.
    fn at(&self, _done: u64) {}
    /// What runs now, in a few words.
    fn note(&self, _what: &str) {}
}

/// Reports nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}
