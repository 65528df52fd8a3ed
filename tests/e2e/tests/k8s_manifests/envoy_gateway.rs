//! What Envoy Gateway makes of `envoy/envoy-gateway/`, run in real Envoy.
//!
//! No Envoy Gateway controller runs here, so the part of its translation that
//! lies on a request's way is written out below from its source (v1.9.0,
//! `internal/xds/translator/`): the HTTP filter order (`httpfilters.go`:
//! `buffer` 12 before `wasm` 200, then the EnvoyProxy's `filterOrder`), the wasm
//! filter (`wasm.go`: disabled in the listener, enabled on the route by an
//! empty `FilterConfig`, the plugin configuration as a JSON string), the
//! request buffer (`request_buffer.go`: disabled in the listener, a
//! `BufferPerRoute` with the policy's limit on the route), the route's header
//! modifier (`route.go`, `buildXdsAddedHeaders`: route-level
//! `request_headers_to_add`, `set` = OVERWRITE_IF_EXISTS_OR_ADD), the hash
//! policy (`buildHashPolicy`: one header hash per `consistentHash.headers`
//! entry, MAGLEV of `tableSize`) and the 32 KiB per-connection buffer limit
//! Envoy Gateway gives listeners and clusters (`listener.go`, `cluster.go`).
//! Every value comes from the manifests; only the addresses are the test's.

use super::{find, folder};
use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::{EchoRank, EchoReply, Envoy, HttpClient, Request};

/// Envoy Gateway's default per-connection buffer limit (listeners and clusters).
const EG_BUFFER_LIMIT: u64 = 32 * 1024;

/// The filter order: as the manifests give it, or Envoy Gateway's default
/// (the EnvoyProxy's `filterOrder` left out).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Order {
    Manifests,
    Default,
}

/// `10Mi`, `512Ki`, `1048576`: a Kubernetes quantity in bytes (the forms a
/// buffer limit takes).
pub fn quantity_bytes(q: &Value) -> Result<u64> {
    if let Some(n) = q.as_u64() {
        return Ok(n);
    }
    let s = q.as_str().context("quantity")?;
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits.parse().with_context(|| format!("quantity {s:?}"))?;
    let mult = match unit {
        "" => 1,
        "k" => 1000,
        "Ki" => 1 << 10,
        "M" => 1_000_000,
        "Mi" => 1 << 20,
        "G" => 1_000_000_000,
        "Gi" => 1 << 30,
        other => bail!("quantity unit {other:?}"),
    };
    Ok(n * mult)
}

/// The filter type of an HTTP filter (`envoy.filters.http.wasm/…` → `envoy.filters.http.wasm`).
fn filter_type(filter: &Value) -> &str {
    let name = filter["name"].as_str().unwrap_or_default();
    name.split('/').next().unwrap_or(name)
}

