//! The floor filter (a real proxy-wasm Rust SDK guest) through the host: its
//! contract, and the Envoy rules it makes observable (probe and pause modes).

use crate::common::{floor_plugin, options};
use tether_wasm_host::{Action, HostError, HostOptions, Request};

const DST_KEY: &str = "envoy.network.transport_socket.original_dst_address";

#[test]
fn header_mode_sets_x_floor_and_passes_the_body() {
    let mut vm = floor_plugin()
        .start(options(r#"{"mode":"header"}"#))
        .unwrap();
    let out = vm
        .run(&Request::post(
            "/v1/chat/completions",
            &[("x-a", "b")],
            &[b"ab", b"cd"],
        ))
        .unwrap();
    assert_eq!(out.upstream_header("x-floor"), Some("1"));
    assert_eq!(out.upstream_header("x-a"), Some("b"));
    assert_eq!(out.upstream.as_ref().unwrap().body, b"abcd");
    assert!(out.filter_state.is_empty());
    assert_eq!(
        out.downstream.unwrap().headers.get_str(":status"),
        Some("200")
    );
}

#[test]
fn body_mode_buffers_then_sets_original_dst_filter_state() {
    let mut vm = floor_plugin()
        .start(options(r#"{"mode":"body","dst":"127.0.0.1:9001"}"#))
        .unwrap();
    let out = vm
        .run(&Request::post(
            "/v1/chat/completions",
            &[],
            &[b"aaa", b"bb", b"c"],
        ))
        .unwrap();
    let bodies: Vec<_> = out
        .callbacks
        .iter()
        .filter(|c| c.callback == "proxy_on_request_body")
        .map(|c| (c.size, c.end_of_stream, c.action))
        .collect();
    // Pause while !eos: each callback sees everything buffered so far.
    assert_eq!(
        bodies,
        vec![
            (3, false, Action::Pause),
            (5, false, Action::Pause),
            (6, true, Action::Continue)
        ]
    );
    assert_eq!(out.upstream.as_ref().unwrap().body, b"aaabbc");
    assert_eq!(out.filter_state.len(), 1);
    assert_eq!(out.filter_state[0].path, DST_KEY);
    assert_eq!(out.filter_state[0].value, "127.0.0.1:9001");
    assert_eq!(out.filter_state[0].span, 0);
    assert_eq!(out.upstream_header("x-floor"), None);
}

#[test]
fn body_state_mode_hands_the_key_to_tethers_filter_state_channel() {
    let mut vm = floor_plugin()
        .start(options(r#"{"mode":"body-state","key":"k1"}"#))
        .unwrap();
    let out = vm
        .run(&Request::post(
            "/v1/chat/completions",
            &[],
            &[b"aaa", b"bb"],
        ))
        .unwrap();
    // The same channel tether's body path uses: header_mutation copies
    // wasm.tether.x-tether-key into x-tether-key.
    assert_eq!(
        out.filter_state_value("wasm.tether.x-tether-key"),
        Some("k1")
    );
    assert_eq!(out.upstream.as_ref().unwrap().body, b"aaabb");
    assert_eq!(out.upstream_header("x-floor"), None);
}

#[test]
fn body_mode_without_body_sets_nothing() {
    let mut vm = floor_plugin()
        .start(options(r#"{"mode":"body","dst":"127.0.0.1:9001"}"#))
        .unwrap();
    let out = vm.run(&Request::post("/", &[], &[])).unwrap();
    assert!(out.filter_state.is_empty());
    assert!(out.stalled.is_none());
}

#[test]
fn filter_state_key_without_object_factory_is_refused() {
    let opts = HostOptions {
        accepted_filter_state_keys: vec!["envoy.string".into()],
        ..options(r#"{"mode":"body","dst":"127.0.0.1:9001"}"#)
    };
    let mut vm = floor_plugin().start(opts).unwrap();
    let out = vm.run(&Request::post("/", &[], &[b"x"])).unwrap();
    assert!(out.filter_state.is_empty());
    assert_eq!(out.foreign_calls.len(), 1);
    assert_eq!(
        out.foreign_calls[0].status,
        tether_wasm_host::Status::NotFound
    );
    assert!(
        out.logs
            .iter()
            .any(|l| l.message.contains("set_envoy_filter_state failed")),
        "{:?}",
        out.logs
    );
}

#[test]
fn probe_mode_sees_request_headers_gone_after_continue() {
    let mut vm = floor_plugin()
        .start(options(r#"{"mode":"probe"}"#))
        .unwrap();
    let out = vm
        .run(&Request::post("/p", &[], &[b"0123", b"456789"]))
        .unwrap();
    let down = out.downstream.clone().unwrap();
    assert_eq!(
        down.headers.get_str("x-floor-get-status"),
        Some("2"),
        "read → BadArgument"
    );
    assert_eq!(
        down.headers.get_str("x-floor-set-status"),
        Some("2"),
        "replace → BadArgument"
    );
    assert_eq!(down.headers.get_str("x-floor-body-size"), Some("10"));
    assert_eq!(down.headers.get_str("x-floor-body-calls"), Some("2"));
    assert_eq!(out.upstream_header("x-floor-probe"), None);
}

#[test]
fn pause_in_header_callback_stops_body_delivery() {
    let mut vm = floor_plugin()
        .start(options(r#"{"mode":"pause"}"#))
        .unwrap();
    let out = vm.run(&Request::post("/p", &[], &[b"body"])).unwrap();
    assert!(out.upstream.is_none());
    assert!(out.local_response.is_none(), "body callback must not run");
    assert!(
        out.callbacks
            .iter()
            .all(|c| c.callback != "proxy_on_request_body")
    );
    assert!(out.stalled.unwrap().contains("request headers paused"));
}

/// A local reply runs the module's response callbacks (Envoy's behaviour,
/// conformance-tested in tests/e2e/tests/host_conformance.rs): the header
/// callback sees the reply's headers and details, the body callback rewrites
/// the body, and no request callback runs after a reply sent from the headers.
#[test]
fn local_reply_runs_the_response_callbacks() {
    for at in ["headers", "body"] {
        let config = format!(r#"{{"mode":"local","at":"{at}","details":"no entry"}}"#);
        let mut vm = floor_plugin().start(options(&config)).unwrap();
        let out = vm
            .run(&Request::post("/l", &[], &[b"abc", b"def"]))
            .unwrap();
        let down = out.downstream.expect("a reply");
        assert!(down.local, "{at}");
        assert_eq!(down.body, b"LOCAL REPLY", "{at}: body callback ran");
        assert_eq!(
            down.headers.get_str("x-floor-response-seen"),
            Some(
                "status=418;details=no_entry;local=1;names=:status,content-length,content-type,x-floor-local"
            ),
            "{at}"
        );
        assert_eq!(down.headers.get_str("content-length"), Some("11"));
        assert_eq!(down.headers.get_str("content-type"), Some("text/plain"));
        let body_calls = out
            .callbacks
            .iter()
            .filter(|c| c.callback == "proxy_on_request_body")
            .count();
        assert_eq!(body_calls, if at == "headers" { 0 } else { 2 }, "{at}");
        assert!(
            out.logs
                .iter()
                .any(|l| l.message == "floor local: log code=418 details=no_entry"),
            "{at}: {:?}",
            out.logs
        );
        assert_eq!(out.local_response.map(|l| l.status), Some(418));
    }
}

#[test]
fn invalid_configurations_name_the_field() {
    for (config, needle) in [
        ("not json", "not JSON"),
        (r#"{}"#, "`mode`"),
        (r#"{"mode":"fast"}"#, "`mode`"),
        (r#"{"mode":"body"}"#, "`dst`"),
        (r#"{"mode":"body","dst":"localhost"}"#, "`dst`"),
        (r#"{"mode":"body-state"}"#, "`key`"),
        (r#"{"mode":"body-state","key":""}"#, "`key`"),
        (r#"{"mode":"local"}"#, "`at`"),
        (
            r#"{"mode":"local","at":"headers","headers":{"a":"b"}}"#,
            "`headers`",
        ),
    ] {
        let err = floor_plugin().start(options(config)).unwrap_err();
        assert!(
            matches!(err, HostError::ConfigureRejected { .. }),
            "{config}: {err}"
        );
        assert!(err.to_string().contains(needle), "{config}: {err}");
    }
}

#[test]
fn vm_instances_are_independent() {
    let mut a = floor_plugin()
        .start(options(r#"{"mode":"header"}"#))
        .unwrap();
    let mut b = floor_plugin()
        .start(options(r#"{"mode":"body","dst":"10.0.0.1:1"}"#))
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            a.run(&Request::post("/", &[], &[b"x"]))
                .unwrap()
                .upstream_header("x-floor"),
            Some("1")
        );
        assert_eq!(
            b.run(&Request::post("/", &[], &[b"x"]))
                .unwrap()
                .filter_state
                .len(),
            1
        );
    }
    assert_eq!(b.state().filter_state.len(), 3);
    assert!(a.state().filter_state.is_empty());
}
