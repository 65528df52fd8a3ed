//! The policy benchmark's pipeline on a fixed slice of the Mooncake trace (the first 400
//! requests, `tests/data/mooncake_head400.jsonl`): sessions derived, served by two
//! simulated ranks (`tether_fleet::sim`) in the three cache configurations the benchmark
//! compares.

use anyhow::Result;
use std::path::Path;
use tether_fleet::import::{Format, ImportOptions, import};
use tether_fleet::sim::{
    CacheMode, FleetShape, Policy, RunReport, SimConfig, oracle_hits, simulate,
};
use tether_rank_engine::engine::EngineSettings;
use tether_rank_engine::profile::Profile;

const DEVICE_TOKENS: u64 = 160_000;

fn run(cache: CacheMode) -> Result<RunReport> {
    run_with("llama-3.1-8b-fp8-h200-tp1.json", cache)
}

fn run_with(profile: &str, cache: CacheMode) -> Result<RunReport> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let trace = import(
        Format::Mooncake,
        &dir.join("tests/data/mooncake_head400.jsonl"),
        &ImportOptions::default(),
    )?;
    let profile = Profile::from_file(&dir.join("../examples/profiles").join(profile))?;
    let cfg = SimConfig {
        policy: Policy::Tether,
        cache,
        fleet: FleetShape::aggregated(2),
        engine: EngineSettings {
            block_size: 16,
            device_kv_tokens: Some(DEVICE_TOKENS),
            ..EngineSettings::default()
        },
        host_bytes: 4 * DEVICE_TOKENS * profile.kv_bytes_per_token,
        track_reusable: true,
        ..SimConfig::default()
    };
    Ok(simulate(
        &trace,
        &profile,
        &cfg,
        &oracle_hits(&trace, 16),
        false,
        None,
    )?
    .report)
}

/// Never more reuse than an unlimited cache (reused + avoidable adds up
/// exactly), and nothing refused but what a rank with the profile's context
/// window refuses too.
fn adds_up(r: &RunReport) {
    assert_eq!(
        r.hit_tokens + r.sim.avoidable_tokens.unwrap(),
        r.sim.reusable_tokens.unwrap(),
        "{r:?}"
    );
    assert_eq!(r.sim.failed, 0);
    assert_eq!(r.sim.refused, r.sim.too_long);
}

#[test]
fn retention_with_host_tier_saves_re_prefill_that_lru_loses() -> Result<()> {
    let lru = run(CacheMode::Lru)?;
    let dev = run(CacheMode::Retention)?;
    let host = run(CacheMode::RetentionHost)?;
    for r in [&lru, &dev, &host] {
        adds_up(r);
        assert_eq!(r.finished + r.sim.refused, 400);
        assert_eq!(r.prompt_tokens, lru.prompt_tokens);
    }
    assert!(lru.sim.reusable_tokens.unwrap() > 0);
    assert_eq!(lru.sim.retention.retained, 0);
    assert!(dev.sim.retention.retained > 0 && dev.sim.retention.host_peak_bytes == 0);
    assert!(host.sim.retention.offloaded > 0 && host.sim.retention.restored_tokens > 0);
    assert!(host.sim.retention.host_peak_bytes <= 4 * DEVICE_TOKENS * 131_072);
    let (h, l) = (
        host.sim.avoidable_tokens.unwrap(),
        lru.sim.avoidable_tokens.unwrap(),
    );
    assert!(h * 2 < l, "retention + host {h} vs LRU {l}");
    // Restores take link time, recomputing takes prefill time: the host tier is faster.
    assert!(host.ttft_ms.mean < lru.ttft_ms.mean);
    Ok(())
}

/// The same pipeline with a hybrid model's profile (Qwen3-Coder-Next: a 37.7 MiB state
/// snapshot every 544 tokens, paid from the KV budget): prefixes are reused only at
/// snapshot boundaries, on every configuration, and the host tier still wins.
#[test]
fn a_hybrid_profile_reuses_only_at_snapshot_boundaries_and_the_host_tier_still_wins() -> Result<()>
{
    let profile = "qwen3-coder-next-fp8-h200-tp1.json";
    let lru = run_with(profile, CacheMode::Lru)?;
    let host = run_with(profile, CacheMode::RetentionHost)?;
    let attention = run(CacheMode::Lru)?;
    for r in [&lru, &host] {
        adds_up(r);
    }
    // Resuming only at 544-token boundaries leaves less reusable than every 16 tokens.
    assert!(lru.sim.reusable_tokens.unwrap() < attention.sim.reusable_tokens.unwrap());
    assert!(lru.sim.reusable_tokens.unwrap() > 0);
    assert!(host.sim.retention.restored_tokens > 0);
    let (h, l) = (
        host.sim.avoidable_tokens.unwrap(),
        lru.sim.avoidable_tokens.unwrap(),
    );
    assert!(h * 2 < l, "retention + host {h} vs LRU {l}");
    Ok(())
}
