//! The Envoy configuration around the tether filter, held to the filter's
//! `outputs`: every output the filter sets must be consumed, and everything
//! the configuration reads must be set (`docs/gateway.md`, "Outputs").
//!
//! [`check`] finds, in a bootstrap holding the tether filter, every mismatch
//! between its plugin configuration and the chain around it: a
//! `header_mutation` entry for a header the filter never sets, a header the
//! body path sets that no entry copies, a route that disables buffering on a
//! header the header path does not set, a hash policy, `override_host` source
//! or `ORIGINAL_DST` cluster reading an output that is off, a filter-state
//! output nothing reads, an endpoint the filter polls (`load`) that is not in
//! the polled cluster. [`align`] rewrites the `header_mutation` entries and
//! the buffer-disabling route of such a bootstrap from its plugin
//! configuration (what `tether gateway` and the test harness do); the rest
//! are deployment choices and stay for [`check`] to judge.

use serde_yaml_ng::{Mapping, Value};
use std::collections::BTreeSet;
use tether_filter::config::outputs::{HASHABLE_KEY, ORIGINAL_DST_KEY, Output, Outputs};
use tether_filter::config::{Config, Mode};

/// What a plugin configuration makes the filter write, as the chain sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    /// Request headers the body path hands over as filter state
    /// `wasm.tether.<name>`: each needs a `header_mutation` entry.
    pub copied: Vec<&'static str>,
    /// Internal headers the header path sets on every request it decides
    /// (what a buffer-disabling route may match); empty when the filter never
    /// decides in the header callback (`header_fast_path: false` or a body rewrite).
    pub header_path: Vec<&'static str>,
    /// Request headers set on both paths (hash policies and `override_host` read them).
    pub headers: Vec<&'static str>,
    /// Filter-state objects set (`original_dst_address`, `hashable_string`).
    pub filter_state: Vec<&'static str>,
}

impl Expect {
    /// From a plugin configuration (JSON text).
    pub fn from_plugin_config(json: &str) -> Result<Expect, String> {
        let cfg =
            Config::parse(json.as_bytes()).map_err(|e| format!("plugin configuration: {e}"))?;
        Ok(Expect::from_config(&cfg))
    }

    pub fn from_config(cfg: &Config) -> Expect {
        let o: Outputs = cfg.outputs;
        let header_path = if cfg.header_fast_path && !cfg.rewrites_body() {
            o.header_path_markers().collect()
        } else {
            Vec::new()
        };
        let mut filter_state = Vec::new();
        if o.has(Output::HashableString) {
            filter_state.push(HASHABLE_KEY);
        }
        if o.has(Output::OriginalDst) && cfg.mode == Mode::Pick {
            filter_state.push(ORIGINAL_DST_KEY);
        }
        Expect {
            copied: o.copied_headers().collect(),
            header_path,
            headers: o.request_headers().collect(),
            filter_state,
        }
    }
}

/// The value `header_mutation` copies a body-path output with.
pub fn state_formatter(header: &str) -> String {
    format!("%FILTER_STATE(wasm.tether.{header}:PLAIN)%")
}

/// The header a `header_mutation` value copies from tether's filter state, if it does.
fn copied_by(value: &str) -> Option<&str> {
    value
        .strip_prefix("%FILTER_STATE(wasm.tether.")?
        .strip_suffix(":PLAIN)%")
}

const WASM_FILTER: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const HEADER_MUTATION: &str =
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";
const BUFFER: &str = "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer";

fn str_at<'v>(v: &'v Value, path: &[&str]) -> Option<&'v str> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_str()
}

fn seq(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_sequence).into_iter().flatten()
}

fn seq_mut(v: Option<&mut Value>) -> impl Iterator<Item = &mut Value> {
    v.and_then(Value::as_sequence_mut).into_iter().flatten()
}

