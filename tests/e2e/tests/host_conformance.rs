//! The wasmtime host's Envoy rules, checked against real Envoy: each test sends
//! the same request through the floor filter in Envoy and in the harness
//! (`tether-wasm-host`) and asserts both show the same observable result, so
//! the harness cannot drift from the real host. Rules: docs/wasm-host.md.

use std::time::Duration;
use tether_e2e::{EchoRank, Envoy, HttpClient, Request, paths};
use tether_wasm_host::{HostOptions, Plugin};

/// Listener → floor filter (wasm, V8) → router → one echo rank.
const BOOTSTRAP: &str = r#"
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: ${ADMIN_PORT}}}
static_resources:
  listeners:
  - name: ingress
    address: {socket_address: {address: 127.0.0.1, port_value: ${LISTEN_PORT}}}
    per_connection_buffer_limit_bytes: 33554432
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - {name: all, domains: ["*"], routes: [{match: {prefix: "/"}, route: {cluster: rank}}]}
          http_filters:
          - name: floor
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: floor
                root_id: floor
                fail_open: false
                vm_config:
                  vm_id: floor
                  runtime: envoy.wasm.runtime.v8
                  code: {local: {filename: "${FLOOR_WASM}"}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: ${PLUGIN_CONFIG}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: rank
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: rank
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: ${RANK_0_IP}, port_value: ${RANK_0_PORT}}}}
"#;

/// The body-path routing chain: floor filter → buffer (holds the headers
/// until the body is complete) → router → `ORIGINAL_DST` cluster, which reads
/// the filter state `envoy.network.transport_socket.original_dst_address`.
fn original_dst_bootstrap() -> String {
    BOOTSTRAP
        .replace(
            "          - name: envoy.filters.http.router\n",
            "          - name: envoy.filters.http.buffer\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer\n              max_request_bytes: 33554432\n          - name: envoy.filters.http.router\n",
        )
        .replace(
            "    type: STATIC\n",
            "    type: ORIGINAL_DST\n    lb_policy: CLUSTER_PROVIDED\n",
        )
        .replace(
            "    load_assignment:\n      cluster_name: rank\n      endpoints:\n      - lb_endpoints:\n        - endpoint: {address: {socket_address: {address: ${RANK_0_IP}, port_value: ${RANK_0_PORT}}}}\n",
            "",
        )
}

fn start_envoy(config: &serde_json::Value) -> anyhow::Result<(Envoy, EchoRank)> {
    start_envoy_with(config, BOOTSTRAP)
}

fn start_envoy_with(
    config: &serde_json::Value,
    bootstrap: &str,
) -> anyhow::Result<(Envoy, EchoRank)> {
    paths::require_envoy()?;
    paths::require_floor_wasm()?;
    let rank = EchoRank::start("r0")?;
    let envoy = Envoy::builder()
        .plugin_config(config)
        .var("RANK_0_IP", rank.addr().ip().to_string())
        .var("RANK_0_PORT", rank.port().to_string())
        .start(bootstrap)?;
    Ok((envoy, rank))
}

/// The floor filter compiled once per test binary (a debug-build compile takes seconds).
fn floor_plugin() -> anyhow::Result<&'static Plugin> {
    static PLUGIN: std::sync::OnceLock<Plugin> = std::sync::OnceLock::new();
    if let Some(p) = PLUGIN.get() {
        return Ok(p);
    }
    let plugin = Plugin::from_file(paths::require_floor_wasm()?)?;
    Ok(PLUGIN.get_or_init(|| plugin))
}

fn harness(config: &serde_json::Value) -> anyhow::Result<tether_wasm_host::FilterVm> {
    Ok(floor_plugin()?.start(HostOptions {
        plugin_config: config.to_string().into_bytes(),
        ..HostOptions::default()
    })?)
}

fn body(size: usize) -> Vec<u8> {
    (0..size).map(|i| b'a' + (i % 26) as u8).collect()
}

/// Header mode: a header set in the header callback reaches the upstream.
#[tokio::test(flavor = "multi_thread")]
async fn header_set_in_header_callback_reaches_upstream() -> anyhow::Result<()> {
    let config = serde_json::json!({"mode": "header"});
    let (envoy, _rank) = start_envoy(&config)?;
    let resp = HttpClient::new()
        .send(
            envoy.listen_addr(),
            Request::post_bytes("/h", "text/plain", body(100)),
        )
        .await?;
    let echo = resp.echo()?;

    let mut vm = harness(&config)?;
    let out = vm.run(&tether_wasm_host::Request::post("/h", &[], &[&body(100)]))?;
    assert_eq!(echo.header("x-floor"), Some("1"));
    assert_eq!(out.upstream_header("x-floor"), echo.header("x-floor"));
    assert_eq!(out.upstream.map(|u| u.body.len()), Some(echo.body_bytes));
    Ok(())
}

