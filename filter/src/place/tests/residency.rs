//! Residency-aware placement through the whole pipeline: stay with the state,
//! the less loaded candidate for a new key, migrate pulling from the old home
//! (or with it as the prefiller), recompute, stale and absent summaries, and a
//! rank that claims to hold everything.

use super::*;
use crate::place::residency_view::ResidencyView;
use tether_placement::{Held, Resident};

/// `residency` on, no P/D, a 1.5× bound with floor 2.
fn rcfg(extra: serde_json::Value) -> Config {
    let mut r = json!({"candidates": 2});
    if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    cfg(json!({"pd": null, "residency": r}))
}

/// Every decode endpoint reported at `at`: endpoint `i` holds `tokens` of
/// `key` when `holds[i]`.
fn residency(key: u64, holds: [bool; 4], tokens: u32, at: u64) -> ResidencyView {
    let mut v = ResidencyView::new(4);
    for (i, h) in holds.iter().enumerate() {
        let r = if *h {
            Resident::from_entries(
                [(
                    key,
                    Held {
                        tokens,
                        device: true,
                    },
                )],
                16,
            )
            .0
        } else {
            Resident::EMPTY
        };
        v.record(i, 1 + i as u64, at, r);
    }
    v
}

fn decide_r(c: &Config, b: &[u8], v: &LoadView, r: &ResidencyView, now: u64) -> Plan {
    let pools = Pools::new(c);
    let call = BodyCall::new(Api::Chat, &[], b.len());
    let snap = Snapshot {
        view: v,
        residency: r,
        health: None,
        now_ms: now,
    };
    let mut fetch = |s: usize, l: usize| b.get(s..s + l).map(<[u8]>::to_vec);
    on_body(c, &pools, snap, call, &mut fetch, &mut |_| {})
}

fn resident_key(d: &Plan) -> u64 {
    let id = &d.read.identity;
    tether_placement::resident_key(
        u128::from(id.tenant_hash()),
        u128::from(id.session_hash()),
        u128::from(id.subagent_hash()),
    )
}

/// The key's rendezvous order and its resident key.
fn key_of(c: &Config, b: &[u8]) -> (Vec<usize>, u64) {
    let d = decide(c, b, &LoadView::new(6), 0);
    (d.placed.pick.clone().unwrap().order, resident_key(&d))
}

#[test]
fn a_new_key_lands_on_the_less_loaded_of_its_candidates() {
    let c = rcfg(json!({}));
    let b = body("new", false, 10);
    let (order, key) = key_of(&c, &b);
    let mut loads = [0.0; 4];
    loads[order[0]] = 3.0;
    loads[order[1]] = 1.0;
    let r = residency(key, [false; 4], 0, 1000);
    let d = decide_r(&c, &b, &view(loads, [0.0; 2], 1000), &r, 1000);
    assert_eq!(primary(&d), order[1]);
    assert_eq!(d.placed.how, Some(How::Least));
    assert!(counters(&d, &c).contains(&Counter::Fixed(Fixed::ResidencyLeast)));
    assert_eq!(header(&d, &c, "x-prefiller-host-port"), None);
}

#[test]
fn a_returning_key_stays_with_its_state_under_the_bound() {
    let c = rcfg(json!({}));
    let b = body("back", true, 10);
    let (order, key) = key_of(&c, &b);
    let mut holds = [false; 4];
    holds[order[1]] = true;
    let mut loads = [1.0; 4];
    loads[order[1]] = 2.0;
    let d = decide_r(
        &c,
        &b,
        &view(loads, [0.0; 2], 1000),
        &residency(key, holds, 4000, 1000),
        1000,
    );
    assert_eq!((primary(&d), d.placed.how), (order[1], Some(How::Stay)));
    assert!(counters(&d, &c).contains(&Counter::Fixed(Fixed::ResidencyStay)));
}