/// The HTTP connection managers of a bootstrap (their `typed_config`).
fn managers(doc: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for l in seq(doc.get("static_resources").and_then(|s| s.get("listeners"))) {
        for chain in seq(l.get("filter_chains")) {
            for f in seq(chain.get("filters")) {
                if let Some(tc) = f.get("typed_config")
                    && tc.get("http_filters").is_some()
                {
                    out.push(tc);
                }
            }
        }
    }
    out
}

fn managers_mut(doc: &mut Value) -> Vec<&mut Value> {
    let mut out = Vec::new();
    let listeners = doc
        .get_mut("static_resources")
        .and_then(|s| s.get_mut("listeners"));
    for l in seq_mut(listeners) {
        for chain in seq_mut(l.get_mut("filter_chains")) {
            for f in seq_mut(chain.get_mut("filters")) {
                if let Some(tc) = f.get_mut("typed_config")
                    && tc.get("http_filters").is_some()
                {
                    out.push(tc);
                }
            }
        }
    }
    out
}

/// The tether filter's plugin configuration in one connection manager: the
/// wasm filter whose `root_id` is `tether`.
fn plugin_config(hcm: &Value) -> Option<&str> {
    seq(hcm.get("http_filters")).find_map(|f| {
        let tc = f.get("typed_config")?;
        (str_at(tc, &["@type"]) == Some(WASM_FILTER)
            && str_at(tc, &["config", "root_id"]) == Some("tether"))
        .then(|| str_at(tc, &["config", "configuration", "value"]))
        .flatten()
    })
}

fn has_filter(hcm: &Value, ty: &str) -> bool {
    seq(hcm.get("http_filters")).any(|f| str_at(f, &["typed_config", "@type"]) == Some(ty))
}

