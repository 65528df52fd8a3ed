//! What an operator reads and applies: the plan as text, its replica counts
//! as JSON, and a Kubernetes-style YAML snippet per pool.

use super::{PlanReport, Variant};
use serde_json::{Value, json};
use std::fmt::Write;

fn gpu_hours(v: &Variant) -> f64 {
    v.prefill_gpu_hours + v.decode_gpu_hours
}

fn cost(v: &Variant) -> f64 {
    v.simulated
        .as_ref()
        .map_or(v.predicted_usd_per_mtok, |s| s.sim.usd_per_mtok)
}

/// The report for people.
pub fn text(r: &PlanReport) -> String {
    let mut s = String::new();
    let slo = &r.slo;
    let opt = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
    let _ = writeln!(
        s,
        "objectives: TTFT p90 {}, TTFT p99 {}, ITL p99 {}; interval {:.0} s; target {}",
        opt(slo.ttft_p90_ms),
        opt(slo.ttft_p99_ms),
        opt(slo.itl_p99_ms),
        r.interval_s,
        r.target_usd_per_mtok
            .map_or("none".to_owned(), |t| format!("${t:.4}/Mtok"))
    );
    let _ = writeln!(
        s,
        "tokens: {} prompt ({} cached under the plan, {:.1} %), {} output",
        r.tokens.prompt,
        r.tokens.cached,
        100.0 * r.tokens.cached as f64 / r.tokens.prompt.max(1) as f64,
        r.tokens.output
    );
    let _ = writeln!(
        s,
        "{:<13} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>8} {:>9} {:>9} {:>8} {:>6}",
        "variant",
        "prefill",
        "decode",
        "GPU-hours",
        "$/Mtok",
        "sim $/Mt",
        "sim/pred",
        "TTFT90",
        "TTFT99",
        "ITL99",
        "SLO",
        "rounds"
    );
    for v in &r.variants {
        let sim = v.simulated.as_ref();
        let f = |x: Option<f64>, d: usize| x.map_or("-".to_owned(), |v| format!("{v:.d$}"));
        let _ = writeln!(
            s,
            "{:<13} {:>9} {:>9} {:>10.2} {:>10.4} {:>9} {:>9} {:>8} {:>9} {:>9} {:>8} {:>6}",
            v.name,
            if v.disaggregated {
                format!("{} GPU", v.peak_prefill_gpus)
            } else {
                "-".into()
            },
            format!("{} GPU", v.peak_decode_gpus),
            gpu_hours(v),
            v.predicted_usd_per_mtok,
            f(sim.map(|x| x.sim.usd_per_mtok), 4),
            f(v.agreement, 3),
            f(sim.map(|x| x.ttft_ms.p90), 0),
            f(sim.map(|x| x.ttft_ms.p99), 0),
            f(sim.map(|x| x.sim.itl_ms.p99), 1),
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
        "(prefill/decode: peak GPUs; $/Mtok predicted from planned GPU-hours; sim: the planned fleet simulated on the trace)"
    );
    let plan = &r.variants[0];
    for v in &r.variants[1..] {
        let d = cost(v) - cost(plan);
        let _ = writeln!(
            s,
            "{:<13} vs plan: {:+.4} $/Mtok ({:+.1} %), {:+.2} GPU-hours{}",
            v.name,
            d,
            100.0 * d / cost(plan).max(1e-12),
            gpu_hours(v) - gpu_hours(plan),
            if v.disaggregated && plan.disaggregated {
                format!(
                    ", prefill {:+.2} GPU-hours (peak {} vs {} GPUs)",
                    v.prefill_gpu_hours - plan.prefill_gpu_hours,
                    v.peak_prefill_gpus,
                    plan.peak_prefill_gpus
                )
            } else {
                String::new()
            }
        );
    }
    for v in &r.variants {
        if let Some(inf) = &v.infeasible {
            let sized = if v.simulated.is_some() {
                " (sized for throughput alone and simulated)"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "{}: no fleet meets the objectives: {}{sized}",
                v.name, inf.why
            );
        }
    }
    if let Some(a) = r.api_ratio {
        let _ = writeln!(
            s,
            "the API would charge {a:.1}x the plan's cost for this trace's tokens"
        );
    }
    let _ = writeln!(s, "verdict: {}", r.verdict);
    s
}

/// Replica counts per interval, per variant.
pub fn replicas_json(r: &PlanReport) -> Value {
    let variants: Vec<Value> = r
        .variants
        .iter()
        .map(|v| {
            json!({
                "name": v.name,
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

/// A Kubernetes-style snippet for the plan: one Deployment per pool, replicas
/// at the plan's peak, the per-interval schedule in an annotation (apply it
/// with a scheduled scaler, or keep the peak).
pub fn yaml(r: &PlanReport, model: &str, gpus_per_engine: u32) -> String {
    let v = &r.variants[0];
    let mut s = String::new();
    let _ = writeln!(s, "# tether plan: {} (verdict: {})", v.what, r.verdict);
    let pools: Vec<(&str, Vec<usize>)> = if v.disaggregated {
        vec![
            ("prefill", v.steps.iter().map(|x| x.prefill).collect()),
            ("decode", v.steps.iter().map(|x| x.decode).collect()),
        ]
    } else {
        vec![("aggregated", v.steps.iter().map(|x| x.decode).collect())]
    };
    for (pool, counts) in pools {
        let peak = counts.iter().copied().max().unwrap_or(0);
        let schedule: Vec<String> = v
            .steps
            .iter()
            .zip(&counts)
            .map(|(st, c)| format!("{}s={c}", (st.start_ms / 1000.0).round()))
            .collect();
        let _ = write!(
            s,
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: llm-{pool}\n  labels:\n    app.kubernetes.io/component: {pool}\n  annotations:\n    tether.dev/model: \"{model}\"\n    tether.dev/replica-schedule: \"{}\"\nspec:\n  replicas: {peak}\n  selector:\n    matchLabels:\n      app.kubernetes.io/component: {pool}\n  template:\n    metadata:\n      labels:\n        app.kubernetes.io/component: {pool}\n    spec:\n      containers:\n      - name: engine\n        resources:\n          limits:\n            nvidia.com/gpu: {gpus_per_engine}\n",
            schedule.join(",")
        );
    }
    s
}