/// A hot holder of `key` (its first candidate) and an idle fleet otherwise.
fn hot_holder(order: &[usize], key: u64) -> (LoadView, ResidencyView) {
    let mut holds = [false; 4];
    holds[order[0]] = true;
    let mut loads = [0.0; 4];
    loads[order[0]] = 40.0;
    (
        view(loads, [0.0; 2], 1000),
        residency(key, holds, 8000, 1000),
    )
}

#[test]
fn an_overloaded_holder_migrates_the_key_with_its_state_or_recomputes_it() {
    let b = body("hot", true, 10);
    let c = rcfg(json!({}));
    let (order, key) = key_of(&c, &b);
    let (v, r) = hot_holder(&order, key);
    // The default: the new endpoint pulls the state from the old holder.
    let d = decide_r(&c, &b, &v, &r, 1000);
    assert_eq!(primary(&d), order[1]);
    assert_eq!(d.placed.how, Some(How::Migrate { from: order[0] }));
    assert_eq!(d.placed.prefill, Prefill::Pull(order[0]));
    assert_eq!(
        header(&d, &c, "x-tether-pull-from").as_deref(),
        Some(DECODE[order[0]])
    );
    assert_eq!(header(&d, &c, "x-prefiller-host-port"), None);
    assert!(
        header(&d, &c, "x-gateway-destination-endpoint")
            .unwrap()
            .starts_with(DECODE[order[1]])
    );
    assert!(counters(&d, &c).contains(&Counter::Fixed(Fixed::ResidencyMigrate)));
    // `migrate: "leg"`: the old holder is the prefiller instead.
    let leg = rcfg(json!({"migrate": "leg"}));
    let d = decide_r(&leg, &b, &v, &r, 1000);
    assert_eq!(d.placed.prefill, Prefill::Holder(order[0]));
    assert_eq!(
        header(&d, &leg, "x-prefiller-host-port").as_deref(),
        Some(DECODE[order[0]])
    );
    assert_eq!(header(&d, &leg, "x-tether-pull-from"), None);
    assert!(counters(&d, &leg).contains(&Counter::Fixed(Fixed::ResidencyMigrate)));
    // No link: the same move recomputes, and names no holder either way.
    for extra in [
        json!({"link_gbps": 0}),
        json!({"link_gbps": 0, "migrate": "leg"}),
    ] {
        let no_link = rcfg(extra);
        let d = decide_r(&no_link, &b, &v, &r, 1000);
        assert_eq!(d.placed.how, Some(How::Recompute { from: order[0] }));
        assert_eq!(header(&d, &no_link, "x-prefiller-host-port"), None);
        assert_eq!(header(&d, &no_link, "x-tether-pull-from"), None);
        assert!(counters(&d, &no_link).contains(&Counter::Fixed(Fixed::ResidencyRecompute)));
    }
}

/// `over_bound: "keep-up"`: the hot holder has no prefill queued, so it keeps
/// the key (and names no holder to pull from); with a long queue it passes the
/// key on as `move` does.
#[test]
fn keep_up_keeps_the_key_on_a_hot_holder_whose_prefills_keep_up() {
    let b = body("hot", true, 10);
    let c = rcfg(json!({"over_bound": "keep-up"}));
    let (order, key) = key_of(&c, &b);
    let (v, r) = hot_holder(&order, key);
    let d = decide_r(&c, &b, &v, &r, 1000);
    assert_eq!((primary(&d), d.placed.how), (order[0], Some(How::Stay)));
    assert_eq!(header(&d, &c, "x-tether-pull-from"), None);
    // 100 K tokens queued on the holder (5 s at the default 20 K tokens/s).
    let mut queued = v.clone();
    queued.record(
        order[0],
        Sample {
            requests: 40.0,
            prefill_tokens: 100_000.0,
            busy: 0.0,
            prefill_tokens_per_s: 0.0,
            at_ms: 1000,
        },
    );
    let d = decide_r(&c, &b, &queued, &r, 1000);
    assert_eq!(d.placed.how, Some(How::Migrate { from: order[0] }));
    assert_eq!(d.placed.prefill, Prefill::Pull(order[0]));
    // The same queue on a holder that reports prefilling 10 M tokens/s
    // (10 ms): it keeps up, and keeps the key.
    let mut fast = queued.clone();
    fast.record(
        order[0],
        Sample {
            requests: 40.0,
            prefill_tokens: 100_000.0,
            busy: 0.0,
            prefill_tokens_per_s: 10_000_000.0,
            at_ms: 1001,
        },
    );
    let d = decide_r(&c, &b, &fast, &r, 1001);
    assert_eq!((primary(&d), d.placed.how), (order[0], Some(How::Stay)));
    // A configured rate is every rank's: the report is not read.
    let fixed = rcfg(json!({"over_bound": "keep-up", "prefill_tokens_per_s": 20_000}));
    let d = decide_r(&fixed, &b, &fast, &r, 1001);
    assert_eq!(d.placed.how, Some(How::Migrate { from: order[0] }));
}

