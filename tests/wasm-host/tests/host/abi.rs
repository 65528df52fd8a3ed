//! ABI-level behaviour with a hand-written WAT guest: traps, budgets, shared
//! data, queues, metrics, ticks, HTTP calls, local responses, WASI.

use crate::common::{abi_plugin, options};
use tether_wasm_host::{HostError, HostOptions, HttpCallResponse, LogLevel, Request, Status};

fn req(marker: &str) -> Request {
    Request::post("/x", &[(marker, "1")], &[b"body"])
}

#[test]
fn trap_reports_the_module_message_and_kills_the_vm() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let err = vm.run(&req("x-trap")).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, HostError::Trap { .. }), "{text}");
    assert!(text.contains("boom: guest said no"), "{text}");
    assert!(text.contains("proxy_on_request_headers"), "{text}");
    assert!(vm.failed());
    assert!(matches!(
        vm.run(&req("x-none")),
        Err(HostError::VmFailed { .. })
    ));
}

#[test]
fn fuel_budget_stops_a_spinning_module() {
    let mut vm = abi_plugin()
        .start(HostOptions {
            fuel_per_callback: Some(1_000_000),
            ..HostOptions::default()
        })
        .unwrap();
    let err = vm.run(&req("x-loop")).unwrap_err();
    assert!(
        matches!(
            err,
            HostError::OutOfFuel {
                budget: 1_000_000,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn proc_exit_is_an_error_not_a_crash() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let err = vm.run(&req("x-exit")).unwrap_err();
    assert!(matches!(err, HostError::Exit { code: 3, .. }), "{err}");
}

#[test]
fn rejected_configuration_carries_the_log() {
    let err = abi_plugin().start(options("!nope")).unwrap_err();
    assert!(matches!(err, HostError::ConfigureRejected { .. }), "{err}");
    assert!(err.to_string().contains("bad config"), "{err}");
    abi_plugin().start(options("fine")).unwrap();
}

#[test]
fn local_response_ends_the_request() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let out = vm.run(&req("x-local")).unwrap();
    let local = out.local_response.expect("local response");
    assert_eq!(
        (local.status, local.details.as_str(), local.body.as_slice()),
        (403, "denied", &b"nope"[..])
    );
    let down = out.downstream.unwrap();
    assert!(down.local);
    assert_eq!(down.headers.get_str(":status"), Some("403"));
    assert!(
        out.callbacks
            .iter()
            .all(|c| c.callback != "proxy_on_request_body")
    );
}

#[test]
fn scripted_http_call_response_resumes_the_paused_request() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let resp = HttpCallResponse {
        body: b"allowed".to_vec(),
        ..HttpCallResponse::default()
    };
    vm.script_http_response("auth", resp);
    let out = vm.run(&req("x-call")).unwrap();
    assert_eq!(out.http_calls.len(), 1);
    assert_eq!(out.http_calls[0].headers.get_str(":path"), Some("/check"));
    assert_eq!(out.http_calls[0].timeout_ms, 500);
    assert!(
        out.logs.iter().any(|l| l.message == "allowed"),
        "{:?}",
        out.logs
    );
    assert_eq!(out.stalled, None);
    assert_eq!(out.upstream.unwrap().body, b"body");
}

#[test]
fn unanswered_http_call_leaves_the_request_stalled() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let out = vm.run(&req("x-call")).unwrap();
    assert!(out.stalled.unwrap().contains("request headers paused"));
    assert!(out.upstream.is_none());
}

#[test]
fn shared_data_compare_and_swap() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let call = |vm: &mut tether_wasm_host::FilterVm, f: &'static str, args: (i32, i32)| {
        vm.invoke::<(i32, i32), i32>(f, 1, args).unwrap().unwrap()
    };
    assert_eq!(
        vm.invoke::<(), i32>("t_get_shared", 1, ()).unwrap(),
        Some(Status::NotFound.code())
    );
    assert_eq!(call(&mut vm, "t_shared", (0, 0)), 0);
    assert_eq!(
        vm.invoke::<(), i32>("t_get_shared", 1, ()).unwrap(),
        Some(0)
    );
    let cas = vm.read_guest_u32(56).unwrap();
    assert_ne!(cas, 0);
    // A stale CAS loses, the current one wins and bumps the CAS.
    assert_eq!(
        call(&mut vm, "t_shared", (cas as i32 + 7, 1)),
        Status::CasMismatch.code()
    );
    assert_eq!(call(&mut vm, "t_shared", (cas as i32, 1)), 0);
    assert_eq!(vm.state().shared_data["key"].0, b"val2");
    assert_ne!(vm.state().shared_data["key"].1, cas);
}

#[test]
fn shared_queue_notifies_after_the_call_and_dequeues_in_order() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    assert_eq!(vm.invoke::<(), i32>("t_enqueue", 1, ()).unwrap(), Some(0));
    assert!(
        !vm.state().logs.iter().any(|l| l.message == "queue ready"),
        "no re-entry during the host call"
    );
    vm.run_deferred().unwrap();
    assert!(vm.state().logs.iter().any(|l| l.message == "queue ready"));
    assert_eq!(vm.invoke::<(), i32>("t_dequeue", 1, ()).unwrap(), Some(0));
    let (ptr, len) = (
        vm.read_guest_u32(48).unwrap(),
        vm.read_guest_u32(52).unwrap(),
    );
    assert_eq!(vm.read_guest(ptr, len).unwrap(), b"val1");
    assert_eq!(
        vm.invoke::<(), i32>("t_dequeue", 1, ()).unwrap(),
        Some(Status::Empty.code())
    );
}