/// After `Continue` from the header callback the request headers are gone:
/// a read and a replace from the body callback both answer `BadArgument` (2),
/// and a body paused until end of stream arrives whole (`body_size` = total).
#[tokio::test(flavor = "multi_thread")]
async fn request_headers_are_gone_after_continue_and_paused_body_is_buffered() -> anyhow::Result<()>
{
    let config = serde_json::json!({"mode": "probe"});
    let (envoy, _rank) = start_envoy(&config)?;
    let size = 200_000;
    let req = Request::post_bytes("/p", "text/plain", body(size)).chunked(16 * 1024);
    let resp = HttpClient::new().send(envoy.listen_addr(), req).await?;
    assert_eq!(
        resp.status,
        200,
        "{}",
        tether_e2e::envoy::tail(&envoy.log(), 20)
    );

    let mut vm = harness(&config)?;
    let chunks = tether_wasm_host::Request::chunked(&body(size), 16 * 1024);
    let out = vm.run(&tether_wasm_host::Request {
        body_chunks: chunks,
        ..tether_wasm_host::Request::post("/p", &[], &[])
    })?;
    let down = out
        .downstream
        .clone()
        .ok_or_else(|| anyhow::anyhow!("harness gave no response: {out:?}"))?;
    for name in [
        "x-floor-get-status",
        "x-floor-set-status",
        "x-floor-body-size",
    ] {
        assert_eq!(
            down.headers.get_str(name),
            resp.header(name),
            "{name}: harness vs Envoy"
        );
    }
    assert_eq!(resp.header("x-floor-set-status"), Some("2"));
    assert_eq!(
        resp.header("x-floor-body-size"),
        Some(size.to_string().as_str())
    );
    assert_eq!(
        resp.echo()?.header("x-floor-probe"),
        None,
        "the replace did not reach the upstream"
    );
    assert_eq!(out.upstream_header("x-floor-probe"), None);
    Ok(())
}

/// `Pause` from the header callback stops all iteration: the body callback
/// never runs (it would answer `200 body delivered`) and the request hangs.
#[tokio::test(flavor = "multi_thread")]
async fn pause_in_header_callback_stops_body_delivery() -> anyhow::Result<()> {
    let config = serde_json::json!({"mode": "pause"});
    let (envoy, _rank) = start_envoy(&config)?;
    let client = HttpClient::new().timeout(Duration::from_secs(2));
    let got = client
        .send(
            envoy.listen_addr(),
            Request::post_bytes("/x", "text/plain", body(1000)),
        )
        .await;
    assert!(
        got.is_err(),
        "Envoy answered although the filter paused: {:?}",
        got.map(|r| (r.status, r.body))
    );

    let mut vm = harness(&config)?;
    let out = vm.run(&tether_wasm_host::Request::post("/x", &[], &[&body(1000)]))?;
    assert!(out.local_response.is_none() && out.upstream.is_none());
    assert!(out.stalled.is_some());
    Ok(())
}

/// `set_envoy_filter_state` with the original-dst key is accepted and routes:
/// Envoy sends the request to exactly the address the filter named, and the
/// harness records the same accepted entry.
#[tokio::test(flavor = "multi_thread")]
async fn original_dst_filter_state_is_accepted_and_routes() -> anyhow::Result<()> {
    let rank = EchoRank::start("dst")?;
    let config = serde_json::json!({"mode": "body", "dst": rank.addr().to_string()});
    let bootstrap = original_dst_bootstrap();
    assert!(
        !bootstrap.contains("load_assignment"),
        "the cluster must be ORIGINAL_DST"
    );
    let (envoy, _other) = start_envoy_with(&config, &bootstrap)?;
    let req = Request::post_bytes("/b", "application/json", body(50_000)).chunked(8 * 1024);
    let resp = HttpClient::new().send(envoy.listen_addr(), req).await?;
    assert_eq!(
        resp.status,
        200,
        "{}",
        tether_e2e::envoy::tail(&envoy.log(), 30)
    );
    let echo = resp.echo()?;
    assert_eq!(echo.rank, "dst", "routed to the filter's pick");
    assert_eq!(echo.body_bytes, 50_000);

    let mut vm = harness(&config)?;
    let chunks = tether_wasm_host::Request::chunked(&body(50_000), 8 * 1024);
    let out = vm.run(&tether_wasm_host::Request {
        body_chunks: chunks,
        ..tether_wasm_host::Request::post("/b", &[], &[])
    })?;
    assert_eq!(
        out.filter_state_value("envoy.network.transport_socket.original_dst_address"),
        Some(rank.addr().to_string().as_str())
    );
    Ok(())
}