/// A key that stays, or a new one, never carries `x-tether-pull-from`.
#[test]
fn only_a_migrated_turn_names_a_holder_to_pull_from() {
    let c = rcfg(json!({}));
    let b = body("calm", true, 10);
    let (order, key) = key_of(&c, &b);
    let mut holds = [false; 4];
    holds[order[0]] = true;
    let v = view([0.0; 4], [0.0; 2], 1000);
    for r in [
        residency(key, holds, 8000, 1000),
        residency(key, [false; 4], 0, 1000),
    ] {
        let d = decide_r(&c, &b, &v, &r, 1000);
        assert!(matches!(d.placed.how, Some(How::Stay | How::Least)));
        assert_eq!(header(&d, &c, "x-tether-pull-from"), None);
    }
}

/// With the `kv_transfer_params` output a pulled turn's markers carry
/// `pull_from` too (the vLLM connector reads the body, not the header); a
/// turn that stays carries none.
#[test]
fn a_pulled_turn_names_its_holder_in_the_body_markers() {
    let c = rcfg(json!({}));
    let b = body("hot", true, 10);
    let (order, key) = key_of(&c, &b);
    let (v, r) = hot_holder(&order, key);
    let vllm = cfg(json!({"pd": null, "residency": {"candidates": 2},
                          "outputs": ["pick", "vllm"]}));
    let markers = |c: &Config, r: &ResidencyView| {
        let d = decide_r(c, &b, &v, r, 1000);
        let edit = d.edit.clone().expect("the body is rewritten");
        let out: serde_json::Value =
            serde_json::from_slice(&crate::emit::rewrite::apply(&b, &edit)).unwrap();
        (d, out["kv_transfer_params"]["tether"].clone())
    };
    let (d, t) = markers(&vllm, &r);
    assert_eq!(d.placed.prefill, Prefill::Pull(order[0]));
    assert_eq!(t["pull_from"], DECODE[order[0]], "{t}");
    assert_eq!(
        header(&d, &vllm, "x-tether-pull-from").as_deref(),
        Some(DECODE[order[0]])
    );
    assert_eq!(t["session"].as_str().map(str::len), Some(16), "{t}");
    let mut holds = [false; 4];
    holds[order[1]] = true;
    let (_, t) = markers(&vllm, &residency(key, holds, 8000, 1000));
    assert!(t.get("pull_from").is_none(), "{t}");
    let _ = c;
}

