//! tether engine extension (skeleton).
pub mod copy;
