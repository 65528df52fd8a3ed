//! `tether-rank`: a simulated engine rank whose KV cache is `tether-engine`.
//!
//! [`prompt`] is the contract between the rank and every client that wants
//! predictable cache behaviour from it (the trace synthesizer in `tether-fleet`
//! above all): how a request body of each API becomes a token sequence.

pub mod prompt;
