//! Load-aware and P/D placement end to end: each request goes through the
//! whole pipeline (read → place → emit) on a given view snapshot.

use super::*;
use crate::api::Api;
use crate::decide::{BodyCall, on_body};
use crate::emit::Plan;
use crate::emit::metrics::{Counter, Fixed};
use crate::place::load_view::Sample;
use serde_json::json;

const DECODE: [&str; 4] = [
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];
const PREFILL: [&str; 2] = ["10.0.1.1:8000", "10.0.1.2:8000"];

fn cfg(extra: serde_json::Value) -> Config {
    let mut c = json!({
        "mode": "pick",
        "header_fast_path": false,
        "endpoints": DECODE.map(|a| json!({"address": a, "dp_size": 2})),
        "load": {"poll_ms": 100, "max_age_ms": 1000, "factor": 1.5, "floor": 2},
        "pd": {"prefill_endpoints": PREFILL.map(|a| json!({"address": a, "dp_size": 2})),
               "threshold_tokens": 500, "bytes_per_token": 4.0},
    });
    if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            if v.is_null() {
                o.remove(k);
            } else {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    Config::parse(c.to_string().as_bytes()).unwrap()
}

fn body(session: &str, returning: bool, filler: usize) -> Vec<u8> {
    let mut messages = vec![json!({"role": "user", "content": "x ".repeat(filler)})];
    if returning {
        messages.push(json!({"role": "assistant", "content": "ok"}));
        messages.push(json!({"role": "user", "content": "and now?"}));
    }
    json!({"model": "m", "messages": messages, "session_id": session})
        .to_string()
        .into_bytes()
}

fn view(decode: [f64; 4], prefill: [f64; 2], at: u64) -> LoadView {
    let mut v = LoadView::new(6);
    for (i, r) in decode.iter().enumerate() {
        v.record(
            i,
            Sample {
                requests: *r,
                prefill_tokens: 0.0,
                busy: 0.0,
                prefill_tokens_per_s: 0.0,
                at_ms: at,
            },
        );
    }
    for (i, t) in prefill.iter().enumerate() {
        v.record(
            4 + i,
            Sample {
                requests: 0.0,
                prefill_tokens: *t,
                busy: 0.0,
                prefill_tokens_per_s: 0.0,
                at_ms: at,
            },
        );
    }
    v
}

fn decide(c: &Config, b: &[u8], v: &LoadView, now: u64) -> Plan {
    let pools = Pools::new(c);
    let call = BodyCall::new(Api::Chat, &[], b.len());
    let snap = Snapshot {
        view: v,
        residency: &ResidencyView::EMPTY,
        health: None,
        now_ms: now,
    };
    let mut fetch = |s: usize, l: usize| b.get(s..s + l).map(<[u8]>::to_vec);
    on_body(c, &pools, snap, call, &mut fetch, &mut |_| {})
}

fn primary(d: &Plan) -> usize {
    d.placed.primary().unwrap()
}

/// The prefill endpoint's address, as `x-prefiller-host-port` names it.
fn prefiller(d: &Plan) -> Option<&'static str> {
    match d.placed.prefill {
        Prefill::Remote(i) => Some(PREFILL[i]),
        Prefill::Local | Prefill::Off | Prefill::Holder(_) | Prefill::Pull(_) => None,
    }
}

#[test]
fn a_hot_primary_spills_the_key_to_its_next_rendezvous_choice() {
    let c = cfg(json!({"pd": null}));
    let b = body("hot", true, 10);
    let plain = decide(&c, &b, &LoadView::new(6), 0);
    assert!(!plain.placed.spilled);
    let order = plain.placed.pick.clone().unwrap().order;
    let mut loads = [0.0; 4];
    // Under the floor: stays.
    loads[order[0]] = 1.0;
    let d = decide(&c, &b, &view(loads, [0.0; 2], 1000), 1000);
    assert_eq!((primary(&d), d.placed.spilled), (order[0], false));
    // Well over the bound: its next choice, the same DP rank (equal dp_size).
    loads[order[0]] = 40.0;
    let d = decide(&c, &b, &view(loads, [0.0; 2], 1000), 1000);
    assert_eq!((primary(&d), d.placed.spilled), (order[1], true));
    assert_eq!(
        d.placed.pick.as_ref().unwrap().rank,
        plain.placed.pick.as_ref().unwrap().rank
    );
    // Both primary and first fallback hot: the second fallback.
    loads[order[1]] = 40.0;
    let d = decide(&c, &b, &view(loads, [0.0; 2], 1000), 1000);
    assert_eq!(primary(&d), order[2]);
    // The same view gives the same choice (another gateway replica).
    assert_eq!(decide(&c, &b, &view(loads, [0.0; 2], 1000), 1000), d);
    // A stale view is no view: back on the primary.
    let d = decide(&c, &b, &view(loads, [0.0; 2], 1000), 5000);
    assert_eq!((primary(&d), d.placed.spilled), (order[0], false));
}

