//! A ready Envoy bootstrap for a list of ranks: the shipped template of the
//! chosen mode (`demo.yaml` for pick, `hash.yaml` for hash and round robin)
//! with its placeholders filled (timeouts, retries, ejection), then edited as
//! YAML — the upstream cluster holds exactly the given ranks (with their
//! stable names), and round robin replaces MAGLEV.

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
    /// Stable names of the ranks, by position (`None` or missing: the
    /// address is the identity). Rendezvous (pick mode) and MAGLEV (hash
    /// mode, `envoy.lb` `hash_key`) hash the name, so a rank restarted on a
    /// new address keeps its sessions.
    pub rank_names: Vec<Option<String>>,
    /// Route, stream-idle and per-attempt timeouts.
    pub timeouts: Timeouts,
    /// Consecutive failures (5xx, resets, timeouts) after which a rank is
    /// ejected: Envoy's outlier detection, and in pick mode the filter's
    /// `eject` (Envoy's `override_host` ignores ejections).
    pub eject_after: u32,
    /// For how long (seconds; Envoy lengthens repeated ejections).
    pub eject_for_s: u64,
}

/// Timeouts suited to LLM answers (Envoy's 15 s route default cuts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Whole request, first byte sent to last byte answered (route `timeout`; 0: none).
    pub request_s: u64,
    /// No byte in either direction for this long ends a stream (`stream_idle_timeout`; 0: none).
    pub stream_idle_s: u64,
    /// Wait for one attempt's response headers before retrying elsewhere
    /// (`per_try_timeout`; 0: none). A non-streamed answer sends its headers
    /// only when done, so set it only where answers stream or are short.
    pub attempt_s: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            request_s: 600,
            stream_idle_s: 300,
            attempt_s: 0,
        }
    }
}

/// Envoy's duration for whole seconds.
fn seconds(s: u64) -> String {
    format!("{s}s")
}

/// A bootstrap that cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// No ranks.
    #[error("--ranks: at least one rank is needed")]
    NoRanks,
    /// A rank name that is empty, repeated or not one token.
    #[error("--ranks: rank name {0:?} must be unique, non-empty and without spaces, commas or `=`")]
    BadName(String),
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
    /// The stable name of rank `i`, if it has one.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.rank_names.get(i).and_then(|n| n.as_deref())
    }

    fn check_names(&self) -> Result<(), RenderError> {
        let mut seen = std::collections::BTreeSet::new();
        for n in self.rank_names.iter().flatten() {
            let bad = n.is_empty()
                || n.chars().any(|c| c.is_whitespace() || c == ',' || c == '=')
                || !seen.insert(n.as_str());
            if bad {
                return Err(RenderError::BadName(n.clone()));
            }
        }
        Ok(())
    }

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
                .enumerate()
                .map(|(i, r)| {
                    let mut e =
                        serde_json::json!({"address": r.to_string(), "dp_size": self.dp_size});
                    if let (Some(name), Some(o)) = (self.name(i), e.as_object_mut()) {
                        o.insert("name".into(), Json::from(name));
                    }
                    e
                })
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
        if self.mode == Mode::Pick {
            c.insert(
                "eject".into(),
                serde_json::json!({"failures": self.eject_after, "ms": self.eject_for_s.saturating_mul(1000)}),
            );
        }
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

