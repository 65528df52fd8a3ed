//! The policy benchmark's pipeline on a fixed slice of the Mooncake trace (the first 400
//! requests, `tests/data/mooncake_head400.jsonl`): sessions derived, replayed on two ranks
//! through the engine's policy code in the three configurations the benchmark compares.

use anyhow::Result;
use tether_engine::PolicyConfig;
use tether_fleet::import::{Format, ImportOptions, import};
use tether_fleet::sim::{SimReport, replay};

fn run(cfg: &PolicyConfig) -> Result<SimReport> {
    let path = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/mooncake_head400.jsonl"
    ));
    let trace = import(Format::Mooncake, path, &ImportOptions::default())?;
    Ok(replay(&trace, 2, cfg)?)
}

#[test]
fn retention_with_host_tier_saves_re_prefill_that_lru_loses() -> Result<()> {
    let base = PolicyConfig {
        device_blocks: 160_000 / 16,
        block_bytes: 1 << 20,
        ..PolicyConfig::default()
    };
    let lru = run(&PolicyConfig {
        retention: false,
        ..base.clone()
    })?;
    let dev = run(&PolicyConfig {
        retention: true,
        ..base.clone()
    })?;
    let host = run(&PolicyConfig {
        retention: true,
        host_bytes: 4 * 10_000 * (1 << 20),
        ..base
    })?;
    for r in [&lru, &dev, &host] {
        // Never more reuse than an unlimited cache: reused + avoidable adds up exactly.
        assert_eq!(
            r.reused_tokens + r.avoidable_tokens,
            r.reusable_tokens,
            "{r:?}"
        );
        assert_eq!(r.rejected, 0);
        assert_eq!(r.prompt_tokens, lru.prompt_tokens);
    }
    assert!(lru.reusable_tokens > 0);
    assert_eq!(lru.stats.retained, 0);
    assert!(dev.stats.retained > 0 && dev.host_peak_bytes == 0);
    assert!(host.stats.offloaded > 0 && host.restored_tokens > 0);
    assert!(host.host_peak_bytes <= 4 * 10_000 * (1 << 20));
    assert!(
        host.avoidable_tokens * 2 < lru.avoidable_tokens,
        "retention + host {} vs LRU {}",
        host.avoidable_tokens,
        lru.avoidable_tokens
    );
    Ok(())
}
