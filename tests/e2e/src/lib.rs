//! End-to-end harness (skeleton).
