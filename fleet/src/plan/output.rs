//! What an operator reads: the plan as text, its replica counts as JSON and
//! the throughput-per-GPU vs interactivity chart (manifests: [`super::deploy`]).

use super::PlanReport;
use serde_json::{Value, json};
use std::fmt::Write;

/// `x` with `d` decimals, `-` when absent or not finite (never `inf`/`NaN`).
fn num(x: Option<f64>, d: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.d$}"),
        _ => "-".to_owned(),
    }
}

/// Interactivity at a TPOT quantile: `1000 / TPOT ms`.
fn interactivity(tpot_ms: f64) -> Option<f64> {
    (tpot_ms > 0.0).then(|| 1000.0 / tpot_ms)
}

/// The report for people.
pub fn text(r: &PlanReport) -> String {
    let mut s = String::new();
    let slo = &r.slo;
    let opt = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
    let _ = writeln!(
        s,
        "objectives (whole trace): TTFT p90 {}, TTFT p99 {}, ITL p99 {}; interval {:.0} s; target {}",
        opt(slo.ttft_p90_ms),
        opt(slo.ttft_p99_ms),
        opt(slo.itl_p99_ms),
        r.interval_s,
        r.target_usd_per_mtok
            .map_or("none".to_owned(), |t| format!("${t:.4}/Mtok"))
    );
    if r.too_long > 0 {
        let _ = writeln!(
            s,
            "{} requests over the profile's max_model_len are refused (400), as the engine refuses them, and left out of the objectives",
            r.too_long
        );
    }
    let _ = writeln!(
        s,
        "tokens: {} prompt ({} cached under the chosen configuration, {:.1} %), {} output",
        r.tokens.prompt,
        r.tokens.cached,
        100.0 * r.tokens.cached as f64 / r.tokens.prompt.max(1) as f64,
        r.tokens.output
    );
    if let Some(x) = &r.sample {
        let _ = writeln!(
            s,
            "searched on a 1-in-{} session sample ({} sessions, {} of {} requests, {}-token blocks): every variant's figures are the sample's but `whole-trace`'s, the choice simulated on the whole trace ({}-token blocks)",
            x.every, x.sessions, x.requests, x.trace_requests, x.block_tokens, x.whole_block_tokens
        );
    }
    let _ = writeln!(
        s,
        "  {:<14} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7} {:>9} {:>7} {:>7} {:>6} {:>4}",
        "variant",
        "prefill",
        "decode",
        "GPU-h",
        "$/Mtok",
        "sim $/Mt",
        "sim/pred",
        "TTFT90",
        "TTFT99",
        "ITL99",
        "tok/GPU-s",
        "int p50",
        "int p90",
        "SLO",
        "runs"
    );
    for (k, v) in r.variants.iter().enumerate() {
        let sim = v.simulated.as_ref();
        let mark = if Some(k) == r.chosen {
            "*"
        } else if Some(k) == r.runner_up {
            "+"
        } else {
            " "
        };
        let _ = writeln!(
            s,
            "{mark} {:<14} {:>8} {:>8} {:>9.2} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7} {:>9} {:>7} {:>7} {:>6} {:>4}",
            v.name,
            if v.disaggregated {
                format!("{} GPU", v.peak_prefill_gpus)
            } else {
                "-".into()
            },
            format!("{} GPU", v.peak_decode_gpus),
            v.gpu_hours(),
            num(v.predicted_usd_per_mtok, 4),
            num(sim.map(|x| x.sim.usd_per_mtok), 4),
            num(v.agreement, 3),
            num(sim.map(|x| x.ttft_ms.p90), 0),
            num(sim.map(|x| x.ttft_ms.p99), 0),
            num(sim.map(|x| x.sim.itl_ms.p99), 1),
            num(sim.map(|x| x.sim.tokens_per_gpu_s), 0),
            num(sim.and_then(|x| interactivity(x.tpot_ms.p50)), 0),
            num(sim.and_then(|x| interactivity(x.tpot_ms.p90)), 0),
            if v.simulated.is_none() {
                "none"
            } else if v.slo_met {
                "met"
            } else {
                "MISSED"
            },
            v.rounds
        );
    }
    let _ = writeln!(
        s,
        "(* chosen, + runner-up; prefill/decode: peak GPUs; $/Mtok predicted from planned GPU-hours; sim: the fleet simulated on the trace; int: interactivity, output tokens/s per stream = 1000 / TPOT at p50 and p90)"
    );
    for v in &r.variants {
        let _ = writeln!(s, "  {:<14} {}", v.name, v.what);
    }
    if !r.search.is_empty() {
        let _ = writeln!(
            s,
            "search ({} candidates pruned by their profile-only cost):",
            r.pruned
        );
        for st in &r.search {
            let _ = writeln!(
                s,
                "  {:<40} tried {:>2}: {} (saved ${}/Mtok)",
                st.step,
                st.tried,
                st.chose,
                num(Some(st.saved_usd_per_mtok), 4)
            );
        }
    }
    if !r.waterfall.is_empty() {
        let _ = writeln!(
            s,
            "waterfall (simulated $/Mtok, peak GPUs, hit ratio, retained turns):"
        );
        for w in &r.waterfall {
            let _ = writeln!(
                s,
                "  {:<64} ${:>9} ({:>+9}) {:>5} GPU ({:>+4}) hits {:>5.1} % retained {}",
                w.step,
                num(Some(w.usd_per_mtok), 4),
                num(Some(w.delta_usd_per_mtok), 4),
                w.gpus,
                w.delta_gpus,
                100.0 * w.hit_ratio,
                w.retained_turns
            );
        }
    }
    if !r.changes.is_empty() {
        let _ = writeln!(
            s,
            "other configurations, by simulated $/Mtok (change from the chosen one):"
        );
        for c in r.changes.iter().take(12) {
            let _ = writeln!(
                s,
                "  {:<14} {:>+9} $/Mtok {:>+8.2} GPU-h  {}{}",
                c.variant,
                num(Some(c.delta_usd_per_mtok), 4),
                c.delta_gpu_hours,
                c.change,
                c.misses
                    .as_ref()
                    .map_or(String::new(), |m| format!(" — misses: {m}"))
            );
        }
    }
    if let Some(a) = r.api {
        let _ = writeln!(
            s,
            "an API would charge ${:.2} for this trace's tokens, {:.1}x the chosen fleet's ${:.2}",
            a.api_usd, a.ratio, a.fleet_usd
        );
    }
    let _ = writeln!(s, "verdict: {}", r.verdict);
    s
}