/// What one local reply looked like to a client and in the module's logs.
#[derive(Debug, PartialEq)]
struct LocalSeen {
    status: u16,
    /// `x-floor-response-seen`: what the module's response-header callback saw.
    seen: Option<String>,
    content_type: Option<String>,
    content_length: Option<String>,
    body: Vec<u8>,
    /// `floor local: …` log lines, in order.
    logs: Vec<String>,
}

fn floor_local_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Vec<String> {
    lines
        .filter_map(|l| l.find("floor local: ").map(|i| l[i..].trim().to_owned()))
        .collect()
}

/// A local reply from the module goes through the module's own response
/// callbacks in Envoy: the response-header callback sees `:status`, the
/// module's headers, `content-length`/`content-type` for a non-empty body and
/// `response.code_details` (whitespace as `_`); the body callback sees and may
/// rewrite the body (the floor upper-cases it); no request callback runs after
/// a reply sent from the headers; `on_log` sees the final code and details.
/// The harness must show the client exactly what Envoy shows.
#[tokio::test(flavor = "multi_thread")]
async fn local_reply_goes_through_the_modules_response_callbacks() -> anyhow::Result<()> {
    let cases = [
        serde_json::json!({"mode": "local", "at": "headers"}),
        serde_json::json!({"mode": "local", "at": "body"}),
        serde_json::json!({"mode": "local", "at": "headers", "details": "has some spaces", "body": ""}),
        serde_json::json!({"mode": "local", "at": "body", "body": "{}",
            "headers": [["content-type", "application/json"], ["x-envoy-from-module", "1"], ["content-length", "99"]]}),
    ];
    for config in cases {
        let (envoy, _rank) = start_envoy(&config)?;
        let req = Request::post_bytes("/v1/chat/completions", "application/json", body(40_000))
            .chunked(8 * 1024);
        let resp = HttpClient::new().send(envoy.listen_addr(), req).await?;
        assert!(
            envoy.wait_for_log("floor local: log", Duration::from_secs(5)),
            "no on_log line: {}",
            tether_e2e::envoy::tail(&envoy.log(), 20)
        );
        let header = |n: &str| resp.header(n).map(str::to_owned);
        let in_envoy = LocalSeen {
            status: resp.status,
            seen: header("x-floor-response-seen"),
            content_type: header("content-type"),
            content_length: header("content-length"),
            body: resp.body.to_vec(),
            logs: floor_local_lines(envoy.log().lines()),
        };

        let mut vm = harness(&config)?;
        let out = vm.run(&tether_wasm_host::Request {
            body_chunks: tether_wasm_host::Request::chunked(&body(40_000), 8 * 1024),
            ..tether_wasm_host::Request::post(
                "/v1/chat/completions",
                &[("content-type", "application/json")],
                &[],
            )
        })?;
        let down = out
            .downstream
            .clone()
            .ok_or_else(|| anyhow::anyhow!("harness gave no response: {out:?}"))?;
        assert!(
            down.local,
            "{config}: the harness did not mark the reply local"
        );
        let get = |n: &str| down.headers.get_str(n).map(str::to_owned);
        // An empty body gets its `content-length: 0` from the HTTP/1 codec,
        // after every filter: not part of what the module or the harness sees.
        let content_length = get("content-length").or_else(|| {
            down.body
                .is_empty()
                .then(|| in_envoy.content_length.clone())
                .flatten()
        });
        let in_harness = LocalSeen {
            status: get(":status").and_then(|s| s.parse().ok()).unwrap_or(0),
            seen: get("x-floor-response-seen"),
            content_type: get("content-type"),
            content_length,
            body: down.body.clone(),
            logs: floor_local_lines(out.logs.iter().map(|l| l.message.as_str())),
        };
        assert_eq!(in_harness, in_envoy, "{config}: harness vs Envoy");
        assert_eq!(in_envoy.status, 418);
        assert!(
            in_envoy
                .seen
                .as_deref()
                .is_some_and(|s| s.starts_with("status=418;")),
            "{config}: the response-header callback did not run on the local reply"
        );
    }
    Ok(())
}
