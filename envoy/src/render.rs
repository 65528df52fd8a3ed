//! A ready Envoy bootstrap for a list of ranks: the shipped template of the
//! chosen mode (`demo.yaml` for pick, `hash.yaml` for hash and round robin)
//! with its placeholders filled, then edited as YAML — the upstream cluster
//! holds exactly the given ranks, round robin replaces MAGLEV, and every
//! route retries a failed connection (on the next fallback endpoint in pick
//! mode, on another host otherwise) and reports its attempts in
//! `x-envoy-attempt-count`.

use crate::bootstraps;
use crate::template::{self, Unresolved};
use serde_json::{Map, Value as Json};
use serde_yaml_ng::{Mapping, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// How the gateway places requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The filter picks endpoint and DP rank; Envoy's `override_host` follows it.
    Pick,
    /// The filter emits `x-tether-key`; Envoy's MAGLEV with bounded load places it.
    Hash,
    /// The filter still marks turns, but Envoy spreads requests round robin
    /// (the baseline tether routing is compared against).
    RoundRobin,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 3] = [Mode::Pick, Mode::Hash, Mode::RoundRobin];

    /// Its `--mode` name.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Pick => "pick",
            Mode::Hash => "hash",
            Mode::RoundRobin => "round-robin",
        }
    }

    /// Parses a `--mode` name.
    pub fn parse(s: &str) -> Result<Mode, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown mode `{s}` (known: {})",
                    Self::ALL.map(Mode::name).join(", ")
                )
            })
    }

    /// The filter's own `mode` for this gateway mode.
    fn filter_mode(self) -> &'static str {
        match self {
            Mode::Pick => "pick",
            Mode::Hash | Mode::RoundRobin => "hash",
        }
    }
}

/// What to render.
#[derive(Clone, Debug)]
pub struct GatewaySpec {
    /// Placement.
    pub mode: Mode,
    /// The ranks (`ip:port`), at least one.
    pub ranks: Vec<SocketAddr>,
    /// Data-parallel ranks behind each address (pick mode: the filter picks one).
    pub dp_size: u32,
    /// The filter's plugin configuration without `mode` and `endpoints`
    /// (those come from `mode` and `ranks`).
    pub plugin_config: Map<String, Json>,
    /// The filter module.
    pub filter_wasm: String,
    /// Where Envoy listens.
    pub listen: SocketAddr,
    /// Envoy's admin address (port 0: ephemeral).
    pub admin: SocketAddr,
    /// Upstream attempts after a failed connection.
    pub retries: u32,
    /// MAGLEV `hash_balance_factor` (hash mode), default the template's 150.
    pub hash_balance_factor: Option<u32>,
}

/// A bootstrap that cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// No ranks.
    #[error("--ranks: at least one rank is needed")]
    NoRanks,
    /// The plugin configuration sets what the flags set.
    #[error(
        "plugin configuration field `{0}` is set by tether gateway (--mode / --ranks); remove it from the file"
    )]
    Reserved(&'static str),
    /// A placeholder left unfilled (a template bug).
    #[error(transparent)]
    Unresolved(#[from] Unresolved),
    /// The template is not the YAML this code edits (a template changed shape).
    #[error("template {template}: {why}")]
    Shape {
        /// Which template.
        template: &'static str,
        /// What was not found.
        why: String,
    },
    /// YAML (de)serialization.
    #[error("template {template}: {why}")]
    Yaml {
        /// Which template.
        template: &'static str,
        /// The parser's message.
        why: String,
    },
}

impl GatewaySpec {
    /// The plugin configuration the filter gets: the given fields plus `mode`
    /// and, in pick mode, one endpoint per rank.
    pub fn filter_config(&self) -> Result<Json, RenderError> {
        for reserved in ["mode", "endpoints"] {
            if self.plugin_config.contains_key(reserved) {
                return Err(RenderError::Reserved(reserved));
            }
        }
        let mut c = Map::new();
        c.insert("mode".into(), Json::from(self.mode.filter_mode()));
        if self.mode == Mode::Pick {
            let eps: Vec<Json> = self
                .ranks
                .iter()
                .map(|r| serde_json::json!({"address": r.to_string(), "dp_size": self.dp_size}))
                .collect();
            c.insert("endpoints".into(), Json::Array(eps));
        }
        // The ranks behind `tether gateway` retain turns: unless told
        // otherwise, the filter sends the markers (`retain`) with what the mode
        // needs to place requests.
        let preset = match self.mode {
            Mode::Pick => "pick",
            Mode::Hash | Mode::RoundRobin => "hash",
        };
        c.insert("outputs".into(), serde_json::json!([preset, "retain"]));
        c.extend(self.plugin_config.clone());
        Ok(Json::Object(c))
    }
}

fn key(k: &str) -> Value {
    Value::String(k.to_owned())
}

fn get_mut<'a>(
    v: &'a mut Value,
    path: &[&str],
    template: &'static str,
) -> Result<&'a mut Value, RenderError> {
    let mut cur = v;
    for p in path {
        cur = cur.get_mut(*p).ok_or_else(|| RenderError::Shape {
            template,
            why: format!("no `{}`", path.join(".")),
        })?;
    }
    Ok(cur)
}

