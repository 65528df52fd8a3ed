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
            cache_write: Some(3.75),
            output: 15.0,
        }),
        interval_ms: 10_000.0,
        rounds: 4,
        observed_hits: None,
        per_interval: false,
        cap_context: false,
        spend: None,
        search: true,
    }
}

fn slo() -> Slo {
    Slo {
        ttft_p90_ms: Some(200.0),
        ttft_p99_ms: Some(1000.0),
        itl_p99_ms: Some(20.0),
    }
}

/// No `inf`, `NaN` or `-inf` anywhere a person or a program reads.
fn finite_everywhere(r: &PlanReport) {
    let t = output::text(r);
    let bad = t
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .any(|w| ["nan", "inf", "-inf"].contains(&w.to_lowercase().as_str()));
    assert!(!bad, "{t}");
    // serde_json writes a non-finite number as null: no figure may be one.
    for v in &r.variants {
        let f = [
            v.gpu_hours(),
            v.usd_per_mtok().unwrap_or(0.0),
            v.worst_miss(),
        ];
        assert!(f.iter().all(|x| x.is_finite()), "{}: {f:?}", v.name);
    }
}

#[test]
fn the_chosen_configuration_is_the_cheapest_that_meets_and_is_verified() {
    let t = agent_trace(60, 6, 700, 300, 64);
    let r = plan(&t, &profile(), &cfg(slo(), Some(Target::Blended(100.0)))).unwrap();
    let c = r.chosen().expect("a configuration meets the objectives");
    let sim = c.simulated.as_ref().unwrap();
    assert!(c.meets(), "{:?}", c.headroom);
    assert!(sim.ttft_ms.p99 <= 1000.0 && sim.sim.itl_ms.p99 <= 20.0);
    assert_eq!(sim.finished, sim.requests);
    let a = c.agreement.unwrap();
    assert!((0.9..=1.1).contains(&a), "simulated / predicted = {a}");
    // Never more expensive than any printed variant that meets the objectives.
    let cost = c.usd_per_mtok().unwrap();
    for v in r.variants.iter().filter(|v| v.meets()) {
        assert!(
            cost <= v.usd_per_mtok().unwrap() + 1e-12,
            "{} is cheaper",
            v.name
        );
    }
    let runner = &r.variants[r.runner_up.unwrap()];
    assert!(runner.meets() && runner.usd_per_mtok().unwrap() >= cost);
    // The baselines are there, and the search took its steps.
    for name in ["plan", "coupled", "routing-only", "no-reuse"] {
        assert!(r.variants.iter().any(|v| v.name == name), "{name}");
    }
    assert!(r.search.len() >= 5, "{:?}", r.search);
    assert!(r.waterfall.len() >= 3 && r.waterfall[0].variant == "no-reuse");
    assert_eq!(r.meets_target, Some(true));
    assert!(r.verdict.starts_with("target met"), "{}", r.verdict);
    assert!(r.headroom_usd_per_mtok.unwrap() > 0.0);
    assert!(r.tokens.cached > 0 && r.tokens.cached < r.tokens.prompt);
    let api = r.api.unwrap();
    assert!(api.ratio > 1.0 && api.api_usd > 0.0);
    finite_everywhere(&r);
    // The outputs an operator applies.
    let o = deploy::DeployOptions {
        name: "agents".into(),
        model: "m".into(),
        image: "img".into(),
        gpus_per_engine: 1,
        max_model_len: None,
        host_bytes: 1 << 34,
    };
    let y = deploy::dynamo(&r, &o).unwrap();
    assert!(y.contains("kind: DynamoGraphDeployment"), "{y}");
    let l = deploy::llm_d(&r, &o).unwrap();
    assert!(
        l.contains("kind: LeaderWorkerSet") && l.contains("llm-d.ai/role"),
        "{l}"
    );
    let j = output::replicas_json(&r);
    assert!(
        j["variants"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["chosen"] == true)
    );
    assert!(output::text(&r).contains("verdict: target met"));
    assert!(output::svg(&r).contains("<svg"));
}

