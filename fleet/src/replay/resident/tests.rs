use super::*;
use crate::sim::testkit::agent_trace;
use tether_placement::residency::Summary;
use tether_placement::{Held, LoadBound, MoveCost};

fn rule() -> Rule {
    Rule {
        candidates: 3,
        bound: LoadBound {
            factor: 1.25,
            floor: 2.0,
        },
        cost: MoveCost::from_link(131_072.0, 50.0, 5.0, 20_000.0),
        unseen: tether_placement::Unseen::default(),
        over_bound: tether_placement::OverBound::default(),
    }
}

fn origins(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("http://127.0.0.1:{}", 9000 + i))
        .collect()
}

fn set(route: &ResidentRoute, i: usize, load: f64, resident: Option<Resident>) {
    set_at(route, i, load, resident, Instant::now());
}

/// [`set`] with the reply's arrival time.
fn set_at(route: &ResidentRoute, i: usize, load: f64, resident: Option<Resident>, at: Instant) {
    route.view.write().unwrap()[i] = Some(Polled {
        at,
        load,
        backlog: 0.0,
        rate: None,
        resident,
    });
}

/// A summary listing `rkey` with `tokens` on the device.
fn holding(rkey: u64, tokens: u32) -> Resident {
    Resident::from_entries(
        [(
            rkey,
            Held {
                tokens,
                device: true,
            },
        )],
        16,
    )
    .0
}

/// Every one of `n` targets replied idle; `holder` lists `held`, the others nothing.
fn only_holder(route: &ResidentRoute, n: usize, holder: usize, held: &Resident) {
    for i in 0..n {
        let res = if i == holder {
            held.clone()
        } else {
            Resident::EMPTY
        };
        set(route, i, 0.0, Some(res));
    }
}

/// Target `i`'s last reply also reports `backlog` queued prefill tokens and,
/// when `Some`, its prefill rate.
fn queue(route: &ResidentRoute, i: usize, backlog: f64, rate: Option<f64>) {
    if let Some(p) = route.view.write().unwrap()[i].as_mut() {
        p.backlog = backlog;
        p.rate = rate;
    }
}

#[test]
fn without_a_view_the_route_is_the_plain_rendezvous_pick_with_markers() {
    let t = agent_trace(4, 3, 100, 10, 64);
    let route = ResidentRoute::new(&origins(4), rule(), Duration::from_secs(60));
    let r = RequestId(0);
    let got = route.route(&t, r, "").unwrap();
    assert_eq!(got.how, How::Bounded);
    let (key, _) = request_key(&t, r);
    assert_eq!(
        Some(got.target),
        route.placement.pick(key, 0).unwrap().order.first().copied()
    );
    let names: Vec<&str> = got.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.contains(&headers::SESSION) && names.contains(&headers::PROMPT_END));
    assert!(!names.contains(&headers::PREFILLER));
}

#[test]
fn a_returning_key_follows_its_state_and_an_overloaded_holder_hands_it_over() {
    let t = agent_trace(4, 3, 100, 10, 64);
    let route = ResidentRoute::new(&origins(4), rule(), Duration::from_secs(60));
    let r = RequestId(1);
    let (key, rk) = request_key(&t, r);
    let order = route.placement.pick(key, 3).unwrap().order;
    let holder = order[1];
    let rkey = resident_key(rk.tenant.0, rk.session.0, rk.subagent.0);
    let held = holding(rkey, 50_000);
    only_holder(&route, 4, holder, &held);
    let got = route.route(&t, r, "").unwrap();
    assert_eq!((got.target, got.how), (holder, How::Stay));
    // The holder over the bound: the key moves and names its old home to
    // pull from (the default) — or, migrating by legs, as its prefiller.
    set(&route, holder, 12.0, Some(held.clone()));
    let got = route.route(&t, r, "").unwrap();
    assert_eq!(got.how, How::Migrate { from: holder });
    assert_ne!(got.target, holder);
    let named = |got: &super::Routed, h: &str| {
        got.headers
            .iter()
            .find(|(k, _)| k == h)
            .map(|(_, v)| v.clone())
    };
    let home = origins(4)[holder].trim_start_matches("http://").to_owned();
    assert_eq!(named(&got, headers::PULL_FROM), Some(home.clone()));
    assert_eq!(named(&got, headers::PREFILLER), None);
    let leg = ResidentRoute::new(&origins(4), rule(), Duration::from_secs(60))
        .migrating(crate::sim::Migrate::Leg);
    for i in 0..4 {
        let load = if i == holder { 12.0 } else { 0.0 };
        let res = if i == holder {
            held.clone()
        } else {
            Resident::EMPTY
        };
        set(&leg, i, load, Some(res));
    }
    let by_leg = leg.route(&t, r, "").unwrap();
    assert_eq!(named(&by_leg, headers::PREFILLER), Some(home));
    assert_eq!(named(&by_leg, headers::PULL_FROM), None);
    // A salted replay is another session: nothing held for it.
    let salted = route.route(&t, r, "run-2").unwrap();
    assert_ne!(salted.how, How::Stay);
    assert_ne!(salted.headers, got.headers);
}