/// The throughput-per-GPU vs interactivity chart of every simulated variant.
pub fn svg(r: &PlanReport) -> String {
    let points: Vec<crate::sim::plot::Point> = r
        .variants
        .iter()
        .filter_map(|v| {
            let sim = v.simulated.as_ref()?;
            Some(crate::sim::plot::Point {
                label: format!(
                    "{}{}",
                    v.name,
                    if r.chosen().is_some_and(|c| c.name == v.name) {
                        " (chosen)"
                    } else {
                        ""
                    }
                ),
                x: sim.sim.interactivity_tok_s,
                y: sim.sim.tokens_per_gpu_s,
            })
        })
        .collect();
    crate::sim::plot::svg(
        "tether plan: tokens per GPU-second vs interactivity",
        &points,
    )
}

/// Replica counts per interval, per variant.
pub fn replicas_json(r: &PlanReport) -> Value {
    let variants: Vec<Value> = r
        .variants
        .iter()
        .map(|v| {
            json!({
                "name": v.name,
                "chosen": r.chosen().is_some_and(|c| c.name == v.name),
                "disaggregated": v.disaggregated,
                "steps": v.steps.iter().map(|s| json!({
                    "from_s": (s.start_ms / 1000.0).round(),
                    "prefill": if v.disaggregated { Some(s.prefill) } else { None },
                    "decode": if v.disaggregated { Some(s.decode) } else { None },
                    "aggregated": if v.disaggregated { None } else { Some(s.decode) },
                })).collect::<Vec<_>>(),
                "peak_prefill_gpus": v.peak_prefill_gpus,
                "peak_decode_gpus": v.peak_decode_gpus,
            })
        })
        .collect();
    json!({"interval_s": r.interval_s, "variants": variants})
}