/// `header_mutation` request entries that copy tether's filter state: (header, value).
fn state_copies(hcm: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in seq(hcm.get("http_filters")) {
        if str_at(f, &["typed_config", "@type"]) != Some(HEADER_MUTATION) {
            continue;
        }
        let entries = f
            .get("typed_config")
            .and_then(|t| t.get("mutations"))
            .and_then(|m| m.get("request_mutations"));
        for e in seq(entries) {
            let (Some(k), Some(v)) = (
                str_at(e, &["append", "header", "key"]),
                str_at(e, &["append", "header", "value"]),
            ) else {
                continue;
            };
            if v.contains("wasm.tether.") {
                out.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    out
}

fn routes(hcm: &Value) -> impl Iterator<Item = &Value> {
    seq(hcm.get("route_config").and_then(|r| r.get("virtual_hosts")))
        .flat_map(|vh| seq(vh.get("routes")))
}

/// Whether a route turns the buffer filter off.
fn disables_buffer(route: &Value) -> bool {
    route
        .get("typed_per_filter_config")
        .and_then(|t| t.get("envoy.filters.http.buffer"))
        .and_then(|b| b.get("disabled"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// The headers a route matches as present.
fn present_matches(route: &Value) -> Vec<&str> {
    seq(route.get("match").and_then(|m| m.get("headers")))
        .filter(|h| h.get("present_match").and_then(Value::as_bool) == Some(true))
        .filter_map(|h| h.get("name").and_then(Value::as_str))
        .collect()
}

/// Names read somewhere in a bootstrap, each with where it is read.
type Reads = Vec<(String, String)>;

/// What the rest of the bootstrap reads: (request headers, filter-state keys).
fn consumers(doc: &Value, hcm: &Value) -> (Reads, Reads) {
    let (mut headers, mut state) = (Vec::new(), Vec::new());
    for r in routes(hcm) {
        for hp in seq(r.get("route").and_then(|r| r.get("hash_policy"))) {
            if let Some(h) = str_at(hp, &["header", "header_name"]) {
                headers.push((h.to_owned(), "a route hash_policy".to_owned()));
            }
            if let Some(k) = str_at(hp, &["filter_state", "key"]) {
                state.push((k.to_owned(), "a route hash_policy".to_owned()));
            }
        }
    }
    for c in seq(doc.get("static_resources").and_then(|s| s.get("clusters"))) {
        let name = str_at(c, &["name"]).unwrap_or("?").to_owned();
        if str_at(c, &["type"]) == Some("ORIGINAL_DST") {
            let lb = c.get("original_dst_lb_config");
            let by_header = lb
                .and_then(|l| l.get("use_http_header"))
                .and_then(Value::as_bool)
                == Some(true);
            if by_header {
                let h = lb
                    .and_then(|l| l.get("http_header_name"))
                    .and_then(Value::as_str)
                    .unwrap_or("x-envoy-original-dst-host");
                headers.push((h.to_owned(), format!("ORIGINAL_DST cluster {name}")));
            }
            state.push((
                ORIGINAL_DST_KEY.to_owned(),
                format!("ORIGINAL_DST cluster {name}"),
            ));
        }
        let policies = c
            .get("load_balancing_policy")
            .and_then(|p| p.get("policies"));
        for p in seq(policies) {
            let sources = p
                .get("typed_extension_config")
                .and_then(|t| t.get("typed_config"))
                .and_then(|t| t.get("override_host_sources"));
            for s in seq(sources) {
                if let Some(h) = str_at(s, &["header"]) {
                    headers.push((h.to_owned(), format!("override_host of cluster {name}")));
                }
            }
        }
    }
    (headers, state)
}

/// Every mismatch between the tether filter's outputs and the bootstrap
/// around it (empty: consistent). A bootstrap without the tether filter, or
/// whose plugin configuration does not parse (Envoy refuses it itself), has
/// none.
pub fn check(doc: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for hcm in managers(doc) {
        let Some(config) = plugin_config(hcm) else {
            continue;
        };
        let Ok(cfg) = Config::parse(config.as_bytes()) else {
            continue;
        };
        let want = Expect::from_config(&cfg);
        let outputs: Vec<&str> = cfg.outputs.iter().map(Output::name).collect();
        let said = format!("outputs [{}]", outputs.join(", "));
        let copies = state_copies(hcm);
        let buffered = has_filter(hcm, BUFFER);
        for (key, value) in &copies {
            match copied_by(value) {
                Some(h) if h != key => problems.push(format!(
                    "header_mutation sets {key} from the filter state of {h}"
                )),
                Some(h) if !want.copied.contains(&h) => problems.push(format!(
                    "header_mutation copies {h}, which the filter never sets ({said})"
                )),
                Some(_) => {}
                None => problems.push(format!(
                    "header_mutation value {value:?} for {key} is not a plain copy of tether's filter state"
                )),
            }
        }
        if !want.copied.is_empty() && !buffered {
            problems.push(
                "no buffer filter: the body path's outputs would arrive after routing".to_owned(),
            );
        }
        for h in &want.copied {
            if !copies.iter().any(|(k, _)| k == h) {
                problems.push(format!(
                    "the filter sets {h} on the body path ({said}) but no header_mutation entry copies it"
                ));
            }
        }
        let mut header_path_route = false;
        for r in routes(hcm).filter(|r| disables_buffer(r)) {
            let names = present_matches(r);
            if names.iter().any(|n| want.header_path.contains(n)) {
                header_path_route = true;
            } else {
                problems.push(format!(
                    "a route disables buffering on {names:?}, which the filter does not set on every header-path request ({})",
                    if want.header_path.is_empty() {
                        "it never decides in the header callback".to_owned()
                    } else {
                        format!("it sets {:?}", want.header_path)
                    }
                ));
            }
        }
        if buffered && !want.header_path.is_empty() && !header_path_route {
            problems.push(format!(
                "the header path would buffer: no route disables the buffer filter on one of {:?}",
                want.header_path
            ));
        }
        if buffered && cfg.header_fast_path && !cfg.rewrites_body() && want.header_path.is_empty() {
            problems.push(format!(
                "the header path has no output a route could match to skip buffering ({said}): add \"key\" or \"destination\", or set header_fast_path: false"
            ));
        }
        let (read_headers, read_state) = consumers(doc, hcm);
        for (h, by) in &read_headers {
            if !want.headers.contains(&h.as_str()) {
                problems.push(format!(
                    "{by} reads {h}, which the filter does not set ({said})"
                ));
            }
        }
        for (k, by) in &read_state {
            // An ORIGINAL_DST cluster reading a header uses filter state only as a fallback.
            let by_header = read_headers.iter().any(|(_, b)| b == by);
            if !by_header && !want.filter_state.contains(&k.as_str()) {
                problems.push(format!(
                    "{by} reads filter state {k}, which the filter does not set ({said})"
                ));
            }
        }
        for k in &want.filter_state {
            if !read_state.iter().any(|(r, _)| r == k) {
                problems.push(format!(
                    "the filter sets filter state {k} ({said}) but nothing reads it"
                ));
            }
        }
        problems.extend(polled_cluster(doc, &cfg));
    }
    problems
}

/// With `load`, every polled endpoint (decode and prefill) must be an
/// endpoint of `load.cluster`, which must steer by
/// `x-gateway-destination-endpoint`: `override_host` answers a call for a
/// host it does not have from another host, so a missing endpoint would get
/// another rank's load (`docs/envoy-mechanisms.md`, mechanism 6).
fn polled_cluster(doc: &Value, cfg: &Config) -> Vec<String> {
    let Some(lc) = &cfg.load else {
        return Vec::new();
    };
    let clusters = doc.get("static_resources").and_then(|s| s.get("clusters"));
    let Some(c) = seq(clusters).find(|c| str_at(c, &["name"]) == Some(lc.cluster.as_str())) else {
        return vec![format!(
            "load.cluster {:?} is not a cluster of this bootstrap (the /load polls go there)",
            lc.cluster
        )];
    };
    let mut problems = Vec::new();
    let (headers, _) = consumers(doc, &Value::Null);
    let by = format!("override_host of cluster {}", lc.cluster);
    if !headers
        .iter()
        .any(|(h, b)| h == tether_filter::emit::markers::names::DESTINATION && *b == by)
    {
        problems.push(format!(
            "load.cluster {:?} does not steer by {} (override_host): polls would reach any endpoint",
            lc.cluster,
            tether_filter::emit::markers::names::DESTINATION
        ));
    }
    let mut have = BTreeSet::new();
    let groups = c.get("load_assignment").and_then(|l| l.get("endpoints"));
    for g in seq(groups) {
        for e in seq(g.get("lb_endpoints")) {
            let sa = e
                .get("endpoint")
                .and_then(|e| e.get("address"))
                .and_then(|a| a.get("socket_address"));
            let ip = sa.and_then(|s| s.get("address")).and_then(Value::as_str);
            let port = sa.and_then(|s| s.get("port_value")).and_then(Value::as_u64);
            if let (Some(ip), Some(port)) = (ip, port)
                && let Ok(ip) = ip.parse::<std::net::IpAddr>()
            {
                have.insert(std::net::SocketAddr::new(ip, port as u16).to_string());
            }
        }
    }
    let polled = cfg
        .endpoints
        .iter()
        .chain(cfg.pd.iter().flat_map(|pd| &pd.prefill));
    for e in polled {
        if !have.contains(&e.address) {
            problems.push(format!(
                "{} is polled through load.cluster {:?} but is not one of its endpoints (another rank would answer for it)",
                e.address, lc.cluster
            ));
        }
    }
    problems
}

/// Rewrites, in every connection manager holding the tether filter, the
/// `header_mutation` entries that copy tether's filter state (one per header
/// the body path sets, in output order; other entries kept) and the header
/// the buffer-disabling routes match (the first header-path output; such a
/// route is added before the catch-all when missing, and dropped when the
/// filter never decides in the header callback), from the filter's own
/// plugin configuration. Hash policies, clusters and filters are
/// deployment choices: [`check`] judges them.
pub fn align(doc: &mut Value) {
    for hcm in managers_mut(doc) {
        let Some(config) = plugin_config(hcm) else {
            continue;
        };
        let Ok(want) = Expect::from_plugin_config(config) else {
            continue;
        };
        let marker = want.header_path.first().copied();
        for f in seq_mut(hcm.get_mut("http_filters")) {
            if str_at(f, &["typed_config", "@type"]) != Some(HEADER_MUTATION) {
                continue;
            }
            let Some(entries) = f
                .get_mut("typed_config")
                .and_then(|t| t.get_mut("mutations"))
                .and_then(|m| m.get_mut("request_mutations"))
                .and_then(Value::as_sequence_mut)
            else {
                continue;
            };
            entries.retain(|e| {
                !str_at(e, &["append", "header", "value"])
                    .is_some_and(|v| v.contains("wasm.tether."))
            });
            for h in &want.copied {
                entries.push(copy_entry(h));
            }
        }
        let vhosts = hcm
            .get_mut("route_config")
            .and_then(|r| r.get_mut("virtual_hosts"));
        for vh in seq_mut(vhosts) {
            let Some(routes) = vh.get_mut("routes").and_then(Value::as_sequence_mut) else {
                continue;
            };
            // A header path needs a route that skips the buffer: the
            // catch-all route's copy, matching the header-path output.
            if let Some(marker) = marker
                && !routes.iter().any(disables_buffer)
                && let Some(i) = routes
                    .iter()
                    .position(|r| r.get("match").and_then(|m| m.get("headers")).is_none())
            {
                let mut r = routes[i].clone();
                if let Some(m) = r.get_mut("match").and_then(Value::as_mapping_mut) {
                    m.insert(
                        Value::from("headers"),
                        serde_yaml_ng::from_str(&format!(
                            "[{{name: {marker}, present_match: true}}]"
                        ))
                        .unwrap_or(Value::Null),
                    );
                }
                if let Some(m) = r.as_mapping_mut() {
                    m.insert(
                        Value::from("typed_per_filter_config"),
                        serde_yaml_ng::from_str(
                            "{envoy.filters.http.buffer: {\"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute, disabled: true}}",
                        )
                        .unwrap_or(Value::Null),
                    );
                }
                routes.insert(i, r);
            }
            routes.retain_mut(|r| {
                if !disables_buffer(r) {
                    return true;
                }
                let Some(marker) = marker else {
                    // No header path: the route would never match.
                    return false;
                };
                for h in seq_mut(r.get_mut("match").and_then(|m| m.get_mut("headers"))) {
                    if h.get("present_match").and_then(Value::as_bool) == Some(true)
                        && let Some(m) = h.as_mapping_mut()
                    {
                        m.insert(Value::from("name"), Value::from(marker));
                    }
                }
                true
            });
        }
    }
}

/// One `header_mutation` entry copying tether's filter state for `header`.
fn copy_entry(header: &str) -> Value {
    let mut h = Mapping::new();
    h.insert(Value::from("key"), Value::from(header));
    h.insert(Value::from("value"), Value::from(state_formatter(header)));
    let mut append = Mapping::new();
    append.insert(Value::from("header"), Value::Mapping(h));
    append.insert(
        Value::from("append_action"),
        Value::from("OVERWRITE_IF_EXISTS_OR_ADD"),
    );
    append.insert(Value::from("keep_empty_value"), Value::from(false));
    let mut e = Mapping::new();
    e.insert(Value::from("append"), Value::Mapping(append));
    Value::Mapping(e)
}

/// The headers each `header_mutation` of a bootstrap copies from tether's
/// filter state, in order (for comparing chains).
pub fn copied_headers(doc: &Value) -> Vec<BTreeSet<String>> {
    managers(doc)
        .into_iter()
        .map(|hcm| {
            state_copies(hcm)
                .into_iter()
                .filter_map(|(_, v)| copied_by(&v).map(str::to_owned))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests;
