//! Where a request's time goes inside the host (build with the `phase-timing`
//! feature; never in the shipped module: without it every probe is a no-op
//! the compiler removes): each phase of the header and the
//! body callback is timed with the monotonic clock, and every `WINDOW`
//! requests of a path the medians (µs) are logged at warning level, e.g.
//! `tether phases body n=1000 fetch=3.1 scan=2.0 … total=9.8`. The clock is
//! WASI `clock_time_get`, one host call per mark: the figures include that
//! overhead, the same for every phase.

use crate::step::Step;

#[cfg(feature = "phase-timing")]
pub use on::{Log, Probe};

#[cfg(not(feature = "phase-timing"))]
pub use off::{Log, Probe};

/// The shipped build: nothing is timed.
#[cfg(not(feature = "phase-timing"))]
mod off {
    use super::Step;

    #[derive(Default)]
    pub struct Log;

    impl Log {
        pub fn new() -> Self {
            Log
        }
    }

    pub struct Probe;

    impl Probe {
        #[inline(always)]
        pub fn start() -> Self {
            Probe
        }
        #[inline(always)]
        pub fn lap(&self) {}
        #[inline(always)]
        pub fn mark(&self, _step: Step) {}
        #[inline(always)]
        pub fn fetching<T>(&self, f: impl FnOnce() -> T) -> T {
            f()
        }
        #[inline(always)]
        pub fn record(self, _log: &Log, _body: bool) {}
    }
}

/// The diagnostic build.
#[cfg(feature = "phase-timing")]
mod on {
    use super::Step;
    use std::cell::RefCell;
    use std::time::Instant;

    /// Requests per logged line.
    pub const WINDOW: usize = 1000;

    /// The body path's phases, in order.
    pub const BODY: [&str; 11] = [
        "fetch", "scan", "head", "identity", "turn", "place", "rewrite", "emit", "count", "other",
        "total",
    ];
    /// The header path's phases, in order.
    pub const HEADER: [&str; 5] = ["headers", "decide", "emit", "count", "total"];

    /// Samples of one path.
    #[derive(Default)]
    struct Window {
        rows: Vec<Vec<u32>>,
    }

    /// The samples of both paths, kept per VM (one per worker thread).
    #[derive(Default)]
    pub struct Log {
        body: RefCell<Window>,
        header: RefCell<Window>,
    }

    impl Log {
        pub fn new() -> Self {
            Self::default()
        }

        /// Records one request's phase times (ns, in the order of the path's
        /// table); logs and clears the window when it is full.
        pub fn record(&self, body: bool, row: Vec<u32>) {
            let (cell, names, path) = if body {
                (&self.body, &BODY[..], "body")
            } else {
                (&self.header, &HEADER[..], "header")
            };
            let mut w = cell.borrow_mut();
            w.rows.push(row);
            if w.rows.len() < WINDOW {
                return;
            }
            let mut line = format!("tether phases {path} n={}", w.rows.len());
            for (i, name) in names.iter().enumerate() {
                let mut col: Vec<u32> = w.rows.iter().filter_map(|r| r.get(i).copied()).collect();
                col.sort_unstable();
                let median = col.get(col.len() / 2).copied().unwrap_or(0);
                line.push_str(&format!(" {name}={:.1}", f64::from(median) / 1000.0));
            }
            w.rows.clear();
            crate::shell::host::log(proxy_wasm::types::LogLevel::Warn, &line);
        }
    }

    /// Times one request: `lap` closes the current phase.
    pub struct Clock {
        start: Instant,
        last: Instant,
        /// Time spent fetching body bytes, taken out of the phase it fell in.
        pub fetch_ns: u64,
        row: Vec<u32>,
    }

    impl Clock {
        pub fn start() -> Self {
            let now = Instant::now();
            Self {
                start: now,
                last: now,
                fetch_ns: 0,
                row: Vec::with_capacity(BODY.len()),
            }
        }

        fn ns(from: Instant) -> u32 {
            u32::try_from(from.elapsed().as_nanos()).unwrap_or(u32::MAX)
        }

        /// Closes a phase (its time since the last lap).
        pub fn lap(&mut self) {
            self.row.push(Self::ns(self.last));
            self.last = Instant::now();
        }

        /// The row of a body-path request: the fetch time moved out of the scan
        /// phase (where the reads happen) into its own column, phases that did
        /// not run as 0, then the total.
        pub fn body_row(mut self, laps: &[Option<usize>]) -> Vec<u32> {
            let total = Self::ns(self.start);
            let fetch = u32::try_from(self.fetch_ns).unwrap_or(u32::MAX);
            let mut row = vec![fetch];
            for l in laps {
                row.push(l.and_then(|i| self.row.get(i).copied()).unwrap_or(0));
            }
            if let Some(scan) = row.get_mut(1) {
                *scan = scan.saturating_sub(fetch);
            }
            let accounted: u32 = row.iter().fold(0u32, |a, b| a.saturating_add(*b));
            row.push(total.saturating_sub(accounted));
            row.push(total);
            self.row.clear();
            row
        }

        /// The row of a header-path request: its laps, then the total.
        pub fn header_row(mut self) -> Vec<u32> {
            let total = Self::ns(self.start);
            self.row.push(total);
            self.row
        }
    }

    /// One request being timed: its clock and, on the body path, which lap
    /// closed each step (scan … rewrite, emit, count).
    pub struct Probe(RefCell<(Clock, [Option<usize>; 8], usize)>);

    impl Probe {
        pub fn start() -> Self {
            Probe(RefCell::new((Clock::start(), [None; 8], 0)))
        }

        /// Closes the current phase (header path: in order).
        pub fn lap(&self) {
            self.0.borrow_mut().0.lap();
        }

        /// Closes body step `step`.
        pub fn mark(&self, step: Step) {
            let mut s = self.0.borrow_mut();
            let (clock, laps, n) = &mut *s;
            clock.lap();
            if let Some(l) = laps.get_mut(step as usize) {
                *l = Some(*n);
            }
            *n += 1;
        }

        pub fn fetching<T>(&self, f: impl FnOnce() -> T) -> T {
            let t = Instant::now();
            let out = f();
            self.0.borrow_mut().0.fetch_ns += u64::from(Clock::ns(t));
            out
        }

        /// Records the request's row in `log`.
        pub fn record(self, log: &Log, body: bool) {
            let (clock, laps, _) = self.0.into_inner();
            let row = if body {
                clock.body_row(&laps)
            } else {
                clock.header_row()
            };
            log.record(body, row);
        }
    }
}
