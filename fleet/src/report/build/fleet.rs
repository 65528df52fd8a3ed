//! Work per engine — every configured engine, idle ones too — and what the
//! run cost on the profile's price.

use super::super::config::ServingConfig;
use super::super::model::{Cost, EngineLoad, Load};
use std::collections::BTreeMap;

fn max_over_mean(vals: &[u64], n: usize) -> Option<f64> {
    let n = n.max(vals.len());
    let total: u64 = vals.iter().sum();
    if n == 0 || total == 0 {
        return None;
    }
    let mean = total as f64 / n as f64;
    Some(*vals.iter().max()? as f64 / mean)
}

/// Engines the configuration has: `rank#i` for each scraped rank's DP ranks.
fn configured_engines(config: &ServingConfig) -> Vec<String> {
    let mut out = Vec::new();
    for r in &config.ranks {
        let dp = r
            .config
            .get("serving")
            .and_then(|s| s.get("dp_size"))
            .and_then(|d| d.as_u64())
            .unwrap_or(1);
        for i in 0..dp {
            out.push(format!("{}#{i}", r.rank));
        }
    }
    out
}

/// The load over `per_engine` (the engines that served) and the configured
/// ones, with their busy seconds; also the number of engines the means are over.
pub(super) fn load(
    mut per_engine: BTreeMap<String, EngineLoad>,
    unattributed: u64,
    config: &ServingConfig,
    busy_s: &BTreeMap<String, f64>,
) -> (Load, usize) {
    let configured = configured_engines(config);
    for e in &configured {
        per_engine.entry(e.clone()).or_insert_with(|| EngineLoad {
            engine: e.clone(),
            ..Default::default()
        });
    }
    for (e, b) in busy_s {
        if let Some(l) = per_engine.get_mut(e) {
            l.busy_s = Some(*b);
        }
    }
    let engines: Vec<EngineLoad> = per_engine.into_values().collect();
    let n = if configured.is_empty() {
        engines.len()
    } else {
        configured.len()
    };
    let col = |f: fn(&EngineLoad) -> u64| engines.iter().map(f).collect::<Vec<u64>>();
    let load = Load {
        max_over_mean_requests: max_over_mean(&col(|l| l.requests), n),
        max_over_mean_prompt_tokens: max_over_mean(&col(|l| l.prompt_tokens), n),
        max_over_mean_computed_tokens: max_over_mean(&col(|l| l.computed_tokens), n),
        engines_configured: (!configured.is_empty()).then_some(configured.len() as u64),
        engines,
        unattributed,
    };
    (load, n)
}

/// The cost of `billed_tokens` on the profile's price: busy seconds when
/// scraped, else `n_engines` for the run's `trace_s`; nothing without a price.
pub(super) fn cost(
    config: &ServingConfig,
    busy_s: &BTreeMap<String, f64>,
    n_engines: usize,
    trace_s: f64,
    billed_tokens: u64,
) -> Cost {
    let Some(price) = config.profile.as_ref().map(|p| p.engine_hour_usd) else {
        return Cost::default();
    };
    let (basis, hours) = if busy_s.is_empty() {
        ("fleet_time", n_engines as f64 * trace_s / 3600.0)
    } else {
        ("busy", busy_s.values().sum::<f64>() / 3600.0)
    };
    let usd = hours * price;
    Cost {
        basis: Some(basis.to_owned()),
        engine_hours: hours,
        usd,
        usd_per_mtok: (billed_tokens > 0).then(|| usd / (billed_tokens as f64 / 1e6)),
    }
}
