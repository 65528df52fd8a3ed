//! The serving configuration in force during a replay — gateway (filter plugin
//! configuration, load-balancing policy), ranks (`GET /tether/config`),
//! profile, replay settings — flattened to `key = value` pairs that
//! `tether compare` diffs, and hashed.
//!
//! Endpoint addresses are deployment, not configuration (and ephemeral in
//! tests and demos): keys and hashes carry the number of endpoints, their
//! weights and DP sizes, never their addresses.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use xxhash_rust::xxh3::xxh3_64;

/// The gateway's configuration, as read from Envoy's admin `/config_dump` or
/// from the plugin configuration file given to `tether gateway`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GatewayConfig {
    /// Where it was read (an admin URL or a file).
    pub source: String,
    /// The tether filter's plugin configuration (JSON), if the filter is in the chain.
    pub plugin_config: Option<Value>,
    /// The upstream cluster's load-balancing policy (`override_host`,
    /// `maglev`, `round_robin`, …).
    pub lb_policy: Option<String>,
    /// MAGLEV / RING_HASH `hash_balance_factor` (bounded load), if set.
    pub hash_balance_factor: Option<u64>,
    /// Upstream endpoints in the cluster.
    pub endpoints: Option<u64>,
    /// xxh3-64 of the above without addresses, 16 hex.
    pub hash: String,
}

impl GatewayConfig {
    /// Fills `hash` from the other fields.
    pub fn hashed(mut self) -> Self {
        let mut keys = BTreeMap::new();
        self.flatten_into(&mut keys);
        self.hash = hash_keys(&keys);
        self
    }

    fn flatten_into(&self, keys: &mut BTreeMap<String, String>) {
        if let Some(p) = &self.lb_policy {
            keys.insert("gateway.lb_policy".into(), p.clone());
        }
        if let Some(f) = self.hash_balance_factor {
            keys.insert("gateway.hash_balance_factor".into(), f.to_string());
        }
        if let Some(n) = self.endpoints {
            keys.insert("gateway.endpoints".into(), n.to_string());
        }
        match &self.plugin_config {
            Some(v) => flatten("gateway.plugin", v, keys),
            None => {
                keys.insert("gateway.plugin".into(), "(no tether filter)".into());
            }
        }
    }
}

/// One rank's configuration (`GET /tether/config` of `tether-rank`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    /// Its `x-tether-rank` name (or the address it was scraped at).
    pub rank: String,
    /// The document it returned.
    pub config: Value,
    /// Its `serving_hash`.
    pub serving_hash: String,
}

/// The GPU profile the ranks time themselves by.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileInfo {
    /// Profile `name`.
    pub name: String,
    /// xxh3-64 of the profile file, 16 hex.
    pub hash: String,
    /// GPU type.
    pub gpu: String,
    /// Price of one engine-hour (`gpu_hour_usd × gpus_per_engine`).
    pub engine_hour_usd: f64,
}

/// Everything in force during a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServingConfig {
    /// Gateway, when known.
    pub gateway: Option<GatewayConfig>,
    /// Ranks scraped, sorted by name.
    pub ranks: Vec<RankInfo>,
    /// The profile (the ranks' common one; the first rank's when they differ).
    pub profile: Option<ProfileInfo>,
    /// The flattened configuration: what `compare` diffs.
    pub keys: BTreeMap<String, String>,
    /// xxh3-64 of `keys`, 16 hex: equal hashes = equal configuration.
    pub hash: String,
}

impl ServingConfig {
    /// Assembles the configuration: gateway, ranks, and the replay's own
    /// settings (`replay.*` keys), then flattens and hashes it.
    pub fn new(
        gateway: Option<GatewayConfig>,
        mut ranks: Vec<RankInfo>,
        replay: BTreeMap<String, String>,
    ) -> Self {
        ranks.sort_by(|a, b| a.rank.cmp(&b.rank));
        let profile = ranks.first().and_then(|r| profile_of(&r.config));
        let mut keys = replay;
        if let Some(g) = &gateway {
            g.flatten_into(&mut keys);
        }
        if !ranks.is_empty() {
            keys.insert("ranks.count".into(), ranks.len().to_string());
            let mut per: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for r in &ranks {
                let mut k = BTreeMap::new();
                if let Some(s) = r.config.get("serving") {
                    flatten("rank", s, &mut k);
                }
                for (key, v) in k {
                    per.entry(key).or_default().push(v);
                }
            }
            for (key, mut vals) in per {
                keys.insert(key, summarize(&mut vals, ranks.len()));
            }
        }
        if let Some(p) = &profile {
            keys.insert("profile.name".into(), p.name.clone());
            keys.insert("profile.hash".into(), p.hash.clone());
            keys.insert(
                "profile.engine_hour_usd".into(),
                format!("{}", p.engine_hour_usd),
            );
        }
        let hash = hash_keys(&keys);
        Self {
            gateway,
            ranks,
            profile,
            keys,
            hash,
        }
    }
}

/// The profile part of a rank's `/tether/config`.
fn profile_of(config: &Value) -> Option<ProfileInfo> {
    let p = config.get("profile")?;
    Some(ProfileInfo {
        name: p.get("name")?.as_str()?.to_owned(),
        hash: p.get("hash")?.as_str()?.to_owned(),
        gpu: p
            .get("gpu")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        engine_hour_usd: p.get("engine_hour_usd")?.as_f64()?,
    })
}

