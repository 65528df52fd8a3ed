//! Known answers, computed by hand from the formulas and a hand-made profile.

use super::*;
use tether_rank_engine::profile::{Curve, DecodeSurface, Profile};

/// Prefill: 100 ms per 1,000 tokens, linear. Decode at every context: 10 ms
/// for one sequence, +1 ms per further sequence (b = 11 → 20 ms).
fn model() -> LatencyModel {
    LatencyModel::new(Profile {
        name: "hand".into(),
        model: "m".into(),
        gpu: "g".into(),
        gpus_per_engine: 1,
        gpu_hour_usd: 1.0,
        max_kv_tokens: 100_000,
        kv_bytes_per_token: 1,
        host_restore_gbps: 1.0,
        max_model_len: None,
        prefill_ttft_ms: Curve::try_new("p", vec![(1000.0, 100.0), (2000.0, 200.0)]).unwrap(),
        decode_itl_ms: DecodeSurface::try_new(
            "d",
            vec![(
                1000.0,
                Curve::try_new("d", vec![(1.0, 10.0), (11.0, 20.0)]).unwrap(),
            )],
        )
        .unwrap(),
        hybrid: None,
        sources: vec![],
    })
}

#[test]
fn erlang_c_matches_the_textbook() {
    // M/M/1: P(wait) = ρ. M/M/2 at a = 1: C = 1/3.
    assert!((erlang_c(1, 0.5) - 0.5).abs() < 1e-12);
    assert!((erlang_c(2, 1.0) - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(erlang_c(3, 3.0), 1.0);
    // M/M/1 wait quantile: P(W > t) = ρ e^{−(μ−λ)t} → t99 = ln(100 ρ) / (μ − λ).
    let (lambda, s) = (0.005, 100.0); // ρ = 0.5, μ − λ = 0.005 per ms
    let t = wait_quantile(1, lambda, s, 1.0, 1.0, 0.99);
    assert!((t - (50.0f64).ln() / 0.005).abs() < 1e-9, "{t}");
    assert_eq!(
        wait_quantile(1, lambda, s, 1.0, 1.0, 0.4),
        0.0,
        "P(wait) 0.5 < 0.6"
    );
    assert_eq!(wait_quantile(1, 0.02, s, 1.0, 1.0, 0.9), f64::INFINITY);
}

#[test]
fn prefill_replicas_meet_the_ttft_objective_and_no_more() {
    // 600 requests of 1,000 uncached tokens (100 ms each) in 60 s: 1 engine-minute of work.
    let load = PrefillLoad {
        split: false,
        service_ms: vec![100.0; 600],
        after_ms: 0.0,
        len_ms: 60_000.0,
        ca2: 1.0,
        busy_share: 0.0,
    };
    let slo = Slo {
        ttft_p99_ms: Some(400.0),
        ..Slo::default()
    };
    let n = prefill(&load, &slo).unwrap();
    // One engine would run at ρ = 1; two at 0.5: p99 wait (0.5 / 0.01) · ln((1/3) / 0.01) ≈ 175 ms, + 100 ms: meets.
    assert_eq!(n.replicas, 2, "{n:?}");
    let (_, p99) = ttft(&load, 2);
    assert!(p99 <= 400.0 && ttft(&load, 1).1 > 400.0);
    // An objective below a lone prefill is refused by name.
    let e = prefill(
        &load,
        &Slo {
            ttft_p90_ms: Some(50.0),
            ..Slo::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.binding, Binding::TtftP90);
    assert!(e.why.contains("100 ms"), "{}", e.why);
    // No work, no replicas.
    let idle = PrefillLoad {
        split: false,
        service_ms: vec![],
        ..load
    };
    assert_eq!(prefill(&idle, &slo).unwrap().replicas, 0);
}

#[test]
fn a_round_robin_prefill_pool_queues_per_engine_and_needs_more_engines() {
    // 60 s of prompts, one in ten 10× longer (CV² ≈ 5): ~18 engine-minutes.
    let service_ms: Vec<f64> = (0..6_000)
        .map(|k| if k % 10 == 0 { 1_000.0 } else { 100.0 })
        .collect();
    let shared = PrefillLoad {
        split: false,
        service_ms,
        after_ms: 0.0,
        len_ms: 60_000.0,
        ca2: 1.0,
        busy_share: 0.0,
    };
    let split = PrefillLoad {
        split: true,
        service_ms: shared.service_ms.clone(),
        ..shared
    };
    let slo = Slo {
        ttft_p90_ms: Some(1_500.0),
        ..Slo::default()
    };
    // On one engine the two are the same queue.
    assert_eq!(ttft(&shared, 1), ttft(&split, 1));
    // At twenty, one queue per engine waits longer: a long prompt holds up
    // its own engine's queue while the others idle.
    assert!(ttft(&split, 20).0 > ttft(&shared, 20).0 + 100.0);
    let (a, b) = (
        prefill(&shared, &slo).unwrap(),
        prefill(&split, &slo).unwrap(),
    );
    assert!(b.replicas > a.replicas, "{a:?} vs {b:?}");
}

/// `kv` KV tokens and vLLM's default `--max-num-seqs` 256.
fn kv(kv_tokens: u64) -> EngineLimits {
    EngineLimits {
        kv_tokens,
        max_num_seqs: 256,
    }
}

/// 66,000 output tokens of 1,000-token contexts in a minute, ITL p99 ≤ 23 ms.
fn minute_of_decode() -> (DecodeLoad, Slo) {
    (
        DecodeLoad {
            output_tokens: 66_000.0,
            context: 1000.0,
            len_ms: 60_000.0,
            local_prefill_ms: 0.0,
        },
        Slo {
            itl_p99_ms: Some(23.0),
            ..Slo::default()
        },
    )
}

#[test]
fn decode_batches_up_to_the_itl_target_and_kv() {
    let m = model();
    // ITL 23 ms / 1.15 = 20 ms → batch 11 (10 ms + 10 × 1 ms).
    assert_eq!(
        max_batch(&m, 1000.0, Some(23.0), kv(1_000_000)),
        Some((11, Binding::Itl))
    );
    // KV: 0.9 × 10,000 / 1,000 = 9 sequences.
    assert_eq!(
        max_batch(&m, 1000.0, Some(23.0), kv(10_000)),
        Some((9, Binding::KvMemory))
    );
    assert_eq!(
        max_batch(&m, 1000.0, Some(11.0), kv(1_000_000)),
        None,
        "one sequence takes 10 ms"
    );
    // 11 sequences at 20 ms: 0.55 tokens/ms per engine. 66,000 tokens in 60 s =
    // 1.1 tokens/ms → 2 engines at full batch, /0.95 → 3.
    let (load, slo) = minute_of_decode();
    assert_eq!(decode(&m, &load, &slo, kv(1_000_000)).unwrap().replicas, 3);
    // A minute of local prefill adds one engine's worth.
    let with = DecodeLoad {
        local_prefill_ms: 60_000.0,
        ..load
    };
    assert_eq!(decode(&m, &with, &slo, kv(1_000_000)).unwrap().replicas, 4);
    let e = decode(
        &m,
        &with,
        &Slo {
            itl_p99_ms: Some(5.0),
            ..Slo::default()
        },
        kv(1_000_000),
    )
    .unwrap_err();
    assert_eq!(e.binding, Binding::Itl);
}

#[test]
fn decode_is_bounded_by_max_num_seqs_and_the_context() {
    let m = model();
    // ITL alone allows 11; --max-num-seqs 4 binds first.
    let four = EngineLimits {
        kv_tokens: 1_000_000,
        max_num_seqs: 4,
    };
    assert_eq!(
        max_batch(&m, 1000.0, Some(23.0), four),
        Some((4, Binding::MaxNumSeqs))
    );
    let (load, slo) = minute_of_decode();
    // 4 sequences at 13 ms: 0.3077 tokens/ms per engine; 1.1 tokens/ms → 3.575 / 0.95 → 4.
    let n = decode(&m, &load, &slo, four).unwrap();
    assert_eq!((n.replicas, n.binding), (4, Binding::MaxNumSeqs));
    assert!(
        n.describe("decode").contains("--max-num-seqs 4"),
        "{}",
        n.describe("decode")
    );
    // A context longer than the device's KV is refused by name.
    let long = DecodeLoad {
        context: 2_000_000.0,
        ..load
    };
    let e = decode(&m, &long, &slo, kv(1_000_000)).unwrap_err();
    assert_eq!(e.binding, Binding::KvMemory);
}

#[test]
fn coupling_pays_for_prefill_stalls_in_decode_steps() {
    let m = model();
    let demand = Interval {
        start_ms: 0.0,
        len_ms: 60_000.0,
        requests: 600,
        output_tokens: 66_000,
        decode_context: 1000.0,
        arrival_cv2: 1.0,
        ..Interval::default()
    };
    let service = vec![100.0; 600];
    let slo = Slo {
        itl_p99_ms: Some(23.0),
        ..Slo::default()
    };
    // A 1,000-token chunk stalls a step by 100 ms > 23 ms: only a fleet where
    // prefill takes ≤ 1 % of each engine's time meets the ITL objective.
    let big = coupled(&m, &demand, &service, &slo, kv(1_000_000), 1000).unwrap();
    assert!(big.replicas >= 100, "{big:?}");
    assert_eq!(big.binding, Binding::Itl);
    // Without an ITL objective decode and prefill simply share the engines.
    let loose = coupled(
        &m,
        &demand,
        &service,
        &Slo {
            ttft_p99_ms: Some(2000.0),
            ..Slo::default()
        },
        kv(1_000_000),
        1000,
    )
    .unwrap();
    assert!(loose.replicas <= 5, "{loose:?}");
}