#[test]
fn metrics_define_increment_get() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    assert_eq!(vm.invoke::<(), i32>("t_metrics", 1, ()).unwrap(), Some(0));
    assert_eq!(vm.state().metric("hits"), Some(7));
    assert_eq!(
        u64::from_le_bytes(vm.read_guest(64, 8).unwrap().try_into().unwrap()),
        7
    );
    assert_eq!(
        vm.invoke::<(), i32>("t_bad_counter_decrement", 1, ())
            .unwrap(),
        Some(Status::BadArgument.code())
    );
}

#[test]
fn tick_period_drives_on_tick_and_the_clock() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    assert!(!vm.tick().unwrap(), "no period, no tick");
    vm.invoke::<i32, i32>("t_tick", 1, 250).unwrap();
    let before = vm.state().now_ns;
    assert!(vm.tick().unwrap());
    assert_eq!(vm.state().now_ns - before, 250_000_000);
    assert_eq!(
        vm.state()
            .logs
            .iter()
            .filter(|l| l.message == "tick")
            .count(),
        1
    );
}

#[test]
fn foreign_functions_are_recorded() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    assert_eq!(
        vm.invoke::<(), i32>("t_clear_route_cache", 1, ()).unwrap(),
        Some(0)
    );
    assert_eq!(
        vm.invoke::<(), i32>("t_unknown_foreign", 1, ()).unwrap(),
        Some(Status::NotFound.code())
    );
    assert_eq!(vm.state().route_cache_clears, 1);
    let names: Vec<_> = vm
        .state()
        .foreign_calls
        .iter()
        .map(|c| (c.name.as_str(), c.status))
        .collect();
    assert_eq!(
        names,
        vec![
            ("clear_route_cache", Status::Ok),
            ("clear", Status::NotFound)
        ]
    );
}

#[test]
fn wasi_stderr_becomes_an_error_log_and_unknown_imports_answer_unimplemented() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    assert_eq!(vm.invoke::<(), i32>("t_stderr", 1, ()).unwrap(), Some(0));
    let log = vm.state().logs.last().unwrap();
    assert_eq!(
        (log.source, log.level, log.message.as_str()),
        ("stderr", LogLevel::Error, "hello from stderr")
    );
    assert_eq!(
        vm.invoke::<(), i32>("t_unknown_import", 1, ()).unwrap(),
        Some(Status::Unimplemented.code())
    );
    assert!(
        vm.state()
            .logs
            .iter()
            .any(|l| l.message.contains("proxy_unknown_future_call"))
    );
}

#[test]
fn out_of_bounds_pointers_get_a_status_not_a_crash() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    assert_eq!(
        vm.invoke::<(), i32>("t_oob", 1, ()).unwrap(),
        Some(Status::InvalidMemoryAccess.code())
    );
    assert!(!vm.failed());
}

#[test]
fn properties_come_from_the_request() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let ctx = vm.create_http_context().unwrap();
    vm.state_mut()
        .streams
        .get_mut(&ctx)
        .unwrap()
        .properties
        .insert(
            vec!["source".into(), "address".into()],
            b"10.1.2.3:4444".to_vec(),
        );
    assert_eq!(
        vm.invoke::<(), i32>("t_property", ctx, ()).unwrap(),
        Some(0)
    );
    let (ptr, len) = (
        vm.read_guest_u32(48).unwrap(),
        vm.read_guest_u32(52).unwrap(),
    );
    assert_eq!(vm.read_guest(ptr, len).unwrap(), b"10.1.2.3:4444");
    assert_eq!(
        vm.invoke::<(), i32>("t_property", 1, ()).unwrap(),
        Some(Status::NotFound.code())
    );
}

#[test]
fn a_module_without_the_abi_export_is_refused() {
    let err = tether_wasm_host::Plugin::new(b"(module (memory (export \"memory\") 1))", false)
        .unwrap_err();
    assert!(matches!(err, HostError::NotProxyWasm(_)), "{err}");
}

#[test]
fn set_buffer_follows_envoy_prepend_replace_append_rules() {
    let mut vm = abi_plugin().start(HostOptions::default()).unwrap();
    let ctx = vm.create_http_context().unwrap();
    let set = |vm: &mut tether_wasm_host::FilterVm, start: i32, size: i32| {
        let stream = vm.state_mut().streams.get_mut(&ctx).unwrap();
        stream.request_body = b"abcdef".to_vec();
        stream.request_body_access = tether_wasm_host::state::Access::ReadWrite;
        let status = vm
            .invoke::<(i32, i32), i32>("t_set_body", ctx, (start, size))
            .unwrap()
            .unwrap();
        (
            status,
            String::from_utf8(vm.state().streams[&ctx].request_body.clone()).unwrap(),
        )
    };
    assert_eq!(
        set(&mut vm, 0, 0),
        (0, "val1abcdef".into()),
        "start 0, size 0: prepend"
    );
    assert_eq!(
        set(&mut vm, 0, 2),
        (0, "val1cdef".into()),
        "start 0: drain size, prepend"
    );
    assert_eq!(
        set(&mut vm, 0, 99),
        (0, "val1".into()),
        "start 0, size ≥ len: replace"
    );
    assert_eq!(
        set(&mut vm, 6, 0),
        (0, "abcdefval1".into()),
        "start at end: append"
    );
    assert_eq!(
        set(&mut vm, 3, 1),
        (Status::BadArgument.code(), "abcdef".into()),
        "middle: refused"
    );
}