/// One value when every rank agrees, else `value ×count` per distinct value
/// (ranks that lack the key count as `-`).
fn summarize(vals: &mut Vec<String>, ranks: usize) -> String {
    while vals.len() < ranks {
        vals.push("-".into());
    }
    vals.sort();
    let mut out: Vec<(String, usize)> = Vec::new();
    for v in vals.drain(..) {
        match out.last_mut() {
            Some((last, n)) if *last == v => *n += 1,
            _ => out.push((v, 1)),
        }
    }
    if out.len() == 1 {
        return out.remove(0).0;
    }
    out.iter()
        .map(|(v, n)| format!("{v} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Flattens JSON into dotted keys; scalars as JSON text (strings unquoted).
/// A list of endpoint objects becomes their count, weights and DP sizes.
pub fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) => {
            if m.is_empty() {
                out.insert(prefix.to_owned(), "{}".into());
            }
            for (k, x) in m {
                flatten(&format!("{prefix}.{k}"), x, out);
            }
        }
        Value::Array(items) if items.iter().any(|i| i.get("address").is_some()) => {
            let field = |name: &str, default: &str| {
                items
                    .iter()
                    .map(|i| i.get(name).map_or(default.to_owned(), scalar))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            out.insert(format!("{prefix}.count"), items.len().to_string());
            out.insert(format!("{prefix}.weights"), field("weight", "1"));
            out.insert(format!("{prefix}.dp_sizes"), field("dp_size", "1"));
        }
        other => {
            out.insert(prefix.to_owned(), scalar(other));
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// xxh3-64 of `key=value` lines, 16 hex.
pub fn hash_keys(keys: &BTreeMap<String, String>) -> String {
    let mut buf = String::new();
    for (k, v) in keys {
        buf.push_str(k);
        buf.push('=');
        buf.push_str(v);
        buf.push('\n');
    }
    format!("{:016x}", xxh3_64(buf.as_bytes()))
}

/// Keys whose values differ between configurations (absent counts as a
/// value), in key order, with each configuration's value (`None` = absent).
pub fn changed_keys(configs: &[&ServingConfig]) -> Vec<(String, Vec<Option<String>>)> {
    let mut all: Vec<&String> = configs.iter().flat_map(|c| c.keys.keys()).collect();
    all.sort();
    all.dedup();
    all.into_iter()
        .filter_map(|k| {
            let vals: Vec<Option<String>> =
                configs.iter().map(|c| c.keys.get(k).cloned()).collect();
            let differ = vals.windows(2).any(|w| w[0] != w[1]);
            differ.then(|| (k.clone(), vals))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rank(name: &str, cache: &str) -> RankInfo {
        RankInfo {
            rank: name.into(),
            config: json!({
                "serving": {"cache": cache, "device_blocks": 100, "speedup": 50.0},
                "serving_hash": "00",
                "profile": {"name": "p", "hash": "abc", "gpu": "H200", "engine_hour_usd": 3.5},
            }),
            serving_hash: "00".into(),
        }
    }

    fn gateway(mode: &str, port: u16) -> GatewayConfig {
        GatewayConfig {
            source: "test".into(),
            plugin_config: Some(json!({
                "mode": mode,
                "endpoints": [{"address": format!("127.0.0.1:{port}")}, {"address": "127.0.0.1:2", "weight": 2}],
                "retention_ms": {"tool": 1000},
            })),
            lb_policy: Some("override_host".into()),
            hash_balance_factor: None,
            endpoints: Some(2),
            hash: String::new(),
        }
        .hashed()
    }

    #[test]
    fn addresses_are_not_configuration() {
        assert_eq!(gateway("pick", 1).hash, gateway("pick", 9).hash);
        assert_ne!(gateway("pick", 1).hash, gateway("hash", 1).hash);
        let c = ServingConfig::new(Some(gateway("pick", 1)), vec![], BTreeMap::new());
        assert_eq!(c.keys["gateway.plugin.endpoints.count"], "2");
        assert_eq!(c.keys["gateway.plugin.endpoints.weights"], "1,2");
        assert_eq!(c.keys["gateway.plugin.retention_ms.tool"], "1000");
        assert_eq!(c.keys["gateway.plugin.mode"], "pick");
    }

    #[test]
    fn ranks_that_agree_give_one_key_and_disagreement_is_spelled_out() {
        let same = ServingConfig::new(
            None,
            vec![rank("b", "lru"), rank("a", "lru")],
            BTreeMap::new(),
        );
        assert_eq!(same.keys["rank.cache"], "lru");
        assert_eq!(same.keys["ranks.count"], "2");
        assert_eq!(same.ranks[0].rank, "a");
        assert_eq!(same.profile.as_ref().unwrap().engine_hour_usd, 3.5);
        let mixed = ServingConfig::new(
            None,
            vec![rank("a", "lru"), rank("b", "retention")],
            BTreeMap::new(),
        );
        assert_eq!(mixed.keys["rank.cache"], "lru ×1, retention ×1");
        assert_ne!(same.hash, mixed.hash);
        let changed = changed_keys(&[&same, &mixed]);
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].0, "rank.cache");
    }

    #[test]
    fn absent_keys_count_as_changes() {
        let a = ServingConfig::new(Some(gateway("pick", 1)), vec![], BTreeMap::new());
        let b = ServingConfig::new(None, vec![], BTreeMap::new());
        let changed = changed_keys(&[&a, &b]);
        assert!(
            changed
                .iter()
                .any(|(k, v)| k == "gateway.plugin.mode" && v[1].is_none())
        );
    }
}
