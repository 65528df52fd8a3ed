//! Residency-aware placement in the harness: summaries polled with `/load`
//! travel through shared data into the VM's view, a key goes where its state
//! is and migrates off an overloaded holder with the holder as its
//! prefiller; malformed, unsorted, unknown-version and oversized summaries
//! are counted and logged, never a VM failure.

use crate::common::options;
use crate::tether::{plugin, send};
use serde_json::{Value, json};
use tether_placement::keys::{session_hash, subagent_hash, tenant_hash};
use tether_placement::residency::Summary;
use tether_placement::{Held, Resident, resident_key};
use tether_wasm_host::{FilterVm, HeaderMap, HttpCallResponse};

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

fn vm() -> FilterVm {
    let cfg = json!({
        "mode": "pick",
        "endpoints": [{"address": A}, {"address": B}],
        "load": {"poll_ms": 100, "max_age_ms": 1000, "factor": 1.5, "floor": 2},
        "residency": {"candidates": 2},
    });
    plugin().start(options(&cfg.to_string())).expect("starts")
}

/// The key of `x-session-id: hot` (no tenant header, main agent).
fn hot_key() -> u64 {
    resident_key(
        u128::from(tenant_hash(b"")),
        u128::from(session_hash(b"", b"hot")),
        u128::from(subagent_hash(b"", None)),
    )
}

/// (destination, prefiller) of the session's next request.
fn place(vm: &mut FilterVm) -> (String, Option<String>) {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let out = send(
        vm,
        "/v1/chat/completions",
        &[("x-session-id", "hot")],
        &body,
    );
    let dest = out
        .upstream_header("x-gateway-destination-endpoint")
        .expect("picked");
    (
        dest.split(',').next().unwrap().to_owned(),
        out.upstream_header("x-prefiller-host-port")
            .map(str::to_owned),
    )
}

fn report(server_load: u64, residency: Value) -> HttpCallResponse {
    HttpCallResponse {
        headers: HeaderMap::from_pairs([(":status", "200")]),
        body: json!({"server_load": server_load, "sim_ms": 1.0, "speedup": 1.0,
            "ranks": [{"dp_rank": 0, "running": server_load, "waiting": 0, "restoring": 0,
                       "queued_prefill_tokens": 0, "kv_usage": 0.0, "kv_blocks": 10, "retentions": 0}],
            "residency": residency})
        .to_string()
        .into_bytes(),
        ..HttpCallResponse::default()
    }
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

/// Ticks once and answers this tick's polls with `answer(endpoint)`.
fn poll(vm: &mut FilterVm, answer: impl Fn(&str) -> HttpCallResponse) -> usize {
    let before = vm.state().http_calls.len();
    vm.tick().unwrap();
    let calls: Vec<(u32, String)> = vm.state().http_calls[before..]
        .iter()
        .map(|c| {
            let to = c.headers.get_str("x-gateway-destination-endpoint");
            (c.token, to.unwrap_or_default().to_owned())
        })
        .collect();
    for (token, to) in &calls {
        vm.respond_http_call(*token, answer(to)).unwrap();
    }
    calls.len()
}

fn metric(vm: &mut FilterVm, name: &str) -> u64 {
    vm.tick().unwrap();
    vm.state().metric(name).unwrap_or(0)
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
    let holder = other.clone();
    poll(&mut vm, move |to| {
        if to == holder {
            report(40, holding(&[hot_key()]))
        } else {
            report(0, holding(&[]))
        }
    });
    assert_eq!(place(&mut vm), (home.clone(), Some(other.clone())));
    assert_eq!(metric(&mut vm, "tether_residency_migrate"), 1);
    // The summaries age out: unknown residency, the bounded pick, no prefiller.
    vm.advance_clock_ms(2000);
    let (_, prefiller) = place(&mut vm);
    assert_eq!(prefiller, None);
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
