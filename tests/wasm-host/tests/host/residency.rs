//! Residency-aware placement in the harness: summaries polled with `/load`
//! travel through shared data into the VM's view, a key goes where its state
//! is and migrates off an overloaded holder, told to pull from the holder
//! (`x-tether-pull-from`, on the header path and as filter state plus the
//! body's `kv_transfer_params.tether.pull_from` on the body path) or, with
//! `migrate: "leg"`, with the holder as its prefiller; malformed, unsorted,
//! unknown-version and oversized summaries are counted and logged, never a VM
//! failure.

use crate::load::{A, B, metric, poll, report_with, send_hot, vm_with};
use serde_json::{Value, json};
use tether_placement::keys::{session_hash, subagent_hash, tenant_hash};
use tether_placement::residency::Summary;
use tether_placement::{Held, Resident, resident_key};
use tether_wasm_host::{FilterVm, HttpCallResponse};

fn vm() -> FilterVm {
    vm_with(json!({"residency": {"candidates": 2}}))
}

/// The key of `x-session-id: hot` (no tenant header, main agent).
fn hot_key() -> u64 {
    resident_key(
        u128::from(tenant_hash(b"")),
        u128::from(session_hash(b"", b"hot")),
        u128::from(subagent_hash(b"", None)),
    )
}

/// (destination, the holder named: `x-tether-pull-from`, or with
/// `migrate: "leg"` `x-prefiller-host-port`) of the session's next request on
/// the header path; a request never carries both.
fn place(vm: &mut FilterVm) -> (String, Option<String>) {
    let out = send_hot(vm);
    let dest = out
        .upstream_header("x-gateway-destination-endpoint")
        .expect("picked");
    let pull = out.upstream_header("x-tether-pull-from");
    let leg = out.upstream_header("x-prefiller-host-port");
    assert!(pull.is_none() || leg.is_none(), "{pull:?} and {leg:?}");
    (
        dest.split(',').next().unwrap().to_owned(),
        pull.or(leg).map(str::to_owned),
    )
}

/// Polls once: `hot` reports `load` requests in flight and holds the session,
/// the other endpoint is idle and holds nothing.
fn hold_hot(vm: &mut FilterVm, hot: &str, load: u64) {
    let holder = hot.to_owned();
    poll(vm, move |to| {
        if to == holder {
            report(load, holding(&[hot_key()]))
        } else {
            report(0, holding(&[]))
        }
    });
}

fn report(server_load: u64, residency: Value) -> HttpCallResponse {
    report_with(server_load, json!({ "residency": residency }))
}

fn holding(keys: &[u64]) -> Value {
    let held = keys.iter().map(|&k| {
        (
            k,
            Held {
                tokens: 8000,
                device: true,
            },
        )
    });
    serde_json::to_value(Resident::from_entries(held, usize::MAX).0.encode(0)).unwrap()
}

#[test]
fn a_key_follows_its_state_and_migrates_off_an_overloaded_holder() {
    let mut vm = vm();
    let (home, _) = place(&mut vm);
    let other = if home == A { B } else { A }.to_owned();
    // The other candidate holds the session: the key goes there, no prefiller.
    let holder = other.clone();
    poll(&mut vm, move |to| {
        report(
            0,
            if to == holder {
                holding(&[hot_key()])
            } else {
                holding(&[])
            },
        )
    });
    assert_eq!(place(&mut vm), (other.clone(), None));
    assert_eq!(metric(&mut vm, "tether_residency_stay"), 1);
    // The holder is over the bound: the key moves home and pulls its state.
    vm.advance_clock_ms(100);
    hold_hot(&mut vm, &other, 40);
    let out = send_hot(&mut vm);
    assert_eq!(
        out.upstream_header("x-tether-pull-from"),
        Some(other.as_str())
    );
    assert_eq!(out.upstream_header("x-prefiller-host-port"), None);
    assert_eq!(place(&mut vm), (home.clone(), Some(other.clone())));
    assert_eq!(metric(&mut vm, "tether_residency_migrate"), 2);
    // The summaries age out: unknown residency, the bounded pick, no prefiller.
    vm.advance_clock_ms(2000);
    let (_, prefiller) = place(&mut vm);
    assert_eq!(prefiller, None);
    assert!(!vm.failed(), "{:?}", vm.state().logs);
}