/// The (name, value) pairs a route rule's `RequestHeaderModifier`s `set`.
pub fn header_sets(rule: &Value) -> Vec<(String, String)> {
    rule["filters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["type"] == "RequestHeaderModifier")
        .flat_map(|f| {
            f["requestHeaderModifier"]["set"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .map(|h| {
            let field = |k: &str| h[k].as_str().unwrap_or_default().to_owned();
            (field("name"), field("value"))
        })
        .collect()
}

/// Envoy Gateway's `sortHTTPFilters` for the filters here: default ranks,
/// then each `filterOrder` entry moves every filter of its type before the
/// first / after the last filter of the named type.
fn ordered(mut filters: Vec<Value>, filter_order: &[Value]) -> Result<Vec<Value>> {
    let rank = |f: &Value| match filter_type(f) {
        "envoy.filters.http.buffer" => 12,
        "envoy.filters.http.wasm" => 200,
        _ => 50,
    };
    filters.sort_by_key(rank);
    for position in filter_order {
        let name = position["name"].as_str().context("filterOrder name")?;
        let (moved, mut rest): (Vec<Value>, Vec<Value>) =
            filters.into_iter().partition(|f| filter_type(f) == name);
        let at = if let Some(after) = position["after"].as_str() {
            rest.iter()
                .rposition(|f| filter_type(f) == after)
                .map(|i| i + 1)
        } else if let Some(before) = position["before"].as_str() {
            rest.iter().position(|f| filter_type(f) == before)
        } else {
            bail!("filterOrder entry without before or after: {position}")
        };
        let tail = rest.split_off(at.unwrap_or(rest.len()));
        rest.extend(moved);
        rest.extend(tail);
        filters = rest;
    }
    Ok(filters)
}

/// The bootstrap holding what Envoy Gateway configures for the manifests'
/// Gateway listener, route and ranks (`ranks`), with the filter module at `wasm`.
pub fn bootstrap(docs: &[Value], ranks: &[SocketAddr], wasm: &Path, order: Order) -> Result<Value> {
    let eep = find(docs, "EnvoyExtensionPolicy")?;
    let btp = find(docs, "BackendTrafficPolicy")?;
    let route = find(docs, "HTTPRoute")?;
    let proxy = find(docs, "EnvoyProxy")?;
    let ext = &eep["spec"]["wasm"][0];
    let wasm_name = ext["name"].as_str().context("wasm name")?;
    let filter_name = format!(
        "envoy.filters.http.wasm/envoyextensionpolicy/{}/{}/wasm/0",
        eep["metadata"]["namespace"].as_str().context("namespace")?,
        eep["metadata"]["name"].as_str().context("name")?
    );
    let mut plugin = json!({
        "name": wasm_name,
        "vm_config": {
            "vm_id": wasm_name,
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": wasm.display().to_string()}}
        },
        "configuration": {
            "@type": "type.googleapis.com/google.protobuf.StringValue",
            "value": ext["config"].to_string()
        },
        "fail_open": ext["failOpen"].as_bool().unwrap_or(false)
    });
    if let Some(root) = ext["rootID"].as_str() {
        plugin["root_id"] = json!(root);
    }
    let limit = quantity_bytes(&btp["spec"]["requestBuffer"]["limit"])?;
    let filters = vec![
        json!({
            "name": "envoy.filters.http.buffer",
            "disabled": true,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                "max_request_bytes": limit
            }
        }),
        json!({
            "name": filter_name,
            "disabled": true,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                "config": plugin
            }
        }),
    ];
    let no_order = Vec::new();
    let filter_order = match order {
        Order::Manifests => proxy["spec"]["filterOrder"]
            .as_array()
            .context("EnvoyProxy filterOrder")?,
        Order::Default => &no_order,
    };
    let mut http_filters = ordered(filters, filter_order)?;
    http_filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));

    let rule = &route["spec"]["rules"][0];
    let headers_to_add: Vec<Value> = header_sets(rule)
        .into_iter()
        .map(|(key, value)| {
            json!({
                "header": {"key": key, "value": value},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"
            })
        })
        .collect();
    let hash_policy: Vec<Value> = btp["spec"]["loadBalancer"]["consistentHash"]["headers"]
        .as_array()
        .context("consistentHash.headers")?
        .iter()
        .map(|h| json!({"header": {"header_name": h["name"]}}))
        .collect();
    let xds_route = json!({
        "match": {"prefix": rule["matches"][0]["path"]["value"]},
        "request_headers_to_add": headers_to_add,
        "route": {
            "cluster": "ranks",
            "hash_policy": hash_policy,
            "timeout": rule["timeouts"]["request"]
        },
        "typed_per_filter_config": {
            filter_name: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}},
            "envoy.filters.http.buffer": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute",
                "buffer": {"max_request_bytes": limit}
            }
        }
    });
    let endpoints: Vec<Value> = ranks
        .iter()
        .map(|a| json!({"endpoint": {"address": {"socket_address": {"address": a.ip().to_string(), "port_value": a.port()}}}}))
        .collect();
    let table = &btp["spec"]["loadBalancer"]["consistentHash"]["tableSize"];
    ensure!(
        btp["spec"]["loadBalancer"]["type"] == "ConsistentHash",
        "the policy's load balancer is not a consistent hash"
    );
    Ok(json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "per_connection_buffer_limit_bytes": EG_BUFFER_LIMIT,
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "route_config": {"virtual_hosts": [{"name": "llm", "domains": ["*"], "routes": [xds_route]}]},
                        "http_filters": http_filters
                    }
                }]}]
            }],
            "clusters": [{
                "name": "ranks",
                "type": "STATIC",
                "connect_timeout": "1s",
                "per_connection_buffer_limit_bytes": EG_BUFFER_LIMIT,
                "lb_policy": "MAGLEV",
                "maglev_lb_config": {"table_size": table},
                "load_assignment": {"cluster_name": "ranks", "endpoints": [{"lb_endpoints": endpoints}]}
            }]
        }
    }))
}

/// One request through `envoy`: the rank's echo.
async fn echo(client: &HttpClient, envoy: &Envoy, req: Request) -> Result<EchoReply> {
    let resp = client.send(envoy.listen_addr(), req).await?;
    ensure!(
        resp.status == 200,
        "status {}: {}",
        resp.status,
        String::from_utf8_lossy(&resp.body[..resp.body.len().min(300)])
    );
    Ok(resp.echo()?)
}

