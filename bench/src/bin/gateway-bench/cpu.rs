//! CPU time of one Envoy process, for CPU per request at saturation: the
//! figure that tells work done in the worker apart from time spent waiting,
//! which latency at concurrency 1 mixes together.

use std::path::Path;

/// Nanoseconds on CPU of every thread of process `pid` so far: the first
/// field of each `/proc/<pid>/task/<tid>/schedstat` (scheduler run time, in
/// ns, unlike `stat`'s 10 ms ticks). `None` where /proc or schedstat is
/// missing (not Linux, or a kernel without `CONFIG_SCHED_INFO`).
pub fn process_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("task")).ok()?;
    let mut total = 0u64;
    for task in tasks.flatten() {
        // A thread that exits between the listing and the read drops out.
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// CPU of one process over a span of requests.
pub struct Meter {
    pid: u32,
    start: Option<u64>,
}

impl Meter {
    pub fn start(pid: u32) -> Self {
        Self {
            pid,
            start: process_ns(pid),
        }
    }

    /// Microseconds of CPU per request since [`Meter::start`]; `None` without
    /// schedstat or requests.
    pub fn per_request_us(&self, requests: u64) -> Option<f64> {
        let (start, end) = (self.start?, process_ns(self.pid)?);
        (requests > 0).then(|| end.saturating_sub(start) as f64 / 1e3 / requests as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux kernels as shipped by distributions have schedstat
    /// (`CONFIG_SCHED_INFO`); elsewhere the benchmark prints "—".
    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_spent_cpu_and_it_only_grows() {
        let pid = std::process::id();
        let meter = Meter::start(pid);
        let a = process_ns(pid).expect("schedstat of this process");
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let b = process_ns(pid).expect("schedstat vanished");
        assert!(a > 0 && b > a, "{a} then {b}");
        assert!(meter.per_request_us(1).is_some_and(|us| us > 0.0));
        assert_eq!(meter.per_request_us(0), None);
    }
}
