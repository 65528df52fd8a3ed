use super::*;
use crate::report::config::RankInfo;
use crate::report::model::RunInfo;
use crate::report::observe::{Clock, ErrorKind, Observation, Outcome, Served, Timing};
use crate::trace::{AgentSpec, RequestSpec, SessionSpec, TraceBuilder, TurnKind};
use serde_json::json;

/// Two sessions of three turns, 10 tokens per block; turn k holds blocks
/// 0..=k+1 of its session (20, 30, 40 tokens).
pub fn trace() -> Trace {
    let mut b = TraceBuilder::new(10).unwrap();
    for s in 0..2u64 {
        let sid = b
            .session(SessionSpec {
                id: format!("s{s}"),
                start_ms: Some(s * 100),
                ..Default::default()
            })
            .unwrap();
        let a = b
            .agent(
                sid,
                AgentSpec {
                    id: "main".into(),
                    agent_type: "main".into(),
                    ..Default::default()
                },
            )
            .unwrap();
        for k in 0..3u64 {
            let ids: Vec<u64> = (0..k + 2).map(|i| s * 100 + i).collect();
            let kind = if k == 0 {
                TurnKind::First
            } else {
                TurnKind::Tool
            };
            b.request(
                a,
                RequestSpec::new(k * 1000, (ids.len() * 10) as u32, 5, kind),
                &ids,
            )
            .unwrap();
        }
    }
    b.build().unwrap()
}

pub fn run_info() -> RunInfo {
    RunInfo {
        label: "t".into(),
        tool: "test".into(),
        version: "0".into(),
        targets: vec![],
        schedule: "fixed".into(),
        live_sessions: None,
        max_inflight: 1,
        speedup: 1.0,
        max_gap_ms: None,
        sessions_replayed: 2,
        api: None,
        identity: "none".into(),
        stream: false,
        started_unix_ms: 0,
        wall_s: 10.0,
        trace_s: 3600.0,
        clock: String::new(),
        lag_ms: Default::default(),
        partial: false,
        partial_reason: None,
    }
}

pub fn served(prompt: u64, cached: u64, rank: &str, ttft: f64) -> Outcome {
    Outcome::Served(Served {
        prompt_tokens: prompt,
        cached_tokens: cached,
        output_tokens: 5,
        device_cached_tokens: Some(cached),
        restored_tokens: Some(0),
        rank: Some(rank.into()),
        dp_rank: Some(0),
        attempts: 1,
        timing: Timing {
            clock: Clock::Simulated,
            ttft_ms: ttft,
            itl_ms: Some(2.0),
            e2e_ms: ttft + 8.0,
            queue_ms: Some(0.0),
        },
    })
}

fn rank(name: &str) -> RankInfo {
    RankInfo {
        rank: name.into(),
        config: json!({"serving": {"dp_size": 1}, "profile": {"name": "p", "hash": "h", "gpu": "g", "engine_hour_usd": 3.6}}),
        serving_hash: "x".into(),
    }
}

fn obs(t: &Trace, placement: [&str; 6], cached: [u64; 6]) -> Vec<Observation> {
    (0..6u32)
        .map(|i| Observation {
            request: i,
            sent_ms: (i as f64) * 1000.0,
            lag_ms: 0.0,
            outcome: served(
                u64::from(t.requests()[i as usize].input_tokens),
                cached[i as usize],
                placement[i as usize],
                10.0 + i as f64,
            ),
        })
        .collect()
}

fn build_with(t: &Trace, o: &[Observation], busy: BTreeMap<String, f64>) -> Report {
    let sessions = [SessionId(0), SessionId(1)];
    build(BuildInput {
        trace: t,
        trace_path: "t.jsonl".into(),
        trace_format: "tether".into(),
        sessions: &sessions,
        observations: o,
        run: run_info(),
        config: ServingConfig::new(None, vec![rank("a"), rank("b")], BTreeMap::new()),
        busy_s: busy,
    })
}