/// `migrate: "leg"`: the same move names the holder as the prefiller instead.
#[test]
fn a_leg_migration_names_the_holder_as_the_prefiller() {
    let mut vm = vm_with(json!({"residency": {"candidates": 2, "migrate": "leg"}}));
    let (home, _) = place(&mut vm);
    let other = if home == A { B } else { A }.to_owned();
    hold_hot(&mut vm, &other, 40);
    let out = send_hot(&mut vm);
    assert_eq!(
        out.upstream_header("x-prefiller-host-port"),
        Some(other.as_str())
    );
    assert_eq!(out.upstream_header("x-tether-pull-from"), None);
    assert_eq!(metric(&mut vm, "tether_residency_migrate"), 1);
}

/// `over_bound: "keep-up"`: a holder over the bound with no prefill queued
/// keeps the key (no pull); once its `/load` reports a long prefill queue the
/// key moves and pulls its state, as with the default — unless the holder
/// reports a prefill rate at which that queue is short.
#[test]
fn keep_up_keeps_a_hot_holder_until_its_prefill_queue_grows() {
    let mut vm = vm_with(json!({"residency": {"candidates": 2, "over_bound": "keep-up"}}));
    let (home, _) = place(&mut vm);
    let other = if home == A { B } else { A }.to_owned();
    hold_hot(&mut vm, &other, 40);
    assert_eq!(place(&mut vm), (other.clone(), None));
    assert_eq!(metric(&mut vm, "tether_residency_stay"), 1);
    assert_eq!(metric(&mut vm, "tether_residency_migrate"), 0);
    // 100 K prompt tokens queued on the holder, which reports `rate` tokens/s
    // (0: no rate, read at the default 20 K tokens/s: 5 s).
    let queued = |vm: &mut FilterVm, rate: f64| {
        vm.advance_clock_ms(100);
        let holder = other.clone();
        poll(vm, move |to| {
            if to == holder {
                let ranks = json!([{"dp_rank": 0, "running": 40, "waiting": 0, "restoring": 0,
                    "queued_prefill_tokens": 100_000, "kv_usage": 0.0, "kv_blocks": 10,
                    "retentions": 0, "prefill_tokens_per_s": rate}]);
                report_with(
                    40,
                    json!({"ranks": ranks, "residency": holding(&[hot_key()])}),
                )
            } else {
                report(0, holding(&[]))
            }
        });
    };
    queued(&mut vm, 0.0);
    assert_eq!(place(&mut vm), (home.clone(), Some(other.clone())));
    assert_eq!(metric(&mut vm, "tether_residency_migrate"), 1);
    // The same queue on a holder that reports prefilling 10 M tokens/s (10 ms):
    // its own rate says it keeps up, so it keeps the key.
    queued(&mut vm, 10_000_000.0);
    assert_eq!(place(&mut vm), (other.clone(), None));
    assert_eq!(metric(&mut vm, "tether_residency_migrate"), 1);
    assert!(!vm.failed(), "{:?}", vm.state().logs);
}

/// Busy share: with no request in flight anywhere and no holder, a key goes
/// to the candidate whose `/load` reports it least busy lately (`busy`, per DP
/// rank), not to its first rendezvous candidate; with as busy candidates it
/// stays on the first.
#[test]
fn a_tie_in_flight_goes_to_the_less_busy_candidate() {
    let mut vm = vm();
    let (home, _) = place(&mut vm);
    let other = if home == A { B } else { A }.to_owned();
    let busy_report = |busy: f64| {
        let ranks = json!([{"dp_rank": 0, "running": 0, "waiting": 0, "restoring": 0,
            "queued_prefill_tokens": 0, "kv_usage": 0.0, "kv_blocks": 10,
            "retentions": 0, "busy": busy}]);
        report_with(0, json!({"ranks": ranks, "residency": holding(&[])}))
    };
    for (home_busy, want) in [(0.2, home.clone()), (0.9, other.clone())] {
        vm.advance_clock_ms(100);
        let h = home.clone();
        poll(&mut vm, move |to| {
            busy_report(if to == h { home_busy } else { 0.2 })
        });
        assert_eq!(place(&mut vm), (want, None), "home busy {home_busy}");
    }
    assert_eq!(metric(&mut vm, "tether_residency_least"), 2);
    assert!(!vm.failed(), "{:?}", vm.state().logs);
}