/// The key's endpoint order with no load view.
fn plain_order(c: &Config, b: &[u8]) -> Vec<usize> {
    decide(c, b, &LoadView::new(6), 0)
        .placed
        .pick
        .unwrap()
        .order
}

#[test]
fn a_primary_with_a_stale_report_beside_fresh_ones_keeps_its_last_load() {
    let c = cfg(json!({"pd": null}));
    let b = body("hot", true, 10);
    let order = plain_order(&c, &b);
    let mut loads = [0.0; 4];
    loads[order[0]] = 40.0;
    let mut v = view(loads, [0.0; 2], 1000);
    // The primary's polls stopped answering; the others' go on.
    for i in (0..4).filter(|&i| i != order[0]) {
        v.record(
            i,
            Sample {
                requests: 0.0,
                prefill_tokens: 0.0,
                busy: 0.0,
                prefill_tokens_per_s: 0.0,
                at_ms: 2500,
            },
        );
    }
    let d = decide(&c, &b, &v, 2500);
    assert_eq!(
        (primary(&d), d.placed.spilled),
        (order[1], true),
        "not read as idle"
    );
    assert_eq!(d.placed.load, LoadRead::Held);
    // Every sample fresh: nothing held.
    assert_eq!(
        decide(&c, &b, &view(loads, [0.0; 2], 2500), 2500)
            .placed
            .load,
        LoadRead::Fresh
    );
    // Every sample stale: no view, the primary, blind.
    let d = decide(&c, &b, &v, 4000);
    assert_eq!(
        (primary(&d), d.placed.spilled, d.placed.load),
        (order[0], false, LoadRead::Blind)
    );
    // Never polled (a VM just started): blind too.
    assert_eq!(
        decide(&c, &b, &LoadView::new(6), 0).placed.load,
        LoadRead::Blind
    );
    // Without a `load` block the view is not read.
    let off = cfg(json!({"pd": null, "load": null}));
    assert_eq!(decide(&off, &b, &v, 2500).placed.load, LoadRead::Off);
}

#[test]
fn without_load_config_the_view_is_ignored() {
    let c = cfg(json!({"pd": null, "load": null}));
    let b = body("hot", true, 10);
    let order = plain_order(&c, &b);
    let mut loads = [0.0; 4];
    loads[order[0]] = 1000.0;
    let d = decide(&c, &b, &view(loads, [0.0; 2], 1000), 1000);
    assert_eq!((primary(&d), d.placed.spilled), (order[0], false));
}

#[test]
fn a_long_first_turn_is_disaggregated_to_the_least_loaded_prefiller() {
    let c = cfg(json!({}));
    let first = body("s1", false, 2000);
    let d = decide(&c, &first, &view([0.0; 4], [9000.0, 10.0], 1000), 1000);
    assert_eq!(prefiller(&d), Some(PREFILL[1]));
    let d = decide(&c, &first, &view([0.0; 4], [10.0, 9000.0], 1000), 1000);
    assert_eq!(prefiller(&d), Some(PREFILL[0]));
    // A short one stays on its decode endpoint.
    let short = body("s1", false, 100);
    assert_eq!(prefiller(&decide(&c, &short, &LoadView::new(6), 0)), None);
}

/// The prefill pool is compared by how long each rank's queue would hold a
/// new prefill back, at the rate the rank reports: more queued tokens on a
/// faster rank can be the sooner start.
#[test]
fn the_prefill_pool_is_compared_by_wait_at_each_ranks_own_rate() {
    let first = body("s1", false, 2000);
    let mut v = view([0.0; 4], [9000.0, 2000.0], 1000);
    for (i, tokens, rate) in [(4, 9000.0, 100_000.0), (5, 2000.0, 10_000.0)] {
        v.record(
            i,
            Sample {
                requests: 0.0,
                prefill_tokens: tokens,
                busy: 0.0,
                prefill_tokens_per_s: rate,
                at_ms: 1000,
            },
        );
    }
    // 9,000 tokens at 100 K/s wait 90 ms; 2,000 at 10 K/s wait 200 ms.
    let c = cfg(json!({}));
    assert_eq!(prefiller(&decide(&c, &first, &v, 1000)), Some(PREFILL[0]));
    // A rate configured for the residency rule holds for every rank: the
    // shorter queue is the sooner start again.
    let c = cfg(json!({"residency": {"prefill_tokens_per_s": 20000.0}}));
    assert_eq!(prefiller(&decide(&c, &first, &v, 1000)), Some(PREFILL[1]));
}

