//! Reports of one trace side by side: each metric with its change against the
//! first report, next to the configuration keys that changed between them —
//! the serving review. Reports of different traces are refused.

use super::config::changed_keys;
use super::markdown::{count, pct};
use super::model::Report;
use std::fmt::Write;

/// Reports that cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// Fewer than two.
    #[error("compare needs at least two reports")]
    TooFew,
    /// Different traces (content hashes).
    #[error(
        "reports of different traces: `{a}` replayed {ha} but `{b}` replayed {hb}; compare only replays of the same trace"
    )]
    DifferentTrace {
        /// First report's label.
        a: String,
        /// Its trace hash.
        ha: String,
        /// The other report's label.
        b: String,
        /// Its trace hash.
        hb: String,
    },
    /// Same trace, different parts of it.
    #[error(
        "`{a}` replayed {na} sessions of the trace but `{b}` replayed {nb}; compare replays of the same sessions"
    )]
    DifferentScope {
        /// First label.
        a: String,
        /// Its sessions.
        na: u64,
        /// Other label.
        b: String,
        /// Its sessions.
        nb: u64,
    },
}

/// How a metric is shown and which way is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A ratio in [0, 1], shown as %, changes in percentage points.
    Ratio,
    /// A count, changes as a factor.
    Count,
    /// Milliseconds, changes as a factor.
    Ms,
    /// A plain number, changes as a factor.
    Number,
    /// Dollars per million tokens.
    Usd,
}

/// One row of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Metric name.
    pub name: &'static str,
    /// Format.
    pub kind: Kind,
    /// `true` when lower is better.
    pub lower_is_better: bool,
    /// One value per report (`None` = not measured).
    pub values: Vec<Option<f64>>,
}

/// The comparison of reports of one trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The trace's content hash.
    pub trace_hash: String,
    /// Column labels.
    pub labels: Vec<String>,
    /// Metrics.
    pub rows: Vec<Row>,
    /// Configuration keys that differ, with each report's value.
    pub changed: Vec<(String, Vec<Option<String>>)>,
    /// Labels of partial reports.
    pub partial: Vec<String>,
    /// What produced each report (`tether replay`, `tether simulate`).
    pub tools: Vec<String>,
}

fn label(r: &Report, i: usize) -> String {
    if r.run.label.is_empty() {
        format!("#{} ({})", i + 1, r.config.hash)
    } else {
        r.run.label.clone()
    }
}

/// Compares reports; the first is the baseline.
pub fn compare(reports: &[Report]) -> Result<Comparison, CompareError> {
    let [base, rest @ ..] = reports else {
        return Err(CompareError::TooFew);
    };
    if rest.is_empty() {
        return Err(CompareError::TooFew);
    }
    let labels: Vec<String> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| label(r, i))
        .collect();
    for (i, r) in rest.iter().enumerate() {
        if r.trace.content_hash != base.trace.content_hash {
            return Err(CompareError::DifferentTrace {
                a: labels[0].clone(),
                ha: base.trace.content_hash.clone(),
                b: labels[i + 1].clone(),
                hb: r.trace.content_hash.clone(),
            });
        }
        if r.trace.sessions != base.trace.sessions {
            return Err(CompareError::DifferentScope {
                a: labels[0].clone(),
                na: base.trace.sessions,
                b: labels[i + 1].clone(),
                nb: r.trace.sessions,
            });
        }
    }
    let row = |name, kind, lower_is_better, f: &dyn Fn(&Report) -> Option<f64>| Row {
        name,
        kind,
        lower_is_better,
        values: reports.iter().map(f).collect(),
    };
    let some = |d: &super::model::Dist, v: f64| (d.count > 0).then_some(v);
    let rows = vec![
        row("requests completed", Kind::Count, false, &|r| {
            Some(r.requests.completed as f64)
        }),
        row("errors", Kind::Count, true, &|r| {
            Some(r.requests.errors as f64)
        }),
        row("hit ratio", Kind::Ratio, false, &|r| {
            Some(r.hit_ratio.overall)
        }),
        row("hit ratio, returning turns", Kind::Ratio, false, &|r| {
            Some(r.hit_ratio.returning)
        }),
        row(
            "share of the shared-cache ceiling",
            Kind::Ratio,
            false,
            &|r| Some(r.hit_ratio.of_shared_cache),
        ),
        row(
            "share of the session-affinity ceiling",
            Kind::Ratio,
            false,
            &|r| Some(r.hit_ratio.of_ideal),
        ),
        row("prefill tokens computed", Kind::Count, true, &|r| {
            Some(r.tokens.computed as f64)
        }),
        row(
            "avoidable re-prefill tokens (fleet)",
            Kind::Count,
            true,
            &|r| Some(r.reprefill.avoidable_tokens as f64),
        ),
        row("avoidable at the placement seen", Kind::Count, true, &|r| {
            Some(r.reprefill.avoidable_at_placement_tokens as f64)
        }),
        row("session hit ratio p10", Kind::Ratio, false, &|r| {
            (r.sessions.count > 0).then_some(r.sessions.hit_ratio_p10)
        }),
        row("session hit ratio p50", Kind::Ratio, false, &|r| {
            (r.sessions.count > 0).then_some(r.sessions.hit_ratio.p50)
        }),
        row(
            "returning turns that lost their cache",
            Kind::Count,
            true,
            &|r| {
                let l = &r.sessions.lost;
                (r.sessions.count > 0).then_some((l.moved + l.evicted + l.unknown) as f64)
            },
        ),
        row(
            "… of them moved to another engine",
            Kind::Count,
            true,
            &|r| (r.sessions.count > 0).then_some(r.sessions.lost.moved as f64),
        ),
        row("TTFT first turn p50 ms", Kind::Ms, true, &|r| {
            some(&r.sessions.ttft_first_ms, r.sessions.ttft_first_ms.p50)
        }),
        row("TTFT returning turns p50 ms", Kind::Ms, true, &|r| {
            some(
                &r.sessions.ttft_returning_ms,
                r.sessions.ttft_returning_ms.p50,
            )
        }),
        row("TTFT p50 ms", Kind::Ms, true, &|r| {
            some(&r.latency.ttft_ms, r.latency.ttft_ms.p50)
        }),
        row("TTFT p90 ms", Kind::Ms, true, &|r| {
            some(&r.latency.ttft_ms, r.latency.ttft_ms.p90)
        }),
        row("TTFT p99 ms", Kind::Ms, true, &|r| {
            some(&r.latency.ttft_ms, r.latency.ttft_ms.p99)
        }),
        row("ITL p50 ms", Kind::Ms, true, &|r| {
            some(&r.latency.itl_ms, r.latency.itl_ms.p50)
        }),
        row("E2E p50 ms", Kind::Ms, true, &|r| {
            some(&r.latency.e2e_ms, r.latency.e2e_ms.p50)
        }),
        row("E2E p90 ms", Kind::Ms, true, &|r| {
            some(&r.latency.e2e_ms, r.latency.e2e_ms.p90)
        }),
        row("output tok/s per stream p50", Kind::Number, false, &|r| {
            some(
                &r.latency.output_tokens_per_s,
                r.latency.output_tokens_per_s.p50,
            )
        }),
        row("load max/mean (prompt tokens)", Kind::Number, true, &|r| {
            r.load.max_over_mean_prompt_tokens
        }),
        row("cost $/Mtok", Kind::Usd, true, &|r| r.cost.usd_per_mtok),
    ];
    let configs: Vec<&super::config::ServingConfig> = reports.iter().map(|r| &r.config).collect();
    Ok(Comparison {
        trace_hash: base.trace.content_hash.clone(),
        partial: reports
            .iter()
            .zip(&labels)
            .filter(|(r, _)| r.run.partial)
            .map(|(_, l)| l.clone())
            .collect(),
        tools: reports.iter().map(|r| r.run.tool.clone()).collect(),
        labels,
        rows,
        changed: changed_keys(&configs),
    })
}

