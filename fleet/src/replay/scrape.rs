//! What the replay reads from the serving side besides answers: each rank's
//! configuration (`GET /tether/config`) and busy time (`GET /metrics`,
//! `tether_rank_busy_seconds_total`), and the gateway's configuration from
//! Envoy's admin `/config_dump` (the tether filter's plugin configuration and
//! the upstream cluster's load-balancing policy).

use super::client::{Client, FetchError};
use crate::report::config::{GatewayConfig, RankInfo};
use serde_json::Value;
use std::collections::BTreeMap;

/// A rank's configuration; `origin` is `http://ip:port`.
pub async fn rank_config(client: &Client, origin: &str) -> Result<RankInfo, FetchError> {
    let text = client.get_text(&format!("{origin}/tether/config")).await?;
    let config: Value = serde_json::from_str(&text).map_err(|e| FetchError {
        url: format!("{origin}/tether/config"),
        why: e.to_string(),
    })?;
    let rank = config
        .get("rank_id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| origin.trim_start_matches("http://").to_owned());
    let serving_hash = config
        .get("serving_hash")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Ok(RankInfo {
        rank,
        config,
        serving_hash,
    })
}

/// Busy seconds per engine (`<rank>#<engine label>`) from a Prometheus text exposition.
pub fn busy_seconds(rank: &str, metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("tether_rank_busy_seconds_total") else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            Some((l, v)) => (l, v),
            None => ("", rest),
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let engine = labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| k.trim() == "engine")
            .map_or("0".to_owned(), |(_, v)| {
                v.trim().trim_matches('"').to_owned()
            });
        *out.entry(format!("{rank}#{engine}")).or_insert(0.0) += v;
    }
    out
}

/// A rank's busy seconds per engine now.
pub async fn rank_busy(
    client: &Client,
    origin: &str,
    rank: &str,
) -> Result<BTreeMap<String, f64>, FetchError> {
    let text = client.get_text(&format!("{origin}/metrics")).await?;
    Ok(busy_seconds(rank, &text))
}

fn find_all<'a>(v: &'a Value, pred: &dyn Fn(&Value) -> bool, out: &mut Vec<&'a Value>) {
    if pred(v) {
        out.push(v);
    }
    match v {
        Value::Object(m) => m.values().for_each(|x| find_all(x, pred, out)),
        Value::Array(a) => a.iter().for_each(|x| find_all(x, pred, out)),
        _ => {}
    }
}

/// The gateway configuration in an Envoy `/config_dump` document.
pub fn gateway_from_config_dump(source: &str, dump: &Value) -> GatewayConfig {
    let mut filters = Vec::new();
    find_all(
        dump,
        &|v| {
            v.get("name").and_then(Value::as_str) == Some("tether")
                && v.get("typed_config").is_some()
        },
        &mut filters,
    );
    let plugin_config = filters.first().map(|f| {
        let raw = f
            .pointer("/typed_config/config/configuration/value")
            .and_then(Value::as_str)
            .unwrap_or("");
        if raw.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(raw).unwrap_or(Value::String(raw.to_owned()))
        }
    });
    let mut clusters = Vec::new();
    find_all(
        dump,
        &|v| v.get("load_assignment").is_some() && v.get("name").is_some(),
        &mut clusters,
    );
    let cluster = clusters.first();
    let lb_policy = cluster.and_then(|c| {
        c.pointer("/load_balancing_policy/policies/0/typed_extension_config/name")
            .and_then(Value::as_str)
            .map(|n| n.rsplit('.').next().unwrap_or(n).to_owned())
            .or_else(|| {
                c.get("lb_policy")
                    .and_then(Value::as_str)
                    .map(|s| s.to_ascii_lowercase())
            })
            .or_else(|| Some("round_robin".to_owned()))
    });
    let hash_balance_factor = cluster.and_then(|c| {
        let mut f = Vec::new();
        find_all(c, &|v| v.get("hash_balance_factor").is_some(), &mut f);
        f.first()
            .and_then(|v| v.get("hash_balance_factor"))
            .and_then(|x| {
                x.as_u64()
                    .or_else(|| x.get("value").and_then(Value::as_u64))
            })
    });
    let endpoints = cluster.map(|c| {
        let mut eps = Vec::new();
        find_all(c, &|v| v.get("endpoint").is_some(), &mut eps);
        eps.len() as u64
    });
    GatewayConfig {
        source: source.to_owned(),
        plugin_config,
        lb_policy,
        hash_balance_factor,
        endpoints,
        hash: String::new(),
    }
    .hashed()
}