/// One body-path request of the `hot` session: (primary from filter state,
/// `x-tether-pull-from` from filter state, the upstream body's
/// `kv_transfer_params.tether.pull_from`).
fn place_body(vm: &mut FilterVm, body: &Value) -> (String, Option<String>, Value) {
    let out = crate::tether::send(vm, "/v1/chat/completions", &[("x-session-id", "hot")], body);
    let state = |h: &str| out.filter_state_value(&format!("wasm.tether.{h}"));
    let dest = state("x-gateway-destination-endpoint").expect("picked");
    let up = out.upstream.clone().expect("released upstream");
    let sent: Value = serde_json::from_slice(&up.body).expect("JSON");
    (
        dest.split(',').next().unwrap().to_owned(),
        state("x-tether-pull-from").map(str::to_owned),
        sent["kv_transfer_params"]["tether"]["pull_from"].clone(),
    )
}

/// The body path hands the holder over as filter state (a `header_mutation`
/// entry copies it, as every body-path output) and, with the `vllm` outputs,
/// in the body's markers; a client's own `pull_from` never survives.
#[test]
fn the_body_path_names_the_holder_in_filter_state_and_in_the_markers() {
    let mut vm = vm_with(json!({"residency": {"candidates": 2},
                                "header_fast_path": false, "outputs": ["pick", "vllm"]}));
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                      "kv_transfer_params": {"tether": {"pull_from": "6.6.6.6:80"}}});
    let (home, pull, marker) = place_body(&mut vm, &body);
    assert_eq!(
        (pull, marker),
        (None, Value::Null),
        "the client's is dropped"
    );
    let other = if home == A { B } else { A }.to_owned();
    hold_hot(&mut vm, &other, 40);
    let (dest, pull, marker) = place_body(&mut vm, &body);
    assert_eq!(
        (dest, pull, marker),
        (home, Some(other.clone()), json!(other))
    );
    // Idle again: the key stays with its state, and names no holder anywhere.
    vm.advance_clock_ms(100);
    hold_hot(&mut vm, &other, 0);
    let (dest, pull, marker) = place_body(&mut vm, &body);
    assert_eq!((dest, pull, marker), (other, None, Value::Null));
    assert!(!vm.failed(), "{:?}", vm.state().logs);
}

#[test]
fn bad_summaries_are_counted_logged_and_never_kill_the_vm() {
    let mut vm = vm();
    let good = holding(&[1, 2]);
    let mut unsorted = good.clone();
    let k = unsorted["keys"].as_str().unwrap().to_owned();
    unsorted["keys"] = json!(format!("{}{}", &k[16..], &k[..16]));
    let mut version = good.clone();
    version["version"] = json!(2);
    let mut shape = good.clone();
    shape["tokens"] = json!("zz");
    let n = tether_placement::residency::MAX_ENTRIES + 1;
    let too_many = serde_json::to_value(Summary {
        version: 1,
        keys: "0".repeat(16 * n),
        tokens: "0".repeat(8 * n),
        tiers: "1".repeat(n),
        omitted: 0,
    })
    .unwrap();
    for (bad, counter) in [
        (unsorted, "tether_residency_bad_unsorted"),
        (version, "tether_residency_bad_version"),
        (shape, "tether_residency_bad_shape"),
        (too_many, "tether_residency_bad_too_many"),
    ] {
        vm.advance_clock_ms(100);
        let b = bad.clone();
        assert_eq!(poll(&mut vm, move |_| report(0, b.clone())), 2);
        assert_eq!(metric(&mut vm, counter), 2, "{counter}");
        // The load sample still counts; residency is unknown: the bounded pick.
        place(&mut vm);
    }
    assert!(!vm.failed(), "{:?}", vm.state().logs);
    assert!(metric(&mut vm, "tether_residency_bounded") >= 4);
    assert_eq!(metric(&mut vm, "tether_load_poll_ok"), 8);
    assert!(
        vm.state()
            .logs
            .iter()
            .any(|l| l.message.contains("residency of") && l.message.contains("not used")),
        "a bad summary is logged"
    );
}
