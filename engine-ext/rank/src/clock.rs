//! Simulated time for the server: wall time since start × `--speedup`, in ms.

use std::time::{Duration, Instant};

/// Maps wall-clock instants to simulated milliseconds and back.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    start: Instant,
    speedup: f64,
}

impl SimClock {
    /// A clock starting now, running `speedup` times faster than wall time.
    pub fn start(speedup: f64) -> Self {
        Self {
            start: Instant::now(),
            speedup,
        }
    }

    /// How much faster than wall time simulated time runs.
    pub fn speedup(&self) -> f64 {
        self.speedup
    }

    /// Simulated ms now.
    pub fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0 * self.speedup
    }

    /// The wall instant at which simulated time reaches `ms`.
    pub fn instant_at(&self, ms: f64) -> Instant {
        let secs = (ms / 1000.0 / self.speedup).clamp(0.0, 1e9);
        self.start + Duration::from_secs_f64(secs)
    }
}