/// A long conversation (read from its two ends) whose turn ends with the
/// user's reply: the walk back from the end reaches the assistant entry
/// before it, so only the reply counts as new and the turn prefills in place
/// (it stopped at the reply and counted the whole prompt as new before).
#[test]
fn a_long_returning_turn_ending_with_the_users_reply_counts_only_the_reply() {
    let c = cfg(json!({}));
    let mut messages = vec![json!({"role": "user", "content": "start"})];
    for i in 0..40 {
        messages.push(json!({"role": "assistant", "content": "x ".repeat(1000)}));
        messages.push(json!({"role": "user", "content": format!("step {i}")}));
    }
    messages.push(json!({"role": "assistant", "content": "ok"}));
    messages.push(json!({"role": "user", "content": "and now?"}));
    let returning = json!({"model": "m", "messages": messages, "session_id": "s3"})
        .to_string()
        .into_bytes();
    assert!(returning.len() > 64 * 1024);
    let d = decide(&c, &returning, &LoadView::new(6), 0);
    assert!(!d.read.stats.full, "read from its ends");
    assert!(
        d.read.new_bytes.is_some_and(|n| n < 100),
        "{:?}",
        d.read.new_bytes
    );
    assert_eq!(prefiller(&d), None);
}

#[test]
fn a_returning_turn_of_a_pinned_session_prefills_in_place_unless_spilled() {
    let c = cfg(json!({}));
    let returning = body("s2", true, 2000);
    let d = decide(&c, &returning, &LoadView::new(6), 0);
    assert!(
        d.read.new_bytes.is_some_and(|n| n < 100),
        "{:?}",
        d.read.new_bytes
    );
    assert_eq!(prefiller(&d), None);
    // Spilled to another decode endpoint: nothing cached there, disaggregate.
    let order = d.placed.pick.unwrap().order;
    let mut loads = [0.0; 4];
    loads[order[0]] = 50.0;
    let d = decide(&c, &returning, &view(loads, [0.0; 2], 1000), 1000);
    assert!(d.placed.spilled);
    assert!(prefiller(&d).is_some());
}