fn yaml(text: &str) -> Value {
    // Literals below are valid YAML; a failure would be a bug caught by the tests.
    serde_yaml_ng::from_str(text).unwrap_or(Value::Null)
}

/// Renders the bootstrap.
pub fn render(spec: &GatewaySpec) -> Result<String, RenderError> {
    if spec.ranks.is_empty() {
        return Err(RenderError::NoRanks);
    }
    let (name, text) = match spec.mode {
        Mode::Pick => ("demo.yaml", bootstraps::DEMO),
        Mode::Hash | Mode::RoundRobin => ("hash.yaml", bootstraps::HASH),
    };
    let config = spec.filter_config()?;
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    vars.insert("ADMIN_PORT".into(), spec.admin.port().to_string());
    vars.insert("LISTEN_PORT".into(), spec.listen.port().to_string());
    vars.insert("LISTEN_ADDRESS".into(), spec.listen.ip().to_string());
    vars.insert("FILTER_WASM".into(), spec.filter_wasm.clone());
    vars.insert(
        "PLUGIN_CONFIG".into(),
        template::yaml_string(&config.to_string()),
    );
    if let Some(f) = spec.hash_balance_factor {
        vars.insert("HASH_BALANCE_FACTOR".into(), f.to_string());
    }
    // The template's own rank slots are replaced below; fill them with the first rank.
    let first = spec.ranks[0];
    for i in 0..64 {
        vars.insert(format!("RANK_{i}_IP"), first.ip().to_string());
        vars.insert(format!("RANK_{i}_PORT"), first.port().to_string());
    }
    let filled = template::render(text, &vars)?;
    let mut doc: Value = serde_yaml_ng::from_str(&filled).map_err(|e| RenderError::Yaml {
        template: name,
        why: e.to_string(),
    })?;
    // The header_mutation entries and the header-path route for these outputs.
    crate::outputs::align(&mut doc);
    if spec.admin.ip().to_string() != "127.0.0.1" {
        *get_mut(
            &mut doc,
            &["admin", "address", "socket_address", "address"],
            name,
        )? = Value::String(spec.admin.ip().to_string());
    }

    // The cluster: exactly the ranks.
    let clusters = get_mut(&mut doc, &["static_resources", "clusters"], name)?;
    let cluster = clusters
        .as_sequence_mut()
        .and_then(|s| {
            s.iter_mut()
                .find(|c| c.get("name").and_then(Value::as_str) == Some("ranks"))
        })
        .ok_or_else(|| RenderError::Shape {
            template: name,
            why: "no cluster named `ranks`".into(),
        })?;
    let endpoints: Vec<Value> = spec
        .ranks
        .iter()
        .map(|r| {
            yaml(&format!(
                "endpoint: {{address: {{socket_address: {{address: \"{}\", port_value: {}}}}}}}",
                r.ip(),
                r.port()
            ))
        })
        .collect();
    let lb = get_mut(cluster, &["load_assignment", "endpoints"], name)?;
    *lb = Value::Sequence(vec![{
        let mut m = Mapping::new();
        m.insert(key("lb_endpoints"), Value::Sequence(endpoints));
        Value::Mapping(m)
    }]);
    if spec.mode == Mode::RoundRobin {
        let policy = get_mut(cluster, &["load_balancing_policy"], name)?;
        *policy = yaml(
            "policies:\n- typed_extension_config:\n    name: envoy.load_balancing_policies.round_robin\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin\n",
        );
    }

    // Routes: retry failed connections; report attempts.
    let vhosts = get_mut(&mut doc, &["static_resources", "listeners"], name)?;
    let mut routes_seen = 0;
    for l in vhosts.as_sequence_mut().into_iter().flatten() {
        for chain in l
            .get_mut("filter_chains")
            .and_then(Value::as_sequence_mut)
            .into_iter()
            .flatten()
        {
            for f in chain
                .get_mut("filters")
                .and_then(Value::as_sequence_mut)
                .into_iter()
                .flatten()
            {
                let Some(vh) = f
                    .get_mut("typed_config")
                    .and_then(|t| t.get_mut("route_config"))
                    .and_then(|r| r.get_mut("virtual_hosts"))
                    .and_then(Value::as_sequence_mut)
                else {
                    continue;
                };
                for v in vh {
                    if let Some(m) = v.as_mapping_mut() {
                        m.insert(key("include_attempt_count_in_response"), Value::Bool(true));
                    }
                    for r in v
                        .get_mut("routes")
                        .and_then(Value::as_sequence_mut)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(route) = r.get_mut("route").and_then(Value::as_mapping_mut) {
                            routes_seen += 1;
                            if spec.retries > 0 {
                                let mut policy = format!(
                                    "retry_on: connect-failure,refused-stream,reset-before-request\nnum_retries: {}\n",
                                    spec.retries
                                );
                                if spec.mode != Mode::Pick {
                                    // Pick mode retries walk the filter's fallback list;
                                    // elsewhere, never the host that just failed.
                                    policy.push_str("retry_host_predicate: [{name: envoy.retry_host_predicates.previous_hosts, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate}}]\nhost_selection_retry_max_attempts: 5\n");
                                }
                                route.insert(key("retry_policy"), yaml(&policy));
                            }
                        }
                    }
                }
            }
        }
    }
    if routes_seen == 0 {
        return Err(RenderError::Shape {
            template: name,
            why: "no routes found".into(),
        });
    }
    let body = serde_yaml_ng::to_string(&doc).map_err(|e| RenderError::Yaml {
        template: name,
        why: e.to_string(),
    })?;
    Ok(format!(
        "# Rendered by `tether gateway --mode {} --ranks {}` from envoy/{name}.\n{body}",
        spec.mode.name(),
        spec.ranks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mode: Mode, n: usize) -> GatewaySpec {
        GatewaySpec {
            mode,
            ranks: (0..n)
                .map(|i| format!("127.0.0.{}:{}", i + 1, 8000 + i).parse().unwrap())
                .collect(),
            dp_size: 2,
            plugin_config: serde_json::from_str(r#"{"fallbacks": 2}"#).unwrap(),
            filter_wasm: "/x/tether_filter.wasm".into(),
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin: "127.0.0.1:9901".parse().unwrap(),
            retries: 2,
            hash_balance_factor: None,
        }
    }

    fn endpoints(y: &str) -> Vec<String> {
        let doc: Value = serde_yaml_ng::from_str(y).unwrap();
        let c = &doc["static_resources"]["clusters"][0];
        c["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|e| {
                let s = &e["endpoint"]["address"]["socket_address"];
                format!(
                    "{}:{}",
                    s["address"].as_str().unwrap(),
                    s["port_value"].as_u64().unwrap()
                )
            })
            .collect()
    }

    #[test]
    fn the_cluster_holds_exactly_the_ranks_in_every_mode() {
        for mode in Mode::ALL {
            for n in [1, 4, 8] {
                let y = render(&spec(mode, n)).unwrap();
                assert!(!y.contains("${"), "{y}");
                let eps = endpoints(&y);
                assert_eq!(eps.len(), n);
                assert_eq!(eps[n - 1], format!("127.0.0.{}:{}", n, 8000 + n - 1));
            }
        }
    }

    #[test]
    fn pick_mode_configures_the_filter_with_the_ranks_and_retries_on_fallbacks() {
        let y = render(&spec(Mode::Pick, 3)).unwrap();
        let doc: Value = serde_yaml_ng::from_str(&y).unwrap();
        let chain = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let cfg = chain["http_filters"][0]["typed_config"]["config"]["configuration"]["value"]
            .as_str()
            .unwrap();
        let cfg: Json = serde_json::from_str(cfg).unwrap();
        assert_eq!(cfg["mode"], "pick");
        assert_eq!(cfg["fallbacks"], 2);
        assert_eq!(cfg["endpoints"][2]["address"], "127.0.0.3:8002");
        assert_eq!(cfg["endpoints"][0]["dp_size"], 2);
        let route = &chain["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        assert_eq!(route["retry_policy"]["num_retries"].as_u64(), Some(2));
        assert!(route["retry_policy"]["retry_host_predicate"].is_null());
        assert_eq!(
            chain["route_config"]["virtual_hosts"][0]["include_attempt_count_in_response"],
            Value::Bool(true)
        );
    }

    #[test]
    fn round_robin_replaces_maglev_and_hash_keeps_it() {
        let rr = render(&spec(Mode::RoundRobin, 2)).unwrap();
        assert!(rr.contains("envoy.load_balancing_policies.round_robin"));
        assert!(!rr.contains("maglev"));
        let h = render(&spec(Mode::Hash, 2)).unwrap();
        assert!(h.contains("envoy.load_balancing_policies.maglev"));
        assert!(h.contains("previous_hosts"));
    }

    #[test]
    fn reserved_fields_and_no_ranks_are_refused() {
        let mut s = spec(Mode::Pick, 2);
        s.plugin_config.insert("mode".into(), Json::from("hash"));
        assert!(matches!(render(&s), Err(RenderError::Reserved("mode"))));
        let mut s = spec(Mode::Hash, 2);
        s.ranks.clear();
        assert!(matches!(render(&s), Err(RenderError::NoRanks)));
    }
}
