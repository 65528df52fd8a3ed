//! tether engine extension (skeleton).