#[test]
fn pd_config_needs_pick_mode_and_the_body() {
    for (extra, field) in [
        (json!({"header_fast_path": true}), "pd"),
        (json!({"mode": "hash", "load": null}), "pd"),
        (json!({"mode": "hash", "pd": null}), "load"),
    ] {
        let mut c = json!({
            "mode": "pick",
            "header_fast_path": false,
            "endpoints": [{"address": DECODE[0]}],
            "load": {},
            "pd": {"prefill_endpoints": [{"address": PREFILL[0]}]},
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        let e = Config::parse(c.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.field, field, "{extra}: {e}");
    }
}

#[test]
fn pd_adds_the_prefiller_output_and_it_needs_pd() {
    use crate::config::outputs::Output;
    assert!(cfg(json!({})).outputs.has(Output::Prefiller));
    assert!(!cfg(json!({"pd": null})).outputs.has(Output::Prefiller));
    let bad = json!({"mode": "pick", "endpoints": [{"address": DECODE[0]}],
                     "outputs": ["pick", "prefiller"]});
    let e = Config::parse(bad.to_string().as_bytes()).unwrap_err();
    assert_eq!(e.field, "outputs");
    // The header path never carries it (a route may not match on it).
    assert!(
        !cfg(json!({}))
            .outputs
            .header_path_markers()
            .any(|h| h == tether_wire::headers::PREFILLER)
    );
}

fn header(d: &Plan, c: &Config, name: &str) -> Option<String> {
    d.request_headers(c, &Pools::new(c))
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn counters(d: &Plan, c: &Config) -> Vec<Counter> {
    let mut out = Vec::new();
    d.for_each_counter(c, |x| out.push(x));
    out
}

#[test]
fn a_spill_and_a_disaggregation_reach_the_headers_and_the_counters() {
    let c = cfg(json!({}));
    let b = body("hot", false, 2000);
    let plain = decide(&c, &b, &LoadView::new(6), 0);
    let order = plain.placed.pick.clone().unwrap().order;
    let dest = |d: &Plan| header(d, &c, "x-gateway-destination-endpoint").unwrap();
    assert!(
        dest(&plain).starts_with(DECODE[order[0]]),
        "{}",
        dest(&plain)
    );
    assert!(!counters(&plain, &c).contains(&Counter::Fixed(Fixed::LoadSpilled)));
    let mut loads = [0.0; 4];
    loads[order[0]] = 40.0;
    let d = decide(&c, &b, &view(loads, [9000.0, 10.0], 1000), 1000);
    assert!(dest(&d).starts_with(DECODE[order[1]]), "{}", dest(&d));
    assert_eq!(
        header(&d, &c, "x-prefiller-host-port").as_deref(),
        Some(PREFILL[1])
    );
    let n = counters(&d, &c);
    for want in [
        Counter::Fixed(Fixed::BodyPath),
        Counter::Fixed(Fixed::LoadSpilled),
        Counter::Fixed(Fixed::PdDisaggregated),
        Counter::Pick(order[1]),
    ] {
        assert!(n.contains(&want), "{want:?} in {n:?}");
    }
    assert!(!n.contains(&Counter::Pick(order[0])));
    // A short prompt prefills on its decode endpoint: no header, counted local.
    let d = decide(&c, &body("hot", false, 10), &LoadView::new(6), 0);
    assert_eq!(header(&d, &c, "x-prefiller-host-port"), None);
    assert!(counters(&d, &c).contains(&Counter::Fixed(Fixed::PdLocal)));
}

#[test]
fn the_header_path_spills_on_the_view_too() {
    let c = cfg(json!({"pd": null, "header_fast_path": true}));
    let pools = Pools::new(&c);
    let h: Vec<(String, Vec<u8>)> = [(":path", "/v1/chat/completions"), ("x-session-id", "hot")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
        .collect();
    let at = |v: &LoadView, now: u64| {
        let snap = Snapshot {
            view: v,
            residency: &ResidencyView::EMPTY,
            health: None,
            now_ms: now,
        };
        match crate::decide::on_headers(&c, &pools, snap, &h, false) {
            crate::decide::HeaderOutcome::Decided(d) => *d,
            other => panic!("{other:?}"),
        }
    };
    let plain = at(&LoadView::new(6), 0);
    assert!(plain.read.header_path);
    let order = plain.placed.pick.clone().unwrap().order;
    let mut loads = [0.0; 4];
    loads[order[0]] = 40.0;
    let d = at(&view(loads, [0.0; 2], 1000), 1000);
    assert_eq!((primary(&d), d.placed.spilled), (order[1], true));
    assert_eq!(d.placed.prefill, Prefill::Off, "no P/D without the body");
    assert!(
        header(&d, &c, "x-gateway-destination-endpoint")
            .unwrap()
            .starts_with(DECODE[order[1]])
    );
}

/// With endpoints of different `dp_size`, a spill can change the key's DP
/// rank: it is made when nothing in the body carries the rank, and not when
/// the body is rewritten (`docs/gateway.md`, "Load-aware pick").
#[test]
fn a_rewritten_body_keeps_its_dp_rank_across_a_spill() {
    let mixed = json!({"pd": null, "endpoints": [
        {"address": DECODE[0], "dp_size": 1}, {"address": DECODE[1], "dp_size": 8},
        {"address": DECODE[2], "dp_size": 3}, {"address": DECODE[3], "dp_size": 5}]});
    let plain_cfg = cfg(mixed.clone());
    let mut with_rank = mixed;
    with_rank["outputs"] = json!(["pick", "routed_dp_rank"]);
    let rank_cfg = cfg(with_rank);
    let mut seen = 0;
    for i in 0..200 {
        let b = body(&format!("s{i}"), true, 10);
        let home = decide(&plain_cfg, &b, &LoadView::new(6), 0);
        let pick = home.placed.pick.clone().unwrap();
        let mut loads = [0.0; 4];
        loads[pick.order[0]] = 40.0;
        let v = view(loads, [0.0; 2], 1000);
        let moved = decide(&plain_cfg, &b, &v, 1000);
        if !moved.placed.spilled || moved.placed.pick.as_ref().unwrap().rank == pick.rank {
            continue;
        }
        seen += 1;
        let kept = decide(&rank_cfg, &b, &v, 1000);
        assert!(!kept.placed.spilled, "s{i}");
        let out = crate::emit::rewrite::apply(&b, kept.edit.as_ref().unwrap());
        let sent: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(sent["routed_dp_rank"], json!(pick.rank), "s{i}");
    }
    assert!(seen > 10, "{seen} keys changed rank when spilled");
}

mod residency;