#[test]
fn ideal_counts_returning_turns_and_caps_at_the_last_token() {
    let t = trace();
    let r = build_with(
        &t,
        &obs(&t, ["a"; 6], [0, 19, 29, 0, 19, 29]),
        BTreeMap::new(),
    );
    // Per session: 0, 20 (2 blocks), 30 (3 blocks, under the 39 cap) → 50 of 90.
    assert_eq!(r.trace.input_tokens, 180);
    assert!((r.hit_ratio.ideal_session - 100.0 / 180.0).abs() < 1e-9);
    assert!((r.hit_ratio.ideal_session_returning - 100.0 / 140.0).abs() < 1e-9);
    // The sessions share nothing: global = session.
    assert_eq!(r.hit_ratio.ideal_global, r.hit_ratio.ideal_session);
    assert_eq!(r.tokens.cached, 96);
    assert!((r.hit_ratio.returning - 96.0 / 140.0).abs() < 1e-9);
    assert_eq!(r.requests.completed, 6);
    assert_eq!(r.reprefill.basis, "fleet");
    assert_eq!(r.reprefill.placement_basis, "per_rank");
    // Reusable on one rank = the session ideal: 100; cached 96 → 4 avoidable (one token per returning turn).
    assert_eq!(r.reprefill.reusable_at_placement_tokens, 100);
    assert_eq!(r.reprefill.avoidable_at_placement_tokens, 4);
    // The sessions share nothing, so the fleet's shared cache serves the same.
    assert_eq!(r.reprefill.reusable_tokens, 100);
    assert_eq!(r.reprefill.avoidable_tokens, 4);
}

#[test]
fn split_sessions_lose_reuse_and_count_it_as_avoidable_only_where_the_rank_had_it() {
    let t = trace();
    // Session 0 alternates ranks; nothing was cached.
    let r = build_with(
        &t,
        &obs(&t, ["a", "b", "a", "b", "b", "b"], [0; 6]),
        BTreeMap::new(),
    );
    // Per rank: s0 turn 1 on b (nothing there) 0; turn 2 on a (turn 0's 2 blocks) 20;
    // s1 on b: 20 + 30.
    assert_eq!(r.reprefill.reusable_at_placement_tokens, 70);
    assert_eq!(r.reprefill.avoidable_at_placement_tokens, 70);
    // Fleet-wide, one shared cache had every earlier turn: the session ideal
    // (100), all of it recomputed — splitting the session cost 30 more than
    // the per-rank measure admits.
    assert_eq!(r.reprefill.reusable_tokens, 100);
    assert_eq!(r.reprefill.avoidable_tokens, 100);
    let l = &r.load;
    assert_eq!(l.engines.len(), 2);
    assert_eq!(l.engines_configured, Some(2));
    assert_eq!(l.engines[0].engine, "a#0");
    assert_eq!(l.engines[0].requests, 2);
    assert!((l.max_over_mean_requests.unwrap() - 4.0 / 3.0).abs() < 1e-9);
}

#[test]
fn engines_that_served_nothing_count_in_the_mean() {
    let t = trace();
    let r = build_with(&t, &obs(&t, ["a"; 6], [0; 6]), BTreeMap::new());
    assert_eq!(r.load.engines.len(), 2);
    assert_eq!(r.load.max_over_mean_requests, Some(2.0));
}

#[test]
fn cost_prices_busy_time_when_scraped_else_the_whole_fleet() {
    let t = trace();
    let o = obs(&t, ["a"; 6], [0; 6]);
    let busy: BTreeMap<String, f64> = [("a#0".to_owned(), 1800.0), ("b#0".to_owned(), 0.0)].into();
    let r = build_with(&t, &o, busy);
    assert_eq!(r.cost.basis.as_deref(), Some("busy"));
    assert!((r.cost.usd - 1.8).abs() < 1e-9, "{:?}", r.cost);
    // 180 prompt + 30 output tokens.
    assert!((r.cost.usd_per_mtok.unwrap() - 1.8 / 210e-6).abs() < 1e-6);
    assert_eq!(r.load.engines[0].busy_s, Some(1800.0));
    let r = build_with(&t, &o, BTreeMap::new());
    assert_eq!(r.cost.basis.as_deref(), Some("fleet_time"));
    // 2 engines × 3600 s of trace time × $3.6/h.
    assert!((r.cost.usd - 7.2).abs() < 1e-9);
}