#[test]
fn a_target_below_the_cheapest_plan_is_refused_by_name() {
    let t = agent_trace(20, 4, 700, 300, 64);
    let slo = Slo {
        ttft_p99_ms: Some(2000.0),
        ..Slo::default()
    };
    let mut c = cfg(
        slo,
        Some(Target::Split {
            input: 0.0001,
            output: 0.0001,
        }),
    );
    c.search = false;
    let r = plan(&t, &profile(), &c).unwrap();
    assert_eq!(r.meets_target, Some(false));
    assert!(
        r.verdict.starts_with("cannot meet the target"),
        "{}",
        r.verdict
    );
    assert!(r.verdict.contains("binding constraint"), "{}", r.verdict);
    // The changes tried are ranked by their simulated cost.
    assert!(
        r.changes
            .windows(2)
            .all(|w| w[0].usd_per_mtok <= w[1].usd_per_mtok)
    );
    finite_everywhere(&r);
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
        let mut c = cfg(slo, Some(Target::Blended(1.0)));
        c.search = false;
        let r = plan(&t, &profile(), &c).unwrap();
        assert!(r.chosen.is_none());
        assert!(
            r.verdict.starts_with("cannot meet the objectives"),
            "{}",
            r.verdict
        );
        assert_eq!(r.meets_target, Some(false));
        finite_everywhere(&r);
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

#[test]
fn a_target_sweep_spends_headroom_and_never_exceeds_a_target_that_can_be_met() {
    let t = agent_trace(40, 5, 700, 300, 64);
    let mut chosen = Vec::new();
    for target in [0.05, 0.5, 5.0, 50.0] {
        let mut c = cfg(slo(), Some(Target::Blended(target)));
        c.spend = Some(Spend::Interactivity);
        let r = plan(&t, &profile(), &c).unwrap();
        let c = r.chosen().unwrap();
        let cost = c.usd_per_mtok().unwrap();
        let under = r
            .variants
            .iter()
            .any(|v| v.meets() && v.usd_per_mtok().is_some_and(|x| x <= target));
        if under {
            assert!(cost <= target, "target {target}: chose ${cost} over it");
        }
        let inter = c.simulated.as_ref().unwrap().sim.interactivity_tok_s;
        chosen.push((target, cost, inter, c.name.clone()));
        finite_everywhere(&r);
    }
    // More money buys at least as much interactivity, and a loose target buys more.
    for w in chosen.windows(2) {
        assert!(w[1].2 >= w[0].2 - 1e-9, "{chosen:?}");
    }
    assert!(chosen[3].2 > chosen[0].2, "{chosen:?}");
}

#[test]
fn prompts_over_max_model_len_are_refused_unless_capped() {
    let t = agent_trace(10, 4, 700, 300, 64);
    let mut p = profile();
    p.max_model_len = Some(500);
    let c = cfg(slo(), None);
    let e = plan(&t, &p, &c).unwrap_err().to_string();
    assert!(
        e.contains("max_model_len of 500") && e.contains("--cap-context"),
        "{e}"
    );
    let mut c = cfg(slo(), None);
    c.cap_context = true;
    c.search = false;
    let r = plan(&t, &p, &c).unwrap();
    assert!(r.too_long > 0);
    let sim = r.chosen().unwrap().simulated.as_ref().unwrap();
    assert_eq!(sim.sim.too_long, r.too_long);
}

#[test]
fn no_prefill_pool_when_nothing_goes_remote() {
    let t = agent_trace(20, 4, 700, 300, 64);
    let mut c = cfg(slo(), None);
    c.search = false;
    c.sim.pd.threshold_tokens = 1 << 30;
    let r = plan(&t, &profile(), &c).unwrap();
    let v = r.variants.iter().find(|v| v.name == "plan").unwrap();
    assert!(v.steps.iter().all(|s| s.prefill == 0), "{:?}", v.steps);
    assert_eq!(v.peak_prefill_gpus, 0);
}

#[test]
fn a_prompt_larger_than_the_device_is_named_not_grown_for() {
    let t = agent_trace(10, 4, 700, 300, 64);
    let mut c = cfg(slo(), None);
    c.search = false;
    c.sim.engine.device_kv_tokens = Some(300);
    let r = plan(&t, &profile(), &c).unwrap();
    assert!(r.chosen.is_none());
    assert!(
        r.verdict.contains("KV memory") && r.verdict.contains("300 KV tokens"),
        "{}",
        r.verdict
    );
    finite_everywhere(&r);
}

/// A steady 30 s trace, one planning interval: a request a session, 10 a
/// second, 12 k-token prompts sharing a 10.7 k-token prefix, 800 output
/// tokens. The fleet drains for seconds after the interval — 10–20 % of the
/// bill when the prediction left it out.
fn steady_trace() -> Trace {
    steady_trace_of(300, 100, 168)
}

/// `n` 12 K-token prompts `gap_ms` apart, the first `shared` blocks of each shared.
fn steady_trace_of(n: u64, gap_ms: u64, shared: u64) -> Trace {
    use crate::trace::{AgentSpec, RequestSpec, SessionSpec, TraceBuilder, TurnKind};
    let mut b = TraceBuilder::new(64).unwrap();
    for i in 0..n {
        let s = b
            .session(SessionSpec {
                id: format!("s{i}"),
                start_ms: Some(i * gap_ms),
                ..Default::default()
            })
            .unwrap();
        let main = AgentSpec {
            id: "main".into(),
            agent_type: "main".into(),
            ..Default::default()
        };
        let m = b.agent(s, main).unwrap();
        let own = 188 - shared;
        let ids: Vec<u64> = (0..shared)
            .chain((0..own).map(|k| 1_000_000 + i * own + k))
            .collect();
        b.request(m, RequestSpec::new(0, 12_000, 800, TurnKind::First), &ids)
            .unwrap();
    }
    b.build().unwrap()
}

#[test]
fn predicted_and_simulated_cost_agree_within_ten_percent_drain_included() {
    let generated = crate::generate::generate(&crate::generate::GenerateOptions {
        seed: 5,
        sessions: 12,
        session_span_ms: Some(20_000.0),
        max_context_tokens: 24_000,
        summary_tokens: 2_000.0,
        ..Default::default()
    })
    .unwrap();
    let slo = Slo {
        ttft_p90_ms: None,
        ttft_p99_ms: Some(3000.0),
        itl_p99_ms: Some(25.0),
    };
    for (name, t, interval_ms) in [
        ("steady 30 s", steady_trace(), 30_000.0),
        ("generated", generated, 10_000.0),
    ] {
        let mut c = cfg(slo, None);
        c.search = false;
        c.rounds = 2;
        c.interval_ms = interval_ms;
        let r = plan(&t, &profile(), &c).unwrap();
        let simulated: Vec<_> = r
            .variants
            .iter()
            .filter(|v| v.simulated.is_some())
            .collect();
        assert!(simulated.len() >= 3, "{name}");
        for v in simulated {
            let a = v.agreement.unwrap();
            eprintln!("AGREE {name} {} {a:.3} {:.1}", v.name, v.drain_s);
            assert!(
                (0.9..=1.1).contains(&a),
                "{name}, {}: simulated / predicted = {a:.3} (predicted drain {:.1} s)",
                v.name,
                v.drain_s
            );
        }
    }
}

#[test]
fn a_large_trace_is_searched_on_a_sample_and_its_choice_verified_whole() {
    let t = agent_trace(60, 6, 700, 300, 64);
    let c = cfg(slo(), Some(Target::Blended(100.0)));
    let run = RunOptions {
        sample_requests: t.requests().len() / 4,
        coarse_whole: false,
        observer: &progress::Quiet,
    };
    let r = plan_with(&t, &profile(), &c, &run).unwrap();
    let s = r.sample.expect("planned on a sample");
    assert_eq!(s.trace_requests, t.requests().len());
    assert!(s.every >= 4 && s.requests < t.requests().len() / 2, "{s:?}");
    let chosen = r.chosen().expect("the choice meets on the whole trace");
    assert_eq!(chosen.name, "whole-trace");
    let sim = chosen.simulated.as_ref().unwrap();
    assert_eq!(sim.requests, t.requests().len() as u64);
    assert!(chosen.meets(), "{:?}", chosen.headroom);
    let a = chosen.agreement.unwrap();
    assert!((0.9..=1.1).contains(&a), "simulated / predicted = {a}");
    assert!(r.verdict.starts_with("target met"), "{}", r.verdict);
    finite_everywhere(&r);
}

fn step(prefill: usize, decode: usize) -> crate::sim::Step {
    crate::sim::Step {
        start_ms: 0.0,
        prefill,
        decode,
    }
}

#[test]
fn a_whole_trace_fleet_is_the_model_times_the_calibration_never_below_the_floor() {
    let model = [step(2, 3), step(0, 5), step(7, 1)];
    let floor = [step(4, 1), step(3, 6), step(1, 1)];
    let got = whole::scaled(&model, (1.5, 1.0), Some(&floor));
    let counts: Vec<_> = got.iter().map(|s| (s.prefill, s.decode)).collect();
    // 2 × 1.5 = 3 < the floor's 4; no prefill pool stays none; 7 × 1.5 → 11.
    assert_eq!(counts, [(4, 3), (0, 6), (11, 1)]);
    let bare: Vec<_> = whole::scaled(&model, (0.1, 1.0), None)
        .iter()
        .map(|s| (s.prefill, s.decode))
        .collect();
    assert_eq!(
        bare,
        [(1, 3), (0, 5), (1, 1)],
        "at least one where the model has one"
    );
}

#[test]
fn one_correction_round_of_the_whole_trace_grows_both_pools_in_one_fleet() {
    let sz = |n| {
        (
            size::Size::of(n, Binding::Throughput),
            size::Size::of(n, Binding::Throughput),
        )
    };
    let grown = |n| {
        (
            size::Size::of(n, Binding::Simulation),
            size::Size::of(n, Binding::Throughput),
        )
    };
    let mut steps = vec![step(6, 10), step(5, 8)];
    let mut sizes = vec![grown(7), sz(5)];
    steps[0].prefill = 7; // the prefill option grew interval 0's prefill pool
    let decode_option = [step(6, 12), step(5, 8)];
    let decode_sizes = [
        (
            size::Size::of(6, Binding::Throughput),
            size::Size::of(12, Binding::Simulation),
        ),
        sz(5),
    ];
    fit::take_larger(&mut steps, &mut sizes, &decode_option, &decode_sizes);
    let counts: Vec<_> = steps.iter().map(|s| (s.prefill, s.decode)).collect();
    assert_eq!(counts, [(7, 12), (5, 8)]);
    assert_eq!(sizes[0].0.binding, Binding::Simulation);
    assert_eq!(sizes[0].1.binding, Binding::Simulation);
}

#[test]
fn an_uncorrected_no_reuse_choice_is_sized_for_the_whole_trace_with_its_queueing() {
    let t = steady_trace_of(1200, 25, 0);
    let mut c = cfg(
        Slo {
            ttft_p90_ms: None,
            ttft_p99_ms: Some(3000.0),
            itl_p99_ms: Some(25.0),
        },
        None,
    );
    c.interval_ms = 30_000.0;
    let prof = profile();
    let p = planner(&t, &prof, &c, &progress::Quiet).unwrap();
    let v = baseline::no_reuse(&p, &start(&c)).unwrap();
    let work = p.hits(&v.settings).unwrap();
    let steps = whole::sized_for_whole(&p, &p, &v, &work);
    let dynamo = baseline::dynamo_steps(&p, &p.cold_work(), &c.sim);
    let total = |s: &[crate::sim::Step]| s.iter().map(|x| x.prefill + x.decode).sum::<usize>();
    for (a, d) in steps.iter().zip(&dynamo) {
        assert!(
            a.prefill >= d.prefill && a.decode >= d.decode,
            "{steps:?} vs {dynamo:?}"
        );
    }
    assert!(
        total(&steps) > total(&dynamo),
        "the queueing model adds to Dynamo's throughput count: {steps:?} vs {dynamo:?}"
    );
    let (r, _) = p.run(&v.settings, &steps, false).unwrap();
    assert!(p.misses(&r).is_empty(), "{:?}", p.headroom(&r));
}

#[test]
fn merged_blocks_keep_their_ids_and_equal_runs_stay_equal() {
    let ids = [1u64, 2, 3, 4, 1, 2, 3, 4, 9];
    let mut out = Vec::new();
    sample::merged(&ids, 4, &mut out);
    assert_eq!(out.len(), 3);
    assert_eq!(out[0], out[1], "equal runs at equal places, equal ids");
    let bytes: Vec<u8> = [1u64, 2, 3, 4]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    // The id a run had before the buffer was shared: a sample's ids (and its
    // routing hashes) are unchanged.
    assert_eq!(out[0], xxhash_rust::xxh3::xxh3_64(&bytes));
    assert_eq!(out[2], xxhash_rust::xxh3::xxh3_64(&9u64.to_le_bytes()));
}