/// Routes of every virtual host of every listener.
fn count_routes(doc: &Value) -> usize {
    let listeners = doc["static_resources"]["listeners"].as_sequence();
    listeners
        .into_iter()
        .flatten()
        .flat_map(|l| l["filter_chains"].as_sequence().into_iter().flatten())
        .flat_map(|c| c["filters"].as_sequence().into_iter().flatten())
        .flat_map(|f| {
            f["typed_config"]["route_config"]["virtual_hosts"]
                .as_sequence()
                .into_iter()
                .flatten()
        })
        .map(|v| v["routes"].as_sequence().map_or(0, Vec::len))
        .sum()
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
    spec.check_names()?;
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
    vars.insert("RETRIES".into(), spec.retries.to_string());
    vars.insert("ROUTE_TIMEOUT".into(), seconds(spec.timeouts.request_s));
    vars.insert(
        "STREAM_IDLE_TIMEOUT".into(),
        seconds(spec.timeouts.stream_idle_s),
    );
    vars.insert("ATTEMPT_TIMEOUT".into(), seconds(spec.timeouts.attempt_s));
    vars.insert("EJECT_AFTER".into(), spec.eject_after.to_string());
    vars.insert("EJECT_TIME".into(), seconds(spec.eject_for_s));
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
        .enumerate()
        .map(|(i, r)| {
            let mut e = yaml(&format!(
                "endpoint: {{address: {{socket_address: {{address: \"{}\", port_value: {}}}}}}}",
                r.ip(),
                r.port()
            ));
            // MAGLEV hashes `envoy.lb` `hash_key` instead of the address.
            if let (Some(n), Some(m), Mode::Hash) = (spec.name(i), e.as_mapping_mut(), spec.mode) {
                m.insert(
                    key("metadata"),
                    yaml(&format!(
                        "filter_metadata: {{envoy.lb: {{hash_key: \"{n}\"}}}}"
                    )),
                );
            }
            e
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

    // Routes: the templates carry the timeouts and the retry policy.
    let routes_seen = count_routes(&doc);
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
            rank_names: Vec::new(),
            timeouts: Timeouts::default(),
            eject_after: 5,
            eject_for_s: 30,
        }
    }

    fn route(doc: &Value, i: usize) -> &Value {
        &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
            ["virtual_hosts"][0]["routes"][i]["route"]
    }

    #[test]
    fn every_route_gets_llm_timeouts_and_retries_on_5xx() {
        for mode in Mode::ALL {
            let mut s = spec(mode, 2);
            s.timeouts = Timeouts {
                request_s: 900,
                stream_idle_s: 120,
                attempt_s: 7,
            };
            s.eject_after = 3;
            let doc: Value = serde_yaml_ng::from_str(&render(&s).unwrap()).unwrap();
            let hcm = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
            assert_eq!(hcm["stream_idle_timeout"].as_str(), Some("120s"));
            for i in 0..2 {
                let r = route(&doc, i);
                assert_eq!(r["timeout"].as_str(), Some("900s"), "{mode:?} route {i}");
                let p = &r["retry_policy"];
                assert_eq!(p["per_try_timeout"].as_str(), Some("7s"));
                assert!(p["retry_on"].as_str().unwrap().contains("5xx"));
                assert_eq!(p["num_retries"].as_u64(), Some(2));
            }
            let c = &doc["static_resources"]["clusters"][0];
            assert_eq!(c["outlier_detection"]["consecutive_5xx"].as_u64(), Some(3));
            assert_eq!(
                c["outlier_detection"]["base_ejection_time"].as_str(),
                Some("30s")
            );
            assert!(!c["circuit_breakers"]["thresholds"][0]["retry_budget"].is_null());
        }
    }

    #[test]
    fn rank_names_reach_the_filter_and_maglev() {
        let mut s = spec(Mode::Pick, 2);
        s.rank_names = vec![Some("rank-a".into()), None];
        let doc: Value = serde_yaml_ng::from_str(&render(&s).unwrap()).unwrap();
        let chain = &doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        let cfg: Json = serde_json::from_str(
            chain["http_filters"][0]["typed_config"]["config"]["configuration"]["value"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(cfg["endpoints"][0]["name"], "rank-a");
        assert!(cfg["endpoints"][1].get("name").is_none());
        s.mode = Mode::Hash;
        let doc: Value = serde_yaml_ng::from_str(&render(&s).unwrap()).unwrap();
        let eps = &doc["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"];
        assert_eq!(
            eps[0]["metadata"]["filter_metadata"]["envoy.lb"]["hash_key"].as_str(),
            Some("rank-a")
        );
        assert!(eps[1]["metadata"].is_null());
        for bad in ["", "a b", "a,b", "a=b"] {
            s.rank_names = vec![Some(bad.into())];
            assert!(
                matches!(render(&s), Err(RenderError::BadName(_))),
                "{bad:?}"
            );
        }
        s.rank_names = vec![Some("x".into()), Some("x".into())];
        assert!(matches!(render(&s), Err(RenderError::BadName(_))));
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
        assert_eq!(
            cfg["eject"],
            serde_json::json!({"failures": 5, "ms": 30000})
        );
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