/// The manifests' filter order carries the body path on Envoy Gateway: a
/// session identified only in its body keeps one key and one rank, turn after
/// turn, with the turn markers; the header path and a prompt far over Envoy
/// Gateway's 32 KiB connection buffer route too; a client's `x-tether-key` is
/// not used. With Envoy Gateway's default order (the EnvoyProxy left out) the
/// same request reaches a rank without a key: the router picked before the
/// body was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_carries_the_body_path_with_the_manifests_filter_order() -> Result<()> {
    let wasm = tether_e2e::paths::need(tether_e2e::paths::require_filter_wasm());
    tether_e2e::paths::need(tether_e2e::paths::require_envoy());
    let docs = folder("envoy-gateway")?;
    let ranks = EchoRank::start_many(&["rank-a", "rank-b", "rank-c", "rank-d"])?;
    let addrs: Vec<SocketAddr> = ranks.iter().map(EchoRank::addr).collect();
    let client = HttpClient::new();
    let body_of = |conv: &Conversation, key: &str| {
        Request::post_bytes(
            "/v1/chat/completions",
            "application/json",
            conv.body(&[("prompt_cache_key", json!(key))]),
        )
    };

    let bootstrap_text = bootstrap(&docs, &addrs, &wasm, Order::Manifests)?.to_string();
    let envoy = Envoy::start(&bootstrap_text)?;
    let mut keys = BTreeSet::new();
    let mut used = BTreeSet::new();
    for s in 0..10 {
        let mut conv = Conversation::new(
            Api::Chat,
            "You are a coding agent.",
            &["bash"],
            "Fix the test.",
        );
        let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
        for turn in 0..3 {
            let e = echo(&client, &envoy, body_of(&conv, &format!("eg-{s}"))).await?;
            let key = e.header("x-tether-key").with_context(|| {
                format!(
                    "session {s} turn {turn}: no x-tether-key at the rank: {:?}",
                    e.headers
                )
            })?;
            ensure!(key.len() == 16, "key {key:?}");
            for marker in [
                "x-tether-prompt-end",
                "x-tether-turn-kind",
                "x-tether-session",
            ] {
                ensure!(
                    e.header(marker).is_some(),
                    "session {s} turn {turn}: no {marker}"
                );
            }
            seen.insert((key.to_owned(), e.rank.clone()));
            conv.tool_round(
                &format!("c{turn}"),
                "bash",
                json!({"cmd": "make test"}),
                "ok",
            );
        }
        ensure!(
            seen.len() == 1,
            "session {s}: one key and one rank over its turns, saw {seen:?}"
        );
        let (key, rank) = seen.into_iter().next().context("a turn")?;
        keys.insert(key);
        used.insert(rank);
    }
    ensure!(keys.len() == 10, "ten sessions, ten keys: {keys:?}");
    ensure!(used.len() >= 2, "ten sessions on one rank: {used:?}");

    // The header path: the key the filter set in its header callback stays
    // (the route's modifier has no filter state to copy).
    let conv = Conversation::new(Api::Chat, "sys", &[], "hi");
    let mut seen = BTreeSet::new();
    for _ in 0..3 {
        let req = body_of(&conv, "ignored").header("x-session-id", "eg-header");
        let e = echo(&client, &envoy, req).await?;
        let key = e.header("x-tether-key").context("header path: no key")?;
        seen.insert((key.to_owned(), e.rank.clone()));
    }
    ensure!(
        seen.len() == 1,
        "header path: one key and rank, saw {seen:?}"
    );

    // A client's own x-tether-key is dropped; the body decides.
    let conv = Conversation::new(Api::Chat, "sys", &[], "spoof");
    let e = echo(
        &client,
        &envoy,
        body_of(&conv, "eg-spoof").header("x-tether-key", "evil"),
    )
    .await?;
    ensure!(
        e.header("x-tether-key").is_some_and(|k| k != "evil"),
        "spoofed key: {:?}",
        e.header("x-tether-key")
    );

    // A 2 MiB prompt: the buffer filter raises the stream's limit past the
    // connection's 32 KiB before the body arrives.
    let mut conv = Conversation::new(Api::Chat, "sys", &["bash"], "big");
    conv.tool_round(
        "big",
        "bash",
        json!({"cmd": "cat log"}),
        &"log line\n".repeat(240_000),
    );
    let e = echo(&client, &envoy, body_of(&conv, "eg-big")).await?;
    ensure!(e.body_bytes > 2 << 20, "{} bytes", e.body_bytes);
    ensure!(e.header("x-tether-key").is_some(), "big body: no key");
    drop(envoy);

    // Envoy Gateway's own order: the buffer runs before the filter, the router
    // takes the headers before the body decision, and nothing is hashed.
    let envoy = Envoy::start(&bootstrap(&docs, &addrs, &wasm, Order::Default)?.to_string())?;
    let conv = Conversation::new(Api::Chat, "sys", &[], "hi");
    let e = echo(&client, &envoy, body_of(&conv, "eg-default")).await?;
    ensure!(
        e.header("x-tether-key").is_none(),
        "without the EnvoyProxy's filter order the key cannot reach the hash, yet the rank saw {:?}",
        e.header("x-tether-key")
    );
    Ok(())
}

#[test]
fn quantities_read_as_bytes() -> Result<()> {
    for (q, n) in [
        (json!("16Mi"), 16 << 20),
        (json!("512Ki"), 512 << 10),
        (json!(1048576), 1 << 20),
        (json!("2M"), 2_000_000),
    ] {
        ensure!(quantity_bytes(&q)? == n, "{q}");
    }
    ensure!(quantity_bytes(&json!("16Qi")).is_err());
    Ok(())
}