fn value(kind: Kind, v: f64) -> String {
    match kind {
        Kind::Ratio => pct(v),
        Kind::Count => count(v.round() as u64),
        Kind::Ms => format!("{v:.1}"),
        Kind::Number => format!("{v:.2}"),
        Kind::Usd => format!("${v:.4}"),
    }
}

/// The change of `v` against `base`: percentage points for ratios, a factor otherwise.
pub fn delta(kind: Kind, base: f64, v: f64) -> String {
    match kind {
        Kind::Ratio => format!("{:+.1} pp", (v - base) * 100.0),
        _ if base == 0.0 && v == 0.0 => "=".to_owned(),
        _ if base == 0.0 => "new".to_owned(),
        _ => format!("×{:.2}", v / base),
    }
}

impl Comparison {
    /// The value of `metric` in column `i`.
    pub fn value(&self, metric: &str, i: usize) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.name == metric)?
            .values
            .get(i)
            .copied()
            .flatten()
    }

    /// Markdown: the configuration changes, then the metrics with their changes.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Comparison of {} runs of trace `{}` (baseline: {}).\n",
            self.labels.len(),
            self.trace_hash,
            self.labels[0]
        );
        if self.tools.iter().any(|t| *t != self.tools[0]) {
            let by: Vec<String> = self
                .labels
                .iter()
                .zip(&self.tools)
                .map(|(l, t)| format!("{l}: `{t}`"))
                .collect();
            let _ = writeln!(s, "Produced by: {}.\n", by.join(", "));
        }
        if !self.partial.is_empty() {
            let _ = writeln!(
                s,
                "**Partial reports**: {} (they cover only what was sent before they stopped).\n",
                self.partial.join(", ")
            );
        }
        let header = |s: &mut String, first: &str| {
            let _ = write!(s, "| {first} |");
            for l in &self.labels {
                let _ = write!(s, " {l} |");
            }
            let _ = writeln!(s);
            let _ = write!(s, "|---|");
            for _ in &self.labels {
                let _ = write!(s, "---:|");
            }
            let _ = writeln!(s);
        };
        if self.changed.is_empty() {
            let _ = writeln!(s, "Configuration: identical (same hash).\n");
        } else {
            let _ = writeln!(s, "What changed in the configuration:\n");
            header(&mut s, "configuration key");
            for (k, vals) in &self.changed {
                let _ = write!(s, "| `{k}` |");
                for v in vals {
                    let _ = write!(s, " {} |", v.as_deref().unwrap_or("(absent)"));
                }
                let _ = writeln!(s);
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s, "What it did (change against {}):\n", self.labels[0]);
        header(&mut s, "metric");
        for r in &self.rows {
            let _ = write!(
                s,
                "| {}{} |",
                r.name,
                if r.lower_is_better { " ↓" } else { " ↑" }
            );
            let base = r.values.first().copied().flatten();
            for (i, v) in r.values.iter().enumerate() {
                match (v, base) {
                    (Some(v), Some(b)) if i > 0 => {
                        let _ = write!(s, " {} ({}) |", value(r.kind, *v), delta(r.kind, b, *v));
                    }
                    (Some(v), _) => {
                        let _ = write!(s, " {} |", value(r.kind, *v));
                    }
                    (None, _) => {
                        let _ = write!(s, " - |");
                    }
                }
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(
            s,
            "\n↑ higher is better, ↓ lower is better; changes are percentage points for ratios and factors (×) otherwise."
        );
        s
    }
}

#[cfg(test)]
mod tests;