/// With `pd`, a pulled turn is not also disaggregated, however long its new
/// tokens: the prefill endpoint holds none of the state.
#[test]
fn a_pulled_turn_is_not_disaggregated() {
    let c = cfg(json!({"residency": {"candidates": 2}}));
    // ~1,000 uncached tokens after the last assistant entry: over the 500-token threshold.
    let mut v: serde_json::Value = serde_json::from_slice(&body("hotpd", true, 10)).unwrap();
    v["messages"][2]["content"] = json!("y ".repeat(2000));
    let b = v.to_string().into_bytes();
    let (order, key) = key_of(&c, &b);
    let (lv, r) = hot_holder(&order, key);
    let d = decide_r(&c, &b, &lv, &r, 1000);
    assert_eq!(d.placed.prefill, Prefill::Pull(order[0]));
    assert_eq!(header(&d, &c, "x-prefiller-host-port"), None);
    assert!(!counters(&d, &c).contains(&Counter::Fixed(Fixed::PdDisaggregated)));
    // The same turn staying home is disaggregated on its new tokens.
    let mut holds = [false; 4];
    holds[order[0]] = true;
    let calm = residency(key, holds, 8000, 1000);
    let d = decide_r(&c, &b, &view([0.0; 4], [0.0; 2], 1000), &calm, 1000);
    assert!(
        matches!(d.placed.prefill, Prefill::Remote(_)),
        "{:?}",
        d.placed.prefill
    );
}

#[test]
fn a_stale_or_missing_summary_keeps_the_bounded_pick() {
    let c = rcfg(json!({}));
    let b = body("stale", true, 10);
    let (order, key) = key_of(&c, &b);
    let mut holds = [false; 4];
    holds[order[1]] = true;
    let loads = [0.0; 4];
    // The summaries are 1001 ms old (max_age_ms 1000); the load samples fresh.
    let old = residency(key, holds, 4000, 0);
    let d = decide_r(&c, &b, &view(loads, [0.0; 2], 1001), &old, 1001);
    assert_eq!((primary(&d), d.placed.how), (order[0], Some(How::Bounded)));
    assert!(counters(&d, &c).contains(&Counter::Fixed(Fixed::ResidencyBounded)));
    // No load sample at all: the plain pick, no residency decision.
    let d = decide_r(&c, &b, &LoadView::new(6), &old, 1001);
    assert_eq!((primary(&d), d.placed.how), (order[0], None));
    // Without `residency`, the same view places as before.
    let plain = cfg(json!({"pd": null}));
    let d = decide_r(
        &plain,
        &b,
        &view(loads, [0.0; 2], 1000),
        &residency(key, holds, 4000, 1000),
        1000,
    );
    assert_eq!((primary(&d), d.placed.how), (order[0], None));
}

/// A rank that lists every key as held still gets no more than the load
/// bound lets it: requests pile up (none finish), each placed on the view
/// that counts the ones before it.
#[test]
fn a_rank_claiming_to_hold_everything_stays_under_the_bound() {
    let c = rcfg(json!({}));
    let pools = Pools::new(&c);
    let bound = c.residency.clone().unwrap().rule().bound;
    let mut loads = [0.0f64; 4];
    let n = 2000u64;
    for k in 0..n {
        let key = tether_placement::hash_parts(&[b"claim", &k.to_le_bytes()]);
        let mut r = ResidencyView::new(4);
        r.record(
            0,
            1,
            1000,
            Resident::from_entries(
                [(
                    key,
                    Held {
                        tokens: 9000,
                        device: true,
                    },
                )],
                4,
            )
            .0,
        );
        for i in 1..4 {
            r.record(i, 2, 1000, Resident::EMPTY);
        }
        let v = view(loads, [0.0; 2], 1000);
        let snap = Snapshot {
            view: &v,
            residency: &r,
            health: None,
            now_ms: 1000,
        };
        let req = Request {
            key,
            resident: key,
            prompt: None,
            keep_rank: false,
        };
        let p = place(&c, &pools, &req, snap);
        loads[p.primary().unwrap()] += 1.0;
    }
    let total: f64 = loads.iter().sum();
    let cap = bound.capacity(total, 0.25);
    assert!(
        loads[0] <= cap + 1.0,
        "the claimer got {} of {n} (bound {cap})",
        loads[0]
    );
    // Without the bound it would have had every key it is a candidate for (~half).
    assert!(loads[0] < 0.4 * n as f64, "{loads:?}");
}