#[test]
fn a_bad_summary_counts_as_unknown_and_stale_replies_age_out() {
    let t = agent_trace(2, 2, 100, 10, 64);
    let route = ResidentRoute::new(&origins(3), rule(), Duration::from_millis(0));
    for i in 0..3 {
        set(&route, i, 0.0, Some(Resident::EMPTY));
    }
    std::thread::sleep(Duration::from_millis(2));
    // Aged out: unknown, the bounded pick.
    assert_eq!(route.route(&t, RequestId(0), "").unwrap().how, How::Bounded);
    let bad = Summary {
        version: 9,
        ..Summary::default()
    };
    assert!(Resident::decode(&bad).is_err());
}

#[test]
fn a_stale_reply_beside_fresh_ones_keeps_its_load_and_its_residency_is_unknown() {
    let t = agent_trace(4, 3, 100, 10, 64);
    let route = ResidentRoute::new(&origins(4), rule(), Duration::from_secs(1));
    let r = RequestId(0);
    let (key, _) = request_key(&t, r);
    let primary = route.placement.pick(key, 0).unwrap().order[0];
    for i in (0..4).filter(|&i| i != primary) {
        set(&route, i, 0.0, Some(Resident::EMPTY));
    }
    // The primary's last reply, 10 s old, said 12 in flight.
    let ten_s_ago = Instant::now()
        .checked_sub(Duration::from_secs(10))
        .expect("a clock 10 s past its origin");
    set_at(&route, primary, 12.0, Some(Resident::EMPTY), ten_s_ago);
    let got = route.route(&t, r, "").unwrap();
    assert_eq!(got.how, How::Bounded, "its summary is unknown");
    assert_ne!(got.target, primary, "held over the bound, not read as idle");
}

#[test]
fn a_backlog_is_a_wait_at_the_targets_reported_rate_unless_one_is_set() {
    let t = agent_trace(4, 3, 100, 10, 64);
    let r = RequestId(1);
    let (key, rk) = request_key(&t, r);
    let rkey = resident_key(rk.tenant.0, rk.session.0, rk.subagent.0);
    let held = holding(rkey, 4_000);
    let routed = |own_rates: bool, rate: Option<f64>| {
        let route = ResidentRoute::new(&origins(4), rule(), Duration::from_secs(60))
            .reading_rates(own_rates);
        let holder = route.placement.pick(key, 3).unwrap().order[0];
        only_holder(&route, 4, holder, &held);
        // 40 K tokens queued on the holder: 2 s at the rule's 20 K tokens/s.
        queue(&route, holder, 40_000.0, rate);
        let got = route.route(&t, r, "").unwrap();
        (got.how == How::Stay, got.target == holder)
    };
    // At the rule's rate the queue is worth a move; at the holder's own
    // 4 M tokens/s (10 ms) it is not; a set rate is every target's.
    assert_eq!(routed(true, None), (false, false));
    assert_eq!(routed(true, Some(4_000_000.0)), (true, true));
    assert_eq!(routed(false, Some(4_000_000.0)), (false, false));
}