#[test]
fn errors_are_counted_by_kind_and_unsent_requests_too() {
    let t = trace();
    let mut o = obs(&t, ["a"; 6], [0; 6]);
    o[2].outcome = Outcome::Failed {
        kind: ErrorKind::Status(503),
        message: "x".into(),
        attempts: 3,
        rank: None,
    };
    o[3].outcome = Outcome::Failed {
        kind: ErrorKind::Connect,
        message: "x".into(),
        attempts: 1,
        rank: None,
    };
    o.pop();
    let r = build_with(&t, &o, BTreeMap::new());
    assert_eq!(
        (
            r.requests.sent,
            r.requests.completed,
            r.requests.errors,
            r.requests.not_sent
        ),
        (5, 3, 2, 1)
    );
    assert_eq!(r.requests.errors_by_kind["http_503"], 1);
    assert_eq!(r.requests.errors_by_kind["connect"], 1);
    assert_eq!(r.latency.ttft_ms.count, 3);
}

#[test]
fn series_hold_a_cdf_and_buckets_that_add_up() {
    let t = trace();
    let r = build_with(
        &t,
        &obs(&t, ["a"; 6], [0, 19, 29, 0, 19, 29]),
        BTreeMap::new(),
    );
    let cdf = &r.series.ttft_cdf;
    assert_eq!(cdf.len(), 101);
    assert_eq!(cdf[0], (10.0, 0.0));
    assert_eq!(cdf[100], (15.0, 1.0));
    assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0));
    let b: u64 = r.series.hit_over_time.iter().map(|b| b.cached_tokens).sum();
    assert_eq!(b, r.tokens.cached);
    let json = r.to_json();
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(back, r);
}

#[test]
fn sessions_show_their_spread_and_why_turns_lost_their_cache() {
    let t = trace();
    // s0 stays on a and keeps everything; s1 moves to b (its turn 1 finds
    // nothing there), then b loses most of it (turn 2 finds 10 of 30).
    let r = build_with(
        &t,
        &obs(&t, ["a", "a", "a", "a", "b", "b"], [0, 20, 30, 0, 0, 10]),
        BTreeMap::new(),
    );
    let s = &r.sessions;
    assert_eq!(s.count, 2);
    let l = &s.lost;
    assert_eq!((l.returning, l.moved, l.evicted, l.unknown), (4, 1, 1, 0));
    assert_eq!(l.tokens, 20 + 20);
    assert!((s.hit_ratio.max - 50.0 / 90.0).abs() < 1e-9);
    assert!((s.hit_ratio_p10 - 10.0 / 90.0).abs() < 1e-9);
    assert_eq!(r.series.session_hit_ratios.len(), 2);
    assert!(
        (s.of_ceiling.max - 1.0).abs() < 1e-9,
        "s0 got its whole ceiling"
    );
    assert!((s.of_ceiling.p50 - 10.0 / 50.0).abs() < 1e-9);
    assert_eq!(s.ttft_first_ms.count, 2);
    assert_eq!(s.ttft_returning_ms.count, 4);
    assert_eq!(s.ttft_first_ms.max, 13.0);
    // Last answer ends 8 ms after its TTFT; the trace spans 2,000 ms per session.
    assert!((s.completion_vs_trace.max - 2023.0 / 2000.0).abs() < 1e-9);
    assert!((s.main_hit_ratio - 60.0 / 180.0).abs() < 1e-9);
    assert_eq!(s.subagent_hit_ratio, None);
    let md = crate::report::markdown::render(&r, &[]);
    assert!(
        md.contains("| returning turns that lost their cache | 2 of 4: moved 1, evicted or expired 1, unknown 0"),
        "{md}"
    );
}
