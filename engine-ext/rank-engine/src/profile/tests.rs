use super::*;

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/profiles")
}

#[test]
fn shipped_profiles_parse_and_hit_their_published_points() {
    let llama = Profile::from_file(&examples().join("llama-3.1-8b-fp8-h200-tp1.json")).unwrap();
    assert_eq!(llama.prefill_ttft_ms.at(3000.0), 27.0);
    assert!((llama.decode_itl_ms.itl_ms(100.0, 3075.0) - 9.8).abs() < 1e-9);
    assert!(!llama.sources.is_empty());
    let qwen = Profile::from_file(&examples().join("qwen3-32b-fp8-h200-tp4.json")).unwrap();
    assert_eq!(qwen.gpus_per_engine, 4);
    for (b, itl) in [(44.0, 7.786), (52.0, 7.983), (60.0, 8.317)] {
        assert!((qwen.decode_itl_ms.itl_ms(b, 4250.0) - itl).abs() < 1e-9);
    }
    assert_eq!(qwen.engine_hour_usd(), 14.0);
    let next = Profile::from_file(&examples().join("qwen3-coder-next-fp8-h200-tp1.json")).unwrap();
    assert_eq!(next.prefill_ttft_ms.at(1024.0), 379.0);
    assert!((next.decode_itl_ms.itl_ms(1.0, 262_144.0) - 6.545).abs() < 1e-9);
    // 36 Gated DeltaNet layers x (3 x 8,192 conv + 32 x 128 x 128 recurrent) x 2 bytes.
    let h = next.hybrid.expect("a hybrid profile");
    assert_eq!(h.state_bytes, 36 * (3 * 8192 + 32 * 128 * 128) * 2);
    assert_eq!(h.align_tokens, 544);
    assert_eq!(next.kv_bytes_per_token, 12 * 2 * 2 * 256 * 2);
    assert!(llama.hybrid.is_none());
    // DeepSeek-R1 on 8x H200: the published decode points (users -> tokens/s per user).
    let r1 = Profile::from_file(&examples().join("deepseek-r1-fp8-h200-tp8.json")).unwrap();
    assert_eq!((r1.gpus_per_engine, r1.max_model_len), (8, Some(163_840)));
    for (b, itl) in [(1.0, 1000.0 / 33.0), (16.0, 50.0), (64.0, 1000.0 / 10.4)] {
        assert!(
            (r1.decode_itl_ms.itl_ms(b, 1500.0) - itl).abs() < 1e-3,
            "batch {b}"
        );
    }
    // 52.3 k prefill tokens/s per engine at ISL 2,000, plus its 20 ms fixed cost.
    assert!((r1.prefill_ttft_ms.at(2000.0) - (20.0 + 2000.0 / 52.3)).abs() < 1e-2);
}

fn base() -> serde_json::Value {
    serde_json::json!({
        "name": "x", "model": "m", "gpu": "g", "gpus_per_engine": 1, "gpu_hour_usd": 2.0,
        "max_kv_tokens": 1000, "kv_bytes_per_token": 1024, "host_restore_gbps": 10.0,
        "prefill": {"points": [{"isl": 100, "ttft_ms": 5.0}, {"isl": 1000, "ttft_ms": 40.0}]},
        "decode": {"points": [{"context": 100, "batch": 1, "itl_ms": 3.0},
                              {"context": 100, "batch": 8, "itl_ms": 4.0}]}
    })
}

fn err(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v = base();
    edit(&mut v);
    Profile::from_json(&v.to_string()).unwrap_err().to_string()
}

#[test]
fn a_bad_profile_is_refused_naming_the_field() {
    assert!(Profile::from_json(&base().to_string()).is_ok());
    assert!(
        err(|v| {
            v.as_object_mut().unwrap().remove("max_kv_tokens");
        })
        .contains("max_kv_tokens")
    );
    assert!(err(|v| v["prefil"] = serde_json::json!(1)).contains("prefil"));
    assert!(err(|v| v["gpus_per_engine"] = serde_json::json!(0)).contains("gpus_per_engine"));
    assert!(err(|v| v["host_restore_gbps"] = serde_json::json!(0.0)).contains("host_restore_gbps"));
    let e = err(|v| v["gpu_hour_usd"] = serde_json::json!("cheap"));
    assert!(e.contains("`gpu_hour_usd`"), "{e}");
    let e = err(|v| v["decode"]["points"][0]["context"] = serde_json::json!(null));
    assert!(e.contains("decode.points[0].context"), "{e}");
    let e = err(|v| v["prefill"]["points"][1]["isl"] = serde_json::json!(50));
    assert!(e.contains("prefill.points[1]"), "{e}");
    let e = err(|v| v["prefill"]["points"] = serde_json::json!([]));
    assert!(e.contains("prefill.points"), "{e}");
    let e = err(|v| v["decode"]["points"][1]["itl_ms"] = serde_json::json!(-1.0));
    assert!(e.contains("decode.points[1].itl_ms"), "{e}");
    let e = err(|v| v["decode"]["points"][1]["batch"] = serde_json::json!(1));
    assert!(e.contains("decode.points"), "{e}");
    assert!(Profile::from_json("not json").is_err());
    let hybrid = |h: serde_json::Value| err(move |v| v["hybrid"] = h);
    let e = hybrid(serde_json::json!({"state_bytes": 0, "align_tokens": 16}));
    assert!(e.contains("hybrid.state_bytes"), "{e}");
    let e = hybrid(serde_json::json!({"state_bytes": 8, "align_tokens": 0}));
    assert!(e.contains("hybrid.align_tokens"), "{e}");
    let e = hybrid(serde_json::json!({"state_bytes": 8, "align_tokens": 16, "dtype": "bf16"}));
    assert!(e.contains("dtype"), "{e}");
    let e = hybrid(serde_json::json!({"align_tokens": 16}));
    assert!(e.contains("state_bytes"), "{e}");
}

#[test]
fn curves_interpolate_and_extend() {
    let c = Curve::try_new("c", vec![(1.0, 2.0), (3.0, 6.0)]).unwrap();
    assert_eq!(c.at(2.0), 4.0);
    assert_eq!(c.at(5.0), 10.0);
    assert_eq!(c.at(0.0), 0.0);
    assert_eq!(c.at(-10.0), 0.0);
    let one = Curve::try_new("c", vec![(1.0, 2.0)]).unwrap();
    assert_eq!(one.at(100.0), 2.0);
    assert!(Curve::try_new("c", vec![(1.0, f64::NAN)]).is_err());
}
