use super::*;
use serde_json::json;

const REPLY: &[u8] = br#"{"server_load": 3, "sim_ms": 81234.5, "speedup": 100.0,
 "ranks": [{"dp_rank": 0, "running": 2, "waiting": 1, "restoring": 0,
            "queued_prefill_tokens": 18432, "kv_usage": 0.4123, "kv_blocks": 57656, "retentions": 12},
           {"dp_rank": 1, "running": 0, "waiting": 0, "restoring": 0,
            "queued_prefill_tokens": 100, "kv_usage": 0.0, "kv_blocks": 57656, "retentions": 0}]}"#;

/// A `/load` reply of two DP ranks (one request running on the first), each
/// rank's members overridden by `r0` and `r1`.
fn two_dp_ranks(r0: serde_json::Value, r1: serde_json::Value) -> Vec<u8> {
    let rank = |dp: u64, running: u64, extra: serde_json::Value| {
        let mut r = json!({"dp_rank": dp, "running": running, "waiting": 0, "restoring": 0,
                           "queued_prefill_tokens": 0, "kv_usage": 0.1, "kv_blocks": 8,
                           "retentions": 0});
        if let (Some(o), Some(e)) = (r.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        r
    };
    let reply = json!({"server_load": 1, "sim_ms": 1.0, "speedup": 1.0,
                       "ranks": [rank(0, 1, r0), rank(1, 0, r1)]});
    serde_json::to_vec(&reply).expect("JSON")
}

#[test]
fn a_report_gives_requests_and_prefill_backlog() {
    let s = Sample::from_reply(Some("200"), REPLY, 7).unwrap();
    assert_eq!((s.requests, s.prefill_tokens, s.at_ms), (3.0, 18532.0, 7));
}

#[test]
fn the_busy_share_is_the_dp_ranks_mean_and_weighs_below_a_request() {
    // A report without `busy` (an older rank) reads 0.
    let s = Sample::from_reply(Some("200"), REPLY, 7).unwrap();
    assert_eq!(s.busy, 0.0);
    let with = two_dp_ranks(json!({"busy": 0.8}), json!({"busy": 7.0}));
    let s = Sample::from_reply(Some("200"), &with, 7).unwrap();
    // An out-of-range share reads as 1: the mean of 0.8 and 1.
    assert!((s.busy - 0.9).abs() < 1e-12, "{}", s.busy);
    let mut v = LoadView::new(2);
    v.record(0, s);
    v.record(1, sample(1.0, 7));
    let l = v.resident_loads(0..2, 7, 100, tether_placement::BUSY_WEIGHT);
    // Both have one request in flight; the busier reads higher, by less than a request.
    assert!(l[0] > l[1] && l[0] < 2.0, "{l:?}");
}

#[test]
fn the_prefill_rate_turns_the_backlog_into_a_wait_at_the_ranks_own_speed() {
    // Neither DP rank reports a rate: unknown, the caller's fallback applies.
    let s = Sample::from_reply(Some("200"), REPLY, 7).unwrap();
    assert_eq!(s.prefill_tokens_per_s, 0.0);
    let with = two_dp_ranks(
        json!({"queued_prefill_tokens": 6000, "prefill_tokens_per_s": 40000}),
        json!({"prefill_tokens_per_s": 20000}),
    );
    let fast = Sample::from_reply(Some("200"), &with, 7).unwrap();
    assert_eq!(fast.prefill_tokens_per_s, 60_000.0);
    let mut v = LoadView::new(2);
    v.record(0, fast);
    v.record(1, s);
    // 6,000 tokens at the rank's 60 K tokens/s; 18,532 at a 20 K fallback.
    // Read as the filter reads them: an unreported rate (0) falls back.
    let rc = crate::config::residency::ResidencyConfig::default();
    let rule = rc.rule();
    let waits = v.prefill_waits_ms(0..2, 7, 100, |tokens, rate| rc.wait_ms(&rule, tokens, rate));
    assert!((waits[0] - 100.0).abs() < 1e-9, "{waits:?}");
    assert!((waits[1] - 926.6).abs() < 1e-9, "{waits:?}");
    // The rate survives the shared-data encoding.
    let back = LoadView::decode(&v.encode(), 2).unwrap();
    assert_eq!(back, v);
}

#[test]
fn bad_replies_are_values_not_panics() {
    assert!(matches!(
        Sample::from_reply(Some("503"), REPLY, 0),
        Err(BadReply::Status(Some(s))) if s == "503"
    ));
    assert!(matches!(
        Sample::from_reply(None, REPLY, 0),
        Err(BadReply::Status(None))
    ));
    for body in [
        &b""[..],
        b"{",
        b"[]",
        b"{\"server_load\": -1}",
        b"\xff\xfe",
        b"null",
    ] {
        assert!(
            matches!(
                Sample::from_reply(Some("200"), body, 0),
                Err(BadReply::Parse(_))
            ),
            "{body:?}"
        );
    }
    let big = vec![b' '; MAX_REPLY_BYTES + 1];
    assert!(matches!(
        Sample::from_reply(Some("200"), &big, 0),
        Err(BadReply::TooLarge(_))
    ));
}

fn sample(requests: f64, at_ms: u64) -> Sample {
    Sample {
        requests,
        prefill_tokens: requests * 10.0,
        busy: (requests / 10.0).min(1.0),
        prefill_tokens_per_s: requests * 1000.0,
        at_ms,
    }
}

#[test]
fn a_stale_sample_holds_beside_a_fresh_one_and_a_stale_view_is_none() {
    let mut v = LoadView::new(3);
    v.record(0, sample(5.0, 1000));
    v.record(1, sample(7.0, 400));
    // Endpoint 1's polls stopped answering: its last report holds (it is not
    // read as idle); endpoint 2 was never sampled.
    assert_eq!(v.requests(0..3, 1500, 1000), vec![5.0, 7.0, 0.0]);
    assert!(v.holds_stale(0..3, 1500, 1000));
    assert_eq!(v.requests(0..3, 1400, 1000), vec![5.0, 7.0, 0.0]);
    assert!(!v.holds_stale(0..3, 1400, 1000), "all sampled are fresh");
    assert_eq!(
        v.prefill_waits_ms(1..3, 1400, 1000, |t, _| t),
        vec![70.0, 0.0]
    );
    assert!(v.any_fresh(0..1, 1500, 1000));
    assert!(!v.any_fresh(1..3, 1500, 1000));
    // No fresh sample in the range: no view, all 0, nothing held.
    assert_eq!(
        v.prefill_waits_ms(1..3, 1500, 1000, |t, _| t),
        vec![0.0, 0.0]
    );
    assert!(!v.holds_stale(1..3, 1500, 1000));
    assert_eq!(v.requests(0..3, 2001, 1000), vec![0.0, 0.0, 0.0]);
    assert!(!v.holds_stale(0..3, 2001, 1000));
    assert_eq!(v.freshness(0..3, 1500, 1000), Freshness::Holds);
    assert_eq!(v.freshness(0..3, 1400, 1000), Freshness::Fresh);
    assert_eq!(v.freshness(0..1, 1500, 1000), Freshness::Fresh);
    assert_eq!(v.freshness(1..3, 1500, 1000), Freshness::NoView);
    assert_eq!(v.freshness(0..3, 2001, 1000), Freshness::NoView);
    assert_eq!(
        v.freshness(7..9, 1500, 1000),
        Freshness::NoView,
        "out of range"
    );
    // Out of range: nothing recorded, nothing read.
    v.record(9, sample(1.0, 1));
    assert_eq!(v.len(), 3);
    assert_eq!(v.requests(2..5, 0, 10), vec![0.0, 0.0, 0.0]);
}

#[test]
fn an_older_sample_never_replaces_a_newer_one() {
    let mut v = LoadView::new(1);
    v.record(0, sample(5.0, 1000));
    v.record(0, sample(9.0, 900));
    assert_eq!(v.requests(0..1, 1000, 10), vec![5.0]);
    v.record(0, sample(9.0, 1001));
    assert_eq!(v.requests(0..1, 1001, 10), vec![9.0]);
}

#[test]
fn the_encoding_round_trips_and_refuses_other_shapes() {
    let mut v = LoadView::new(3);
    v.record(0, sample(5.0, 1000));
    v.record(2, sample(1.5, u64::MAX));
    let b = v.encode();
    assert_eq!(LoadView::decode(&b, 3), Some(v.clone()));
    assert_eq!(LoadView::decode(&b, 2), None);
    assert_eq!(LoadView::decode(&b[..b.len() - 1], 3), None);
    assert_eq!(LoadView::decode(&[], 0), Some(LoadView::new(0)));
    // A non-finite value reads as no sample.
    let mut bad = b.clone();
    bad[1..9].copy_from_slice(&f64::NAN.to_le_bytes());
    assert_eq!(
        LoadView::decode(&bad, 3).unwrap().requests(0..1, 1000, 10),
        vec![0.0]
    );
}

#[test]
fn one_poll_per_period_whoever_ticks() {
    assert!(due(None, 0, 200));
    assert!(!due(Some(1000), 1100, 200));
    assert!(due(Some(1000), 1150, 200));
    assert!(due(Some(1000), 5000, 200));
    // A clock that went back never polls in a burst, nor panics.
    assert!(!due(Some(5000), 1000, 200));
}
