//! tether gateway filter (skeleton; filled by the gateway-filter work).
