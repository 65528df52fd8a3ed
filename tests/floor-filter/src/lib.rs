//! Floor filters (skeleton).