/// The `ip:port` of every endpoint of the clusters in an Envoy `/config_dump`
/// (static `socket_address`es), sorted: where the ranks behind the gateway can
/// be asked for their configuration, whatever their `--rank-id`.
pub fn endpoint_addresses(dump: &Value) -> Vec<String> {
    let mut eps = Vec::new();
    find_all(dump, &|v| v.get("load_assignment").is_some(), &mut eps);
    let mut sockets = Vec::new();
    for c in eps {
        find_all(c, &|v| v.get("socket_address").is_some(), &mut sockets);
    }
    let mut out: Vec<String> = sockets
        .iter()
        .filter_map(|v| {
            let s = v.get("socket_address")?;
            let ip = s.get("address")?.as_str()?;
            let port = s.get("port_value")?.as_u64()?;
            Some(if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The gateway configuration from an Envoy admin interface (`http://ip:port`),
/// and the addresses of its upstream endpoints ([`endpoint_addresses`]).
pub async fn gateway_config(
    client: &Client,
    admin: &str,
) -> Result<(GatewayConfig, Vec<String>), FetchError> {
    let url = format!("{}/config_dump", admin.trim_end_matches('/'));
    let text = client.get_text(&url).await?;
    let dump: Value = serde_json::from_str(&text).map_err(|e| FetchError {
        url: url.clone(),
        why: e.to_string(),
    })?;
    Ok((
        gateway_from_config_dump(&url, &dump),
        endpoint_addresses(&dump),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn busy_seconds_are_read_per_engine() {
        let m = "# HELP x\ntether_rank_busy_seconds_total{model_name=\"m\",engine=\"0\"} 1.5\n\
                 tether_rank_busy_seconds_total{model_name=\"m\",engine=\"1\"} 2\n\
                 tether_rank_steps_total{engine=\"0\"} 9\n";
        let b = busy_seconds("r1", m);
        assert_eq!(b.len(), 2);
        assert_eq!(b["r1#0"], 1.5);
        assert_eq!(b["r1#1"], 2.0);
    }

    #[test]
    fn the_gateway_is_read_from_a_config_dump() {
        let dump = json!({"configs": [
            {"static_listeners": [{"listener": {"filter_chains": [{"filters": [{"typed_config": {"http_filters": [
                {"name": "tether", "typed_config": {"config": {"configuration": {"value": "{\"mode\":\"hash\"}"}}}},
                {"name": "envoy.filters.http.router", "typed_config": {}}
            ]}}]}]}}]},
            {"static_clusters": [{"cluster": {"name": "ranks", "load_assignment": {"endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8002}}}},
                {"endpoint": {"address": {"socket_address": {"address": "::1", "port_value": 8001}}}}
            ]}]},
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.maglev",
                "typed_config": {"consistent_hashing_lb_config": {"hash_balance_factor": 150}}}}]}}}]}
        ]});
        let g = gateway_from_config_dump("x", &dump);
        assert_eq!(g.plugin_config, Some(json!({"mode": "hash"})));
        assert_eq!(g.lb_policy.as_deref(), Some("maglev"));
        assert_eq!(g.hash_balance_factor, Some(150));
        assert_eq!(g.endpoints, Some(2));
        assert_eq!(g.hash.len(), 16);
        assert_eq!(endpoint_addresses(&dump), ["127.0.0.1:8002", "[::1]:8001"]);
        let no_ports = json!({"cluster": {"load_assignment": {"endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "10.0.0.1"}}}}]}]}}});
        assert!(endpoint_addresses(&no_ports).is_empty());
    }
}