/// `residency` (as [`rcfg`]) with the turn markers among the outputs: the
/// unseen counter reads them (a deployment that retains sends them).
fn rcfg_marked(extra: serde_json::Value) -> Config {
    let mut r = json!({"candidates": 2});
    if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    cfg(json!({"pd": null, "residency": r,
               "outputs": ["pick", "prefiller", "prompt_end", "turn_kind", "turn"]}))
}

/// A returning turn that no fresh summary shows is counted as placed on a
/// stale view; a first turn, a holder found or an unknown summary is not.
#[test]
fn a_returning_turn_no_summary_shows_counts_as_unseen() {
    let c = rcfg_marked(json!({}));
    let unseen = Counter::Fixed(Fixed::ResidencyUnseen);
    let loads = view([0.0; 4], [0.0; 2], 1000);
    let back = body("lag", true, 10);
    let (order, key) = key_of(&c, &back);
    let d = decide_r(
        &c,
        &back,
        &loads,
        &residency(key, [false; 4], 0, 1000),
        1000,
    );
    assert_eq!(d.placed.how, Some(How::Least));
    assert!(counters(&d, &c).contains(&unseen));
    // The first turn of a key is new, not unseen.
    let first = body("lag", false, 10);
    let d = decide_r(
        &c,
        &first,
        &loads,
        &residency(key, [false; 4], 0, 1000),
        1000,
    );
    assert_eq!(d.placed.how, Some(How::Least));
    assert!(!counters(&d, &c).contains(&unseen));
    // A holder listed: found.
    let mut holds = [false; 4];
    holds[order[1]] = true;
    let d = decide_r(&c, &back, &loads, &residency(key, holds, 4000, 1000), 1000);
    assert_eq!(d.placed.how, Some(How::Stay));
    assert!(!counters(&d, &c).contains(&unseen));
    // Stale summaries: the bounded pick, counted there instead.
    let d = decide_r(
        &c,
        &back,
        &view([0.0; 4], [0.0; 2], 1001),
        &residency(key, [false; 4], 0, 0),
        1001,
    );
    assert_eq!(d.placed.how, Some(How::Bounded));
    assert!(!counters(&d, &c).contains(&unseen));
}

/// `unseen: "rendezvous"` keeps a key no summary shows on its first
/// candidate while it has room; `"least-loaded"` (and the default) sends it
/// to the less loaded one.
#[test]
fn unseen_rendezvous_keeps_an_unshown_key_on_its_first_candidate() {
    let b = body("det", true, 10);
    let least = rcfg(json!({"unseen": "least-loaded"}));
    let rdv = rcfg_marked(json!({"unseen": "rendezvous"}));
    let (order, key) = key_of(&least, &b);
    // The first candidate busier than the second but under the bound
    // (7 in flight: capacity ⌈1.5 · 8 / 4⌉ = 3).
    let mut loads = [3.0; 4];
    loads[order[0]] = 1.0;
    loads[order[1]] = 0.0;
    let v = view(loads, [0.0; 2], 1000);
    let r = residency(key, [false; 4], 0, 1000);
    let d = decide_r(&least, &b, &v, &r, 1000);
    assert_eq!((primary(&d), d.placed.how), (order[1], Some(How::Least)));
    let d = decide_r(&rcfg(json!({})), &b, &v, &r, 1000);
    assert_eq!(primary(&d), order[1]);
    let d = decide_r(&rdv, &b, &v, &r, 1000);
    assert_eq!((primary(&d), d.placed.how), (order[0], Some(How::Least)));
    assert!(counters(&d, &rdv).contains(&Counter::Fixed(Fixed::ResidencyUnseen)));
    // Over the bound, the first candidate passes the key on.
    loads[order[0]] = 40.0;
    let d = decide_r(&rdv, &b, &view(loads, [0.0; 2], 1000), &r, 1000);
    assert_eq!(primary(&d), order[1]);
}
