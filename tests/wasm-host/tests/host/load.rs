//! Load-aware pick in the harness: the root context's tick polls every
//! endpoint's `/load` with `dispatch_http_call`, the replies land in shared
//! data, a key spills off a primary reported over the bound and comes back
//! once the view ages out; bad replies are counted and never kill the VM.

use crate::common::options;
use crate::tether::{plugin, send};
use serde_json::{Value, json};
use tether_wasm_host::{FilterVm, HeaderMap, HttpCallResponse, Outcome};

pub(crate) const A: &str = "10.0.0.1:8000";
pub(crate) const B: &str = "10.0.0.2:8000";

/// Pick mode over A and B with `load` polling every 100 ms, plus `extra` members.
pub(crate) fn vm_with(extra: Value) -> FilterVm {
    let mut cfg = json!({
        "mode": "pick",
        "endpoints": [{"address": A}, {"address": B}],
        "load": {"poll_ms": 100, "max_age_ms": 1000, "factor": 1.5, "floor": 2},
    });
    if let (Some(c), Value::Object(e)) = (cfg.as_object_mut(), extra) {
        c.extend(e);
    }
    plugin().start(options(&cfg.to_string())).expect("starts")
}

fn vm() -> FilterVm {
    vm_with(json!({}))
}

/// The `hot` session's next request.
pub(crate) fn send_hot(vm: &mut FilterVm) -> Outcome {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    send(
        vm,
        "/v1/chat/completions",
        &[("x-session-id", "hot")],
        &body,
    )
}

fn primary(vm: &mut FilterVm) -> String {
    let out = send_hot(vm);
    let dest = out
        .upstream_header("x-gateway-destination-endpoint")
        .expect("picked");
    dest.split(',').next().unwrap().to_owned()
}

/// An idle-but-for-`server_load` `/load` reply with `extra` members.
pub(crate) fn report_with(server_load: u64, extra: Value) -> HttpCallResponse {
    let mut body = json!({"server_load": server_load, "sim_ms": 1.0, "speedup": 1.0,
        "ranks": [{"dp_rank": 0, "running": server_load, "waiting": 0, "restoring": 0,
                   "queued_prefill_tokens": 0, "kv_usage": 0.0, "kv_blocks": 10, "retentions": 0}]});
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    HttpCallResponse {
        headers: HeaderMap::from_pairs([(":status", "200")]),
        body: body.to_string().into_bytes(),
        ..HttpCallResponse::default()
    }
}

fn report(server_load: u64) -> HttpCallResponse {
    report_with(server_load, json!({}))
}

/// Ticks once and answers every poll still outstanding with
/// `answer(endpoint)`: this tick's, and those an earlier tick sent that no one
/// answered (a tick that only read a counter). An endpoint with a poll
/// outstanding is not polled again until it is answered or timed out.
pub(crate) fn poll(vm: &mut FilterVm, answer: impl Fn(&str) -> HttpCallResponse) -> usize {
    vm.tick().unwrap();
    let calls: Vec<(u32, String, String)> = vm
        .outstanding_http_calls()
        .iter()
        .map(|c| {
            let h = |n: &str| c.headers.get_str(n).unwrap_or_default().to_owned();
            assert_eq!(c.upstream, "ranks");
            assert_eq!(h(":path"), "/load");
            (c.token, h("x-gateway-destination-endpoint"), h(":method"))
        })
        .collect();
    for (token, to, method) in &calls {
        assert_eq!(method, "GET");
        vm.respond_http_call(*token, answer(to)).unwrap();
    }
    calls.len()
}

pub(crate) fn metric(vm: &mut FilterVm, name: &str) -> u64 {
    vm.tick().unwrap();
    vm.state().metric(name).unwrap_or(0)
}

#[test]
fn a_primary_reported_over_the_bound_spills_its_keys_until_the_view_ages() {
    let mut vm = vm();
    let home = primary(&mut vm);
    let other = if home == A { B } else { A };
    assert_eq!(
        metric(&mut vm, "tether_load_blind"),
        1,
        "no poll answered yet"
    );
    // Both endpoints are polled on a tick, each steered by override_host.
    assert_eq!(poll(&mut vm, |_| report(0)), 2);
    assert_eq!(primary(&mut vm), home, "idle: stays home");
    assert_eq!(metric(&mut vm, "tether_load_blind"), 1, "a fresh view");
    // Home reports 40 in flight: over max(⌈1.5 × 41 / 2⌉, 2) = 31.
    let hot = home.clone();
    poll(&mut vm, move |to| report(if to == hot { 40 } else { 0 }));
    assert_eq!(primary(&mut vm), other, "spilled to the next choice");
    assert!(metric(&mut vm, "tether_load_spilled") >= 1);
    assert!(metric(&mut vm, "tether_load_poll_ok") >= 4);
    // No poll answers for longer than max_age_ms: the view is stale, home again.
    vm.advance_clock_ms(2000);
    let before = vm.state().http_calls.len();
    vm.tick().unwrap();
    assert!(vm.state().http_calls.len() > before, "polls go on");
    assert_eq!(primary(&mut vm), home);
    assert_eq!(
        metric(&mut vm, "tether_load_blind"),
        2,
        "placed with no view"
    );
}

