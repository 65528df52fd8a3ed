use super::*;
use crate::sim::testkit::agent_trace;

fn profile() -> Profile {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"
    );
    Profile::from_file(std::path::Path::new(p)).unwrap()
}

fn cfg(slo: Slo, target: Option<Target>) -> PlanConfig {
    PlanConfig {
        sim: SimConfig {
            policy: Policy::TetherBounded,
            cache: CacheMode::RetentionHost,
            host_bytes: 1 << 34,
            ..SimConfig::default()
        },
        slo,
        target,
        api_price: Some(ApiPrice {
            input: 3.0,
            cached_input: 0.3,
            output: 15.0,
        }),
        interval_ms: 10_000.0,
        rounds: 4,
        observed_hits: None,
    }
}

#[test]
fn every_plan_is_verified_by_simulation_within_ten_percent() {
    let t = agent_trace(60, 6, 700, 300, 64);
    let slo = Slo {
        ttft_p90_ms: Some(200.0),
        ttft_p99_ms: Some(1000.0),
        itl_p99_ms: Some(20.0),
    };
    let r = plan(&t, &profile(), &cfg(slo, Some(Target::Blended(100.0)))).unwrap();
    assert_eq!(r.variants.len(), 4);
    for v in &r.variants {
        let sim = v.simulated.as_ref().unwrap();
        assert!(v.slo_met, "{}: {:?}", v.name, v.headroom);
        let a = v.agreement.unwrap();
        assert!(
            (0.9..=1.1).contains(&a),
            "{}: simulated / predicted = {a}",
            v.name
        );
        assert!(sim.ttft_ms.p99 <= 1000.0 && sim.sim.itl_ms.p99 <= 20.0);
        assert_eq!(sim.finished, sim.requests);
        assert!(v.headroom.iter().all(|(_, x)| *x <= 1.0));
        assert!(!v.steps.is_empty() && v.steps.iter().all(|s| s.decode >= 1));
        assert_eq!(v.disaggregated, v.steps.iter().all(|s| s.prefill >= 1));
    }
    assert_eq!(r.meets_target, Some(true));
    assert!(r.verdict.starts_with("target met"), "{}", r.verdict);
    assert!(r.tokens.cached > 0 && r.tokens.cached < r.tokens.prompt);
    assert!(r.api_ratio.unwrap() > 1.0);
    // The outputs an operator applies.
    let y = output::yaml(&r, "m", 1);
    assert!(
        y.contains("kind: Deployment") && y.contains("llm-prefill") && y.contains("llm-decode")
    );
    let j = output::replicas_json(&r);
    assert_eq!(j["variants"][0]["name"], "plan");
    assert!(output::text(&r).contains("verdict: target met"));
}

#[test]
fn a_target_below_the_cheapest_plan_is_refused_by_name() {
    let t = agent_trace(20, 4, 700, 300, 64);
    let slo = Slo {
        ttft_p99_ms: Some(2000.0),
        ..Slo::default()
    };
    let r = plan(
        &t,
        &profile(),
        &cfg(
            slo,
            Some(Target::Split {
                input: 0.0001,
                output: 0.0001,
            }),
        ),
    )
    .unwrap();
    assert_eq!(r.meets_target, Some(false));
    assert!(
        r.verdict.starts_with("cannot meet the target"),
        "{}",
        r.verdict
    );
    assert!(r.verdict.contains("binding constraint"), "{}", r.verdict);
}

#[test]
fn an_objective_no_fleet_meets_gets_a_clear_answer() {
    let t = agent_trace(20, 4, 700, 300, 64);
    // No engine decodes a token in 0.5 ms, and no prefill of 500 tokens takes 1 ms.
    for slo in [
        Slo {
            itl_p99_ms: Some(0.5),
            ..Slo::default()
        },
        Slo {
            ttft_p90_ms: Some(1.0),
            ..Slo::default()
        },
    ] {
        let r = plan(&t, &profile(), &cfg(slo, Some(Target::Blended(1.0)))).unwrap();
        assert!(
            r.verdict.starts_with("cannot meet the objectives"),
            "{}",
            r.verdict
        );
        assert_eq!(r.meets_target, Some(false));
    }
    let mut c = cfg(
        Slo {
            ttft_p99_ms: Some(1000.0),
            ..Slo::default()
        },
        None,
    );
    c.interval_ms = 10.0;
    assert!(
        plan(&t, &profile(), &c)
            .unwrap_err()
            .to_string()
            .contains("interval")
    );
}
