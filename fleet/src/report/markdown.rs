//! A report as markdown, for people (the JSON is for tools).

use super::model::{Dist, Report};
use std::fmt::Write;

/// Percent with one decimal.
pub fn pct(v: f64) -> String {
    format!("{:.1} %", v * 100.0)
}

/// A token count with thousands separators.
pub fn count(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `p50 / p90 / p99` with a unit.
pub fn dist(d: &Dist, unit: &str) -> String {
    if d.count == 0 {
        return "-".to_owned();
    }
    format!("{:.1} / {:.1} / {:.1} {unit}", d.p50, d.p90, d.p99)
}

/// Renders the report; `plots` are file names shown as images.
pub fn render(r: &Report, plots: &[String]) -> String {
    let mut s = String::new();
    let label = if r.run.label.is_empty() {
        "replay"
    } else {
        &r.run.label
    };
    let _ = writeln!(s, "# Replay report: {label}\n");
    if r.run.partial {
        let _ = writeln!(
            s,
            "**PARTIAL**: {} — only what was sent until then is counted.\n",
            r.run.partial_reason.as_deref().unwrap_or("stopped early")
        );
    }
    let t = &r.trace;
    let _ = writeln!(
        s,
        "Trace `{}`{} ({}), content hash `{}`: {} sessions, {} agents, {} requests, {} prompt tokens.\n",
        t.path,
        t.name
            .as_deref()
            .map(|n| format!(" \"{n}\""))
            .unwrap_or_default(),
        t.format,
        t.content_hash,
        t.sessions,
        t.agents,
        count(t.requests),
        count(t.input_tokens)
    );
    let run = &r.run;
    let _ = writeln!(
        s,
        "Run: {} schedule{}, speedup {}×, {} s wall ({:.0} s of trace time), latencies from the {} clock; targets {}.\n",
        run.schedule,
        run.live_sessions
            .map(|n| format!(" ({n} live sessions)"))
            .unwrap_or_default(),
        run.speedup,
        format_args!("{:.1}", run.wall_s),
        run.trace_s,
        run.clock,
        run.targets.join(", ")
    );
    if run.schedule == "fixed" && run.lag_ms.count > 0 {
        let _ = writeln!(
            s,
            "Requests were sent behind their trace timestamps by {} (p50 / p90 / p99 of trace time){}.\n",
            dist(&run.lag_ms, "ms"),
            if run.lag_ms.p90 > 1000.0 {
                " — the replay did not keep up at this speedup; lower it for timings that follow the trace"
            } else {
                ""
            }
        );
    }

    let q = &r.requests;
    let errors = if q.errors_by_kind.is_empty() {
        String::new()
    } else {
        format!(
            " ({})",
            q.errors_by_kind
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let h = &r.hit_ratio;
    let tk = &r.tokens;
    let l = &r.latency;
    let mut rows: Vec<(&str, String)> = vec![
        (
            "requests",
            format!(
                "{} sent of {}; {} completed, {} errors{errors}, {} not sent, {} retried",
                q.sent, q.in_trace, q.completed, q.errors, q.not_sent, q.retried
            ),
        ),
        (
            "prompt tokens",
            format!(
                "{} ({} cached, {} computed)",
                count(tk.prompt),
                count(tk.cached),
                count(tk.computed)
            ),
        ),
    ];
    if let (Some(d), Some(rs)) = (tk.device_cached, tk.restored) {
        rows.push((
            "cached from",
            format!("device {}, host tier {}", count(d), count(rs)),
        ));
    }
    rows.extend([
        ("output tokens", count(tk.output)),
        (
            "hit ratio",
            format!(
                "{} — {} of the shared-cache ceiling {} (one infinite cache for the fleet: no placement serves more); {} of the session-affinity ceiling {} (an infinite cache per session: sessions sharing a prefix can beat it)",
                pct(h.overall),
                pct(h.of_shared_cache),
                pct(h.ideal_global),
                pct(h.of_ideal),
                pct(h.ideal_session)
            ),
        ),
        (
            "hit ratio, returning turns",
            format!(
                "{} — session-affinity ceiling {}: {} of it",
                pct(h.returning),
                pct(h.ideal_session_returning),
                pct(h.of_ideal_returning)
            ),
        ),
        (
            "avoidable re-prefill (fleet)",
            format!(
                "{} of {} tokens one shared infinite cache would have served",
                count(r.reprefill.avoidable_tokens),
                count(r.reprefill.reusable_tokens),
            ),
        ),
        (
            "avoidable at the placement seen",
            format!(
                "{} of {} reusable tokens ({}: eviction's share, routing held fixed)",
                count(r.reprefill.avoidable_at_placement_tokens),
                count(r.reprefill.reusable_at_placement_tokens),
                r.reprefill.placement_basis
            ),
        ),
        ("TTFT p50 / p90 / p99", dist(&l.ttft_ms, "ms")),
        ("ITL p50 / p90 / p99", dist(&l.itl_ms, "ms")),
        ("E2E p50 / p90 / p99", dist(&l.e2e_ms, "ms")),
        ("queue p50 / p90 / p99", dist(&l.queue_ms, "ms")),
        (
            "output tok/s per stream p50 / p90 / p99",
            dist(&l.output_tokens_per_s, ""),
        ),
        (
            "load max/mean",
            format!(
                "requests {}, prompt tokens {}, computed tokens {} over {} engines",
                opt(r.load.max_over_mean_requests),
                opt(r.load.max_over_mean_prompt_tokens),
                opt(r.load.max_over_mean_computed_tokens),
                r.load.engines.len()
            ),
        ),
        (
            "cost",
            match (&r.cost.basis, r.cost.usd_per_mtok) {
                (Some(b), Some(c)) => format!(
                    "${c:.4} per Mtok (${:.4} for {:.4} engine-hours, {b})",
                    r.cost.usd, r.cost.engine_hours
                ),
                _ => "- (no profile price known)".to_owned(),
            },
        ),
    ]);
    let _ = writeln!(s, "| metric | value |\n|---|---|");
    for (k, v) in rows {
        let _ = writeln!(s, "| {k} | {v} |");
    }

    if !r.load.engines.is_empty() {
        let _ = writeln!(
            s,
            "\n## Engines\n\n| engine | requests | prompt tokens | computed tokens | busy s |\n|---|---:|---:|---:|---:|"
        );
        for e in &r.load.engines {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                e.engine,
                e.requests,
                count(e.prompt_tokens),
                count(e.computed_tokens),
                e.busy_s.map_or("-".to_owned(), |b| format!("{b:.2}"))
            );
        }
    }

    let _ = writeln!(
        s,
        "\n## Configuration (hash `{}`)\n\n| key | value |\n|---|---|",
        r.config.hash
    );
    for (k, v) in &r.config.keys {
        let _ = writeln!(s, "| `{k}` | {v} |");
    }
    if !plots.is_empty() {
        let _ = writeln!(s, "\n## Plots\n");
        for p in plots {
            let _ = writeln!(s, "![{p}]({p})");
        }
    }
    s
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.2}"))
}