#[test]
fn bad_load_replies_are_counted_and_never_kill_the_vm() {
    let mut vm = vm();
    let home = primary(&mut vm);
    let bad = [
        HttpCallResponse::default(), // no status: a failed call
        HttpCallResponse {
            headers: HeaderMap::from_pairs([(":status", "503")]),
            body: b"upstream connect error".to_vec(),
            ..HttpCallResponse::default()
        },
        HttpCallResponse {
            headers: HeaderMap::from_pairs([(":status", "200")]),
            body: b"{\"server_load\": \"many\"}".to_vec(),
            ..HttpCallResponse::default()
        },
        HttpCallResponse {
            headers: HeaderMap::from_pairs([(":status", "200")]),
            body: vec![b'['; 300 * 1024],
            ..HttpCallResponse::default()
        },
    ];
    let mut n = 0;
    for r in bad {
        vm.advance_clock_ms(100);
        n += poll(&mut vm, |_| r.clone());
    }
    assert!(!vm.failed(), "{:?}", vm.state().logs);
    assert_eq!(metric(&mut vm, "tether_load_poll_bad"), n as u64);
    assert_eq!(metric(&mut vm, "tether_load_poll_ok"), 0);
    assert_eq!(primary(&mut vm), home, "no view, no spill");
    assert_eq!(metric(&mut vm, "tether_load_blind"), 2, "both decisions");
    // A reply to a token nobody asked for is ignored.
    let _ = vm.respond_http_call(9999, report(1));
    assert!(!vm.failed());
}

/// The destinations and tokens of the polls one tick sends.
fn tick_polls(vm: &mut FilterVm) -> Vec<(String, u32)> {
    let before = vm.state().http_calls.len();
    vm.tick().unwrap();
    vm.state().http_calls[before..]
        .iter()
        .map(|c| {
            let to = c.headers.get_str("x-gateway-destination-endpoint");
            (to.unwrap_or_default().to_owned(), c.token)
        })
        .collect()
}

#[test]
fn a_reply_slower_than_the_poll_period_is_read_and_its_endpoint_not_polled_again_meanwhile() {
    let mut vm = vm();
    let home = primary(&mut vm);
    let other = if home == A { B } else { A };
    poll(&mut vm, |_| report(0));
    // Home is slow: this tick's poll of it is not answered before the next
    // tick (100 ms, the period; the timeout is 200 ms).
    let first = tick_polls(&mut vm);
    assert_eq!(first.len(), 2);
    let mut slow = None;
    for (to, token) in first {
        if to == home {
            slow = Some(token);
        } else {
            vm.respond_http_call(token, report(0)).unwrap();
        }
    }
    let slow = slow.expect("home polled");
    // The next period polls only the endpoint with no poll outstanding.
    let second = tick_polls(&mut vm);
    assert_eq!(
        second.iter().map(|(to, _)| to.as_str()).collect::<Vec<_>>(),
        [other]
    );
    for (_, token) in second {
        vm.respond_http_call(token, report(0)).unwrap();
    }
    // Home's late reply (two periods after it was sent) is read: it is hot.
    vm.respond_http_call(slow, report(40)).unwrap();
    assert_eq!(primary(&mut vm), other, "the slow reply's load counts");
    // Answered, home is polled again on the next period.
    let third = tick_polls(&mut vm);
    assert!(third.iter().any(|(to, _)| *to == home), "{third:?}");
    assert!(!vm.failed());
}

#[test]
fn a_primary_whose_polls_stop_answering_keeps_its_last_report_and_is_counted() {
    let mut vm = vm();
    let home = primary(&mut vm);
    let other = if home == A { B } else { A };
    let hot = home.clone();
    poll(&mut vm, move |to| report(if to == hot { 40 } else { 0 }));
    assert_eq!(primary(&mut vm), other, "spilled");
    // Home's polls now fail (a timed-out call comes back with no headers)
    // for longer than max_age_ms while the other endpoint answers: home's
    // last report holds — the rank too busy to answer is not read as idle.
    let hot = home.clone();
    for _ in 0..15 {
        poll(&mut vm, |to| {
            if to == hot {
                HttpCallResponse::default()
            } else {
                report(0)
            }
        });
    }
    assert_eq!(primary(&mut vm), other, "held, not idle");
    assert!(metric(&mut vm, "tether_load_held") >= 1);
    assert!(metric(&mut vm, "tether_load_poll_bad") >= 15);
    // Home answers again, idle: the key is home.
    assert_eq!(poll(&mut vm, |_| report(0)), 2);
    assert_eq!(primary(&mut vm), home);
    assert!(!vm.failed());
}
