//! Turn markers: the gateway's `x-tether-*` headers, parsed into a typed [`TurnMarker`].
//! Defined once, in the wire contract (`tether-wire`, `docs/wire.md`); re-exported here
//! because every engine integration needs them next to the policy.

pub use tether_wire::headers;
pub use tether_wire::{HexId, MarkerError, RetentionKey, TurnKind, TurnMarker};
