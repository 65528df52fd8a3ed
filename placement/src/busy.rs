//! How busy a rank has been lately: the share of recent time it was stepping,
//! as an exponentially weighted average, and how residency placement weighs it
//! beside the requests in flight (`docs/gateway.md`, "Residency-aware
//! placement").
//!
//! Why: a load view of requests in flight is mostly zeros and ones at the
//! moderate load agent fleets run at, so most placements of a new key (or of a
//! key moving off a holder over the bound) tie, and a tie went to the key's
//! first rendezvous candidate — a random draw per key. Session-sticky traffic
//! then keeps whatever imbalance those draws made: the sessions a rank drew
//! keep coming back to it. Breaking ties toward the rank that has been less
//! busy over the last minutes steers new work to where busy time is short
//! without moving a single retained state.
//!
//! The rank computes the average (its `/load` report's `busy`, per DP rank) so
//! every gateway replica reads the same figure; the gateway keeps nothing.

/// Time constant of the average, ms: the last five minutes, about a long
/// agent turn plus its tool gap, weigh most.
pub const BUSY_TAU_MS: f64 = 300_000.0;

/// Weight of a rank's busy share in residency placement's load: below one
/// request, so the share breaks ties between ranks with as many requests in
/// flight and never outweighs a request.
pub const BUSY_WEIGHT: f64 = 0.9;

/// Residency placement's load of an endpoint: its requests in flight plus
/// `weight` × its busy share (0–1; anything else, NaN included, reads as 0
/// or 1). The gateway weighs by [`BUSY_WEIGHT`]; 0 leaves ties to the
/// rendezvous order (`tether simulate --resident-busy-weight 0`).
pub fn resident_load(requests: f64, busy: f64, weight: f64) -> f64 {
    let busy = share(busy);
    let weight = if weight.is_nan() { 0.0 } else { weight };
    requests + weight * busy
}

/// A reported busy share as a share: NaN reads as 0, anything outside 0–1 as
/// the nearer end.
pub fn share(busy: f64) -> f64 {
    if busy.is_nan() {
        0.0
    } else {
        busy.clamp(0.0, 1.0)
    }
}

/// An exponentially weighted share of busy time (0–1): fed the busy ms of
/// each interval as it ends, read at any later time (an interval with no
/// report since reads as idle, or as busy from a given time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BusyAverage {
    tau_ms: f64,
    value: f64,
    at_ms: f64,
}

impl Default for BusyAverage {
    fn default() -> Self {
        Self::new(BUSY_TAU_MS)
    }
}

impl BusyAverage {
    /// An idle average with time constant `tau_ms` (> 0; a smaller one reads
    /// as 1 ms), starting at time 0.
    pub fn new(tau_ms: f64) -> Self {
        Self {
            tau_ms: if tau_ms >= 1.0 { tau_ms } else { 1.0 },
            value: 0.0,
            at_ms: 0.0,
        }
    }

    /// The interval from the last report to `now_ms` ends with `busy_ms` of
    /// it busy (clamped to the interval). A time before the last report is
    /// ignored: clocks only move forward.
    pub fn add(&mut self, now_ms: f64, busy_ms: f64) {
        if now_ms > self.at_ms {
            self.value = self.peek(now_ms, busy_ms);
            self.at_ms = now_ms;
        }
    }

    /// The share at `now_ms` if the interval since the last report had
    /// `busy_ms` busy in it, without recording it.
    pub fn peek(&self, now_ms: f64, busy_ms: f64) -> f64 {
        let dt = now_ms - self.at_ms;
        if dt.is_nan() || dt <= 0.0 {
            return self.value;
        }
        let share = if busy_ms.is_nan() {
            0.0
        } else {
            (busy_ms / dt).clamp(0.0, 1.0)
        };
        let keep = (-dt / self.tau_ms).exp();
        self.value * keep + share * (1.0 - keep)
    }

    /// When the last interval ended, ms.
    pub fn at_ms(&self) -> f64 {
        self.at_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_busy_approaches_one_and_idle_decays_it() {
        let mut b = BusyAverage::new(1000.0);
        for t in 1..=10 {
            b.add(f64::from(t) * 500.0, 500.0);
        }
        // 5 s busy at τ = 1 s: 1 − e⁻⁵.
        assert!((b.peek(5000.0, 0.0) - (1.0 - (-5.0f64).exp())).abs() < 1e-12);
        // One τ idle keeps e⁻¹ of it.
        let idle = b.peek(6000.0, 0.0);
        assert!((idle - b.peek(5000.0, 0.0) * (-1.0f64).exp()).abs() < 1e-12);
        // Busy since the last report reads as busy.
        assert!(b.peek(6000.0, 1000.0) > b.peek(5000.0, 0.0));
    }

    #[test]
    fn the_share_does_not_depend_on_how_often_it_is_fed() {
        // Half busy, fed per 10 ms or per 1 s, ends near the same share.
        let (mut fine, mut coarse) = (BusyAverage::new(60_000.0), BusyAverage::new(60_000.0));
        for i in 1..=12_000 {
            fine.add(f64::from(i) * 10.0, 5.0);
        }
        for i in 1..=120 {
            coarse.add(f64::from(i) * 1000.0, 500.0);
        }
        let (a, b) = (fine.peek(120_000.0, 0.0), coarse.peek(120_000.0, 0.0));
        assert!((a - b).abs() < 1e-3, "{a} vs {b}");
        assert!((a - 0.5 * (1.0 - (-2.0f64).exp())).abs() < 1e-3, "{a}");
    }

    #[test]
    fn bad_times_and_shares_never_break_it() {
        let mut b = BusyAverage::new(-5.0);
        b.add(10.0, 1e9);
        assert_eq!(b.peek(10.0, 0.0), b.peek(5.0, 0.0));
        assert!(b.peek(10.0, 0.0) <= 1.0);
        b.add(f64::NAN, 3.0);
        b.add(20.0, f64::NAN);
        let v = b.peek(30.0, -4.0);
        assert!(v.is_finite() && (0.0..=1.0).contains(&v), "{v}");
        assert_eq!(resident_load(2.0, f64::NAN, BUSY_WEIGHT), 2.0);
        assert_eq!(resident_load(2.0, 7.0, BUSY_WEIGHT), 2.0 + BUSY_WEIGHT);
        assert!(resident_load(1.0, 1.0, BUSY_WEIGHT) < 2.0);
        assert_eq!(resident_load(1.0, 1.0, 0.0), 1.0);
    }
}
