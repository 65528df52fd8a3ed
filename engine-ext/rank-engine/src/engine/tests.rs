use super::*;
use crate::profile::{Profile, test_profile};
use tether_engine::{BlockHasher, RequestKeys, RetentionKey, TurnKind};
use tether_wire::HexId;

const BS: usize = 16;

fn profile() -> Profile {
    test_profile(
        &[(1000.0, 100.0), (4000.0, 500.0)],
        &[(1000.0, &[(1.0, 10.0), (11.0, 20.0)])],
        1 << 10,
        1.0,
    )
}

fn engine_with(
    device_blocks: usize,
    host_bytes: u64,
    retention: bool,
    seqs: usize,
    budget: usize,
) -> Engine {
    let policy = PolicyConfig {
        block_size: BS,
        device_blocks,
        block_bytes: (BS as u64) << 10,
        host_bytes,
        retention,
        ..PolicyConfig::default()
    };
    engine_of(policy, seqs, budget)
}

fn engine_of(policy: PolicyConfig, seqs: usize, budget: usize) -> Engine {
    Engine::try_new(
        EngineConfig {
            policy,
            max_num_seqs: seqs,
            max_num_batched_tokens: budget,
            kv_link_gbps: 1.0,
            prefetch: false,
        },
        LatencyModel::new(profile()),
    )
    .unwrap()
}

fn engine() -> Engine {
    engine_with(4096, 0, true, 64, 8192)
}

/// Tokens `base..base+n`: prompts sharing `base` share a prefix.
fn toks(base: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| base.wrapping_mul(1_000_003).wrapping_add(i))
        .collect()
}

fn req(id: u64, tokens: &[u32], max_tokens: usize, marker: Option<TurnMarker>) -> SimRequest {
    SimRequest {
        id,
        hashes: BlockHasher::try_new(BS)
            .unwrap()
            .hash_prompt(tokens, &RequestKeys::default()),
        prompt_tokens: tokens.len(),
        max_tokens,
        marker,
        stream: true,
        kv_in_tokens: 0,
    }
}

fn marker(session: u128) -> Option<TurnMarker> {
    Some(TurnMarker {
        key: RetentionKey {
            tenant: HexId(0),
            session: HexId(session),
            subagent: HexId(0),
        },
        prompt_end: true,
        kind: TurnKind::Tool,
        turn: None,
        retention_ms: None,
    })
}

/// Runs until idle, calling `advance` at every wakeup; returns every event.
fn run(e: &mut Engine) -> Vec<Event> {
    let mut out = Vec::new();
    let mut guard = 0;
    while let Some(t) = e.next_wakeup() {
        e.advance(t, &mut out);
        guard += 1;
        assert!(guard < 1_000_000, "engine does not settle");
    }
    out
}

fn done(events: &[Event], id: u64) -> Outcome {
    events
        .iter()
        .find_map(|ev| match ev {
            Event::Done { id: i, outcome } if *i == id => Some(*outcome),
            _ => None,
        })
        .unwrap_or_else(|| panic!("request {id} did not finish: {events:?}"))
}

#[test]
fn a_lone_cold_request_takes_the_profiles_ttft() {
    let mut e = engine();
    let t = toks(1, 2000);
    e.submit(req(1, &t, 3, None), 5.0).unwrap();
    let ev = run(&mut e);
    let o = done(&ev, 1);
    assert_eq!(o.cached_tokens, 0);
    assert!((o.ttft_ms() - 100.0 - 400.0 / 3.0).abs() < 1e-9, "{o:?}");
    // Two decode steps of one sequence at context ~2000 (the surface has one context: 10 ms).
    assert!((o.e2e_ms() - o.ttft_ms() - 20.0).abs() < 1e-9);
    assert_eq!(o.output_tokens, 3);
    // Streaming: First, one Token, then Done carries the last token.
    let kinds: Vec<_> = ev
        .iter()
        .map(|e| match e {
            Event::First { .. } => 'f',
            Event::Token { .. } => 't',
            Event::Done { .. } => 'd',
            Event::Failed { .. } => 'x',
        })
        .collect();
    assert_eq!(kinds, vec!['f', 't', 'd']);
    assert_eq!(e.gauges().running, 0);
    e.cache().check().unwrap();
}

#[test]
fn a_returning_turn_is_served_from_cache_and_starts_sooner() {
    let mut e = engine();
    let t1 = toks(7, 3000);
    e.submit(req(1, &t1, 2, marker(9)), 0.0).unwrap();
    let first = done(&run(&mut e), 1);
    let mut t2 = t1.clone();
    t2.extend(toks(8, 200));
    let at = e.clock() + 1000.0;
    e.submit(req(2, &t2, 2, marker(9)), at).unwrap();
    let second = done(&run(&mut e), 2);
    assert_eq!(second.cached_tokens, 3000 / BS * BS);
    assert_eq!(second.device_cached_tokens, second.cached_tokens);
    assert!(
        second.ttft_ms() * 5.0 < first.ttft_ms(),
        "{first:?} {second:?}"
    );
    assert_eq!(e.metrics().prefix_hits, second.cached_tokens as u64);
    assert_eq!(e.metrics().retained_blocks, (3000 / BS + 3200 / BS) as u64);
}

#[test]
fn a_fully_cached_prompt_recomputes_its_last_token_as_vllm_does() {
    let mut e = engine();
    let t = toks(3, 64); // block aligned
    e.submit(req(1, &t, 1, None), 0.0).unwrap();
    run(&mut e);
    e.submit(req(2, &t, 1, None), e.clock()).unwrap();
    let o = done(&run(&mut e), 2);
    assert_eq!(o.cached_tokens, 48);
    assert_eq!(o.computed_tokens(), 16);
}

#[test]
fn batching_slows_decode_and_queueing_shows_in_ttft() {
    // Two requests together: each decode step carries both.
    let mut e = engine();
    e.submit(req(1, &toks(1, 100), 5, None), 0.0).unwrap();
    e.submit(req(2, &toks(2, 100), 5, None), 0.0).unwrap();
    let ev = run(&mut e);
    let (a, b) = (done(&ev, 1), done(&ev, 2));
    assert!((a.itl_ms() - 11.0).abs() < 1e-9, "{a:?}");
    assert!((b.itl_ms() - 11.0).abs() < 1e-9);
    // One sequence at a time: the second waits for the first to finish.
    let mut e = engine_with(4096, 0, true, 1, 8192);
    e.submit(req(1, &toks(1, 100), 5, None), 0.0).unwrap();
    e.submit(req(2, &toks(2, 100), 5, None), 0.0).unwrap();
    let ev = run(&mut e);
    let (a, b) = (done(&ev, 1), done(&ev, 2));
    assert!((a.itl_ms() - 10.0).abs() < 1e-9);
    assert!((b.queue_ms() - a.e2e_ms()).abs() < 1e-9, "{a:?} {b:?}");
    assert!(b.ttft_ms() > a.ttft_ms() + a.e2e_ms() - 1e-9);
}

#[test]
fn chunked_prefill_takes_the_same_time_alone_and_shares_steps_with_decodes() {
    let mut e = engine_with(4096, 0, true, 64, 512);
    e.submit(req(1, &toks(1, 2000), 2, None), 0.0).unwrap();
    let ev = run(&mut e);
    let o = done(&ev, 1);
    let whole = e.model().prefill_ms(2000);
    assert!((o.ttft_ms() - whole).abs() < 1e-9);
    assert_eq!(e.metrics().steps, 4 + 1);
    // A decoding request slows down while a long prefill is chunked beside it.
    let mut e = engine_with(4096, 0, true, 64, 512);
    e.submit(req(1, &toks(1, 100), 50, None), 0.0).unwrap();
    e.submit(req(2, &toks(2, 4000), 2, None), 20.0).unwrap();
    let ev = run(&mut e);
    let alone = 10.0;
    assert!(done(&ev, 1).itl_ms() > alone + 1.0);
}

#[test]
fn results_do_not_depend_on_how_often_time_is_advanced() {
    // Submitted in arrival order: the loop below submits a request once time
    // reaches it, so an unsorted schedule would hold a due request behind a
    // later one by an amount that depends on the step.
    let mut schedule: Vec<(u64, SimMs, usize)> = (0..20)
        .map(|i| {
            (
                i + 1,
                (i * 37 % 200) as f64 + i as f64 * 30.0,
                40 + (i as usize % 3) * 500,
            )
        })
        .collect();
    schedule.sort_by(|a, b| a.1.total_cmp(&b.1));
    let outcomes = |step: f64| {
        let mut e = engine_with(4096, 0, true, 4, 1024);
        let mut out = Vec::new();
        let mut t = 0.0;
        let mut next = 0;
        while next < schedule.len() || e.next_wakeup().is_some() {
            while next < schedule.len() && schedule[next].1 <= t {
                let (id, at, n) = schedule[next];
                e.submit(
                    req(id, &toks(id as u32 % 5, n), 4, None),
                    at.max(e.clock().min(t)),
                )
                .unwrap();
                next += 1;
            }
            e.advance(t, &mut out);
            t += step;
        }
        let mut d: Vec<(u64, u64, u64)> = out
            .iter()
            .filter_map(|ev| match ev {
                Event::Done { id, outcome } => Some((
                    *id,
                    (outcome.ttft_ms() * 1e6) as u64,
                    (outcome.e2e_ms() * 1e6) as u64,
                )),
                _ => None,
            })
            .collect();
        d.sort();
        d
    };
    let fine = outcomes(0.5);
    assert_eq!(fine.len(), 20);
    assert_eq!(fine, outcomes(7.0));
}

#[test]
fn retention_keeps_a_session_through_a_flood_that_lru_loses() {
    let flood = |e: &mut Engine| {
        for i in 0..40 {
            let at = e.clock();
            e.submit(req(100 + i, &toks(1000 + i as u32, 640), 1, None), at)
                .unwrap();
            run(e);
        }
    };
    let hits = |retention: bool| {
        // 256 blocks = 4096 tokens; the flood brings 40 × 640 tokens.
        let mut e = engine_with(256, 0, retention, 64, 8192);
        let t1 = toks(5, 1600);
        e.submit(req(1, &t1, 1, marker(5)), 0.0).unwrap();
        run(&mut e);
        flood(&mut e);
        let mut t2 = t1.clone();
        t2.extend(toks(6, 100));
        let at = e.clock() + 1000.0;
        e.submit(req(2, &t2, 1, marker(5)), at).unwrap();
        let o = done(&run(&mut e), 2);
        e.cache().check().unwrap();
        o.cached_tokens
    };
    assert_eq!(hits(false), 0);
    assert_eq!(hits(true), 1600 / BS * BS);
}

#[test]
fn held_tail_blocks_take_room_from_the_lru_front_as_in_vllm() {
    // 256 blocks. a: 100 blocks, done. b: 150 blocks decoding 200 tokens — 163 slots
    // held as vLLM holds them — pushes a's tail (after a's own dead block) out.
    let hits = |hold: bool| {
        let policy = PolicyConfig {
            hold_tail_blocks: hold,
            ..engine_with(256, 0, false, 64, 8192)
                .cache()
                .config()
                .clone()
        };
        let mut e = engine_of(policy, 64, 8192);
        let a = toks(5, 1600);
        e.submit(req(1, &a, 1, None), 0.0).unwrap();
        run(&mut e);
        let at = e.clock();
        e.submit(req(2, &toks(7, 2400), 200, None), at).unwrap();
        run(&mut e);
        let mut a2 = a.clone();
        a2.extend(toks(6, 100));
        let at = e.clock() + 10.0;
        e.submit(req(3, &a2, 1, None), at).unwrap();
        let o = done(&run(&mut e), 3);
        e.cache().check().unwrap();
        o.cached_tokens
    };
    assert_eq!(hits(false), 1600);
    assert_eq!(hits(true), (100 - 7) * BS);
}

/// Session 1 retains a `tokens`-token prompt, three other sessions push it to the host
/// tier, and it returns with 64 more tokens: that request's outcome.
fn return_after_three_others(e: &mut Engine, tokens: usize) -> Outcome {
    let a = toks(11, tokens);
    e.submit(req(1, &a, 1, marker(1)), 0.0).unwrap();
    run(e);
    for s in 2..5u64 {
        let at = e.clock() + 10.0;
        let t = toks(20 + s as u32, tokens);
        e.submit(req(s, &t, 1, marker(u128::from(s))), at).unwrap();
        run(e);
    }
    assert!(e.cache().stats().offloaded >= 1, "{:?}", e.cache().stats());
    let mut a2 = a;
    a2.extend(toks(12, 64));
    let at = e.clock() + 10.0;
    e.submit(req(9, &a2, 1, marker(1)), at).unwrap();
    done(&run(e), 9)
}

#[test]
fn a_host_tier_restore_is_counted_and_costs_link_time() {
    // Device of 160 blocks (2560 tokens); every session retains 1280 tokens, so the
    // third retention pushes the oldest to the host tier.
    let mut e = engine_with(160, 64 << 20, true, 64, 8192);
    let o = return_after_three_others(&mut e, 1280);
    assert_eq!(o.restored_tokens, 1280);
    assert_eq!(o.cached_tokens, 1280);
    // 80 blocks × 16 KiB at 1 GB/s.
    let bytes = 80.0 * 16.0 * 1024.0;
    assert!((o.restore_ms - bytes / 1e6).abs() < 1e-9);
    let compute = e.model().prefill_after_ms(64, 1280);
    assert!((o.ttft_ms() - o.restore_ms - compute).abs() < 1e-9, "{o:?}");
    assert_eq!(e.metrics().external_hits, 1280);
    assert_eq!(e.cache().stats().restored_blocks, 80);
    e.cache().check().unwrap();
}

#[test]
fn cancelling_releases_the_requests_blocks() {
    let mut e = engine();
    e.submit(req(1, &toks(1, 1000), 100, None), 0.0).unwrap();
    e.submit(req(2, &toks(2, 1000), 100, None), 0.0).unwrap();
    let mut out = Vec::new();
    e.advance(200.0, &mut out);
    assert_eq!(e.gauges().running, 2);
    assert!(e.cancel(1));
    assert!(!e.cancel(1));
    let out = run(&mut e);
    assert!(
        out.iter()
            .all(|ev| !matches!(ev, Event::Done { id: 1, .. }))
    );
    done(&out, 2);
    assert_eq!(e.gauges().kv_usage, 0.0);
    assert_eq!(e.metrics().aborted, 1);
    e.cache().check().unwrap();
    // A waiting request can be cancelled too.
    e.submit(req(3, &toks(3, 10), 1, None), e.clock() + 5.0)
        .unwrap();
    assert!(e.cancel(3));
    assert!(run(&mut e).is_empty());
}

#[test]
fn submissions_the_engine_cannot_hold_are_refused() {
    let mut e = engine_with(4, 0, true, 4, 64);
    assert!(matches!(
        e.submit(req(1, &toks(1, 100), 1, None), 0.0),
        Err(SubmitError::TooLarge {
            need: 6,
            capacity: 4
        })
    ));
    assert!(matches!(
        e.submit(req(1, &[], 1, None), 0.0),
        Err(SubmitError::Empty(_))
    ));
    assert!(matches!(
        e.submit(req(1, &[1], 0, None), 0.0),
        Err(SubmitError::Empty(_))
    ));
    e.submit(req(2, &toks(1, 10), 1, None), 0.0).unwrap();
    assert!(matches!(
        e.submit(req(2, &toks(1, 10), 1, None), 0.0),
        Err(SubmitError::Duplicate(2))
    ));
    // A prompt that fits only when others leave waits, then runs.
    e.submit(req(3, &toks(3, 60), 1, None), 0.0).unwrap();
    e.submit(req(4, &toks(4, 60), 1, None), 0.0).unwrap();
    let ev = run(&mut e);
    let (o3, o4) = (done(&ev, 3), done(&ev, 4));
    assert!(o4.queue_ms() >= o3.e2e_ms() - 1e-9, "{o3:?} {o4:?}");
    assert!(
        Engine::try_new(
            EngineConfig {
                policy: PolicyConfig::default(),
                max_num_seqs: 8,
                max_num_batched_tokens: 4,
                kv_link_gbps: 1.0,
                prefetch: false,
            },
            LatencyModel::new(profile())
        )
        .is_err()
    );
}

fn quiet(mut r: SimRequest) -> SimRequest {
    r.stream = false;
    r
}

/// Non-streaming requests decode in runs; the times and counts must be those
/// of one step at a time, to the bit.
#[test]
fn decode_runs_time_exactly_as_single_steps() {
    let mut schedule: Vec<(u64, SimMs, usize, usize)> = (0..24)
        .map(|i| {
            (
                i + 1,
                (i * 53 % 300) as f64 + i as f64 * 41.0,
                40 + (i as usize % 4) * 300,
                3 + (i as usize * 7) % 40,
            )
        })
        .collect();
    // Submitted in arrival order, each once time reaches it.
    schedule.sort_by(|a, b| a.1.total_cmp(&b.1));
    let run_with = |step: f64| {
        let mut e = engine_with(4096, 0, true, 6, 1024);
        let mut out = Vec::new();
        let mut t = 0.0;
        let mut next = 0;
        while next < schedule.len() || e.next_wakeup().is_some() {
            while next < schedule.len() && schedule[next].1 <= t {
                let (id, at, n, m) = schedule[next];
                let r = quiet(req(id, &toks(id as u32 % 5, n), m, None));
                e.submit(r, at.max(e.clock().min(t))).unwrap();
                next += 1;
            }
            e.advance(t, &mut out);
            t += step;
        }
        let mut d: Vec<(u64, f64, f64, usize)> = out
            .iter()
            .filter_map(|ev| match ev {
                Event::Done { id, outcome } => Some((
                    *id,
                    outcome.first_token,
                    outcome.finished,
                    outcome.output_tokens,
                )),
                _ => None,
            })
            .collect();
        d.sort_by_key(|x| x.0);
        let m = e.metrics();
        (d, m.steps, m.itl.count(), m.itl_us.len(), m.busy_ms)
    };
    // 0.25 ms per advance: every decode step is formed alone (steps last ≥ 10 ms).
    let fine = run_with(0.25);
    let coarse = run_with(5000.0);
    assert_eq!(fine.0.len(), 24);
    assert_eq!(fine.0, coarse.0, "outcomes differ");
    assert_eq!(fine.1, coarse.1, "step counts differ");
    assert_eq!(fine.2, coarse.2);
    assert_eq!(fine.3, coarse.3);
    assert!(
        (fine.4 - coarse.4).abs() < 1e-6 * fine.4,
        "{} {}",
        fine.4,
        coarse.4
    );
    // Every output token after the first is one ITL observation.
    let tokens: usize = fine.0.iter().map(|d| d.3 - 1).sum();
    assert_eq!(fine.2, tokens as u64);
}

#[test]
fn a_long_decode_alone_runs_in_one_go() {
    let mut e = engine();
    e.submit(quiet(req(1, &toks(1, 500), 400, None)), 0.0)
        .unwrap();
    let mut out = Vec::new();
    e.advance(1e9, &mut out);
    let o = done(&out, 1);
    assert_eq!(o.output_tokens, 400);
    // One prefill step, then 399 decode steps formed as one run.
    assert_eq!(e.metrics().steps, 400);
    assert!(
        (o.e2e_ms() - o.ttft_ms() - 399.0 * 10.0).abs() < 1e-6,
        "{o:?}"
    );
    assert!((e.metrics().busy_ms - o.e2e_ms()).abs() < 1e-6);
}

#[test]
fn prompt_kv_from_a_prefill_engine_crosses_the_link_and_is_not_computed() {
    // Decode role: 2000 prompt tokens whose KV arrives from elsewhere, 1 KiB per
    // token over a 1 GB/s link; only the last token is computed here.
    let mut e = engine();
    let t = toks(7, 2000);
    let mut r = req(1, &t, 3, marker(7));
    r.kv_in_tokens = 2000;
    e.submit(quiet(r), 100.0).unwrap();
    let ev = run(&mut e);
    let o = done(&ev, 1);
    let cap = cached_cap(2000, BS);
    assert_eq!(o.cached_tokens, 0);
    assert_eq!(o.transferred_tokens, cap);
    assert_eq!(o.computed_tokens(), 2000 - cap);
    let link_ms = cap as f64 * 1024.0 / 1e6;
    assert!((o.transfer_ms - link_ms).abs() < 1e-9);
    let prefill = e.model().prefill_after_ms(2000 - cap, cap);
    assert!((o.ttft_ms() - link_ms - prefill).abs() < 1e-9, "{o:?}");
    assert_eq!(e.metrics().transferred_tokens, cap as u64);
    // The same session's next turn finds the transferred prefix cached here:
    // only the new tokens cross the link.
    let mut t2 = t.clone();
    t2.extend(toks(99, 300));
    let mut r2 = req(2, &t2, 2, marker(7));
    r2.kv_in_tokens = t2.len();
    e.submit(quiet(r2), 1000.0).unwrap();
    let o2 = done(&run(&mut e), 2);
    assert_eq!(o2.device_cached_tokens, 2000 / BS * BS);
    assert_eq!(
        o2.transferred_tokens,
        cached_cap(t2.len(), BS) - 2000 / BS * BS
    );
}

#[test]
fn the_finish_hint_never_passes_a_finish() {
    let mut e = engine_with(4096, 0, true, 8, 2048);
    let mut pending: Vec<(SimMs, SimRequest)> = (0..30u64)
        .map(|i| {
            (
                i as f64 * 23.0,
                quiet(req(
                    i + 1,
                    &toks(i as u32 % 4, 100 + 37 * i as usize),
                    1 + (i as usize * 13) % 60,
                    None,
                )),
            )
        })
        .collect();
    pending.reverse();
    let mut out = Vec::new();
    let mut finished = 0;
    loop {
        let hint = e.next_finish_hint();
        let arrival = pending.last().map(|p| p.0);
        let t = match (hint, arrival) {
            (None, None) => break,
            (Some(h), Some(a)) => h.min(a),
            (Some(h), None) => h,
            (None, Some(a)) => a,
        };
        let before = out.len();
        e.advance(t, &mut out);
        for ev in &out[before..] {
            if let Event::Done { outcome, .. } = ev {
                // Nothing finished after the hint that was valid before `t`.
                assert!(outcome.finished <= t + 1e-9);
                if let Some(h) = hint {
                    assert!(
                        outcome.finished >= h - 1e-9,
                        "finished {} before hint {h}",
                        outcome.finished
                    );
                }
                finished += 1;
            }
        }
        while pending.last().is_some_and(|p| p.0 <= t) {
            let (at, r) = pending.pop().unwrap();
            e.submit(r, at).unwrap();
        }
    }
    assert_eq!(finished, 30);
}

/// Hybrid models: a prompt ending mid-way through an aligned block resumes at the last
/// aligned boundary, and a restore from the host tier brings the snapshot's bytes over
/// the link with the blocks.
#[test]
fn a_hybrid_restore_resumes_at_the_aligned_snapshot_and_pays_for_its_bytes() {
    let block_bytes = (BS as u64) << 10;
    let policy = PolicyConfig {
        block_size: BS,
        device_blocks: 200,
        block_bytes,
        host_bytes: 64 << 20,
        state_bytes: 10 * block_bytes,
        state_align_tokens: 4 * BS,
        ..PolicyConfig::default()
    };
    let cfg = EngineConfig {
        policy,
        max_num_seqs: 64,
        max_num_batched_tokens: 8192,
        kv_link_gbps: 1.0,
        prefetch: false,
    };
    let mut e = Engine::try_new(cfg, LatencyModel::new(profile())).unwrap();
    // 1,300 tokens: 81 full blocks, the last aligned boundary at 80 (1,280 tokens).
    let o = return_after_three_others(&mut e, 1300);
    assert_eq!(o.cached_tokens, 1280, "resumed at the aligned snapshot");
    assert_eq!(o.restored_tokens, 1280);
    // 80 blocks and a 10-block snapshot, 16 KiB per block, at 1 GB/s.
    let bytes = 90.0 * 16.0 * 1024.0;
    assert!((o.restore_ms - bytes / 1e6).abs() < 1e-9, "{o:?}");
    e.cache().check().unwrap();
}

#[test]
fn a_hybrid_profile_gives_the_engine_its_state_rounded_to_whole_blocks() {
    let mut p = profile();
    p.hybrid = Some(crate::profile::HybridState {
        state_bytes: 39_518_208,
        align_tokens: 544,
    });
    let s = EngineSettings {
        block_size: 64,
        ..EngineSettings::default()
    };
    let c = EngineConfig::for_profile(&p, &s);
    assert_eq!(c.policy.state_bytes, 39_518_208);
    assert_eq!(
        c.policy.state_align_tokens, 576,
        "544 rounded up to 64-token blocks"
    );
    assert!(c.policy.validate().is_ok());
    assert_eq!(
        EngineConfig::for_profile(&profile(), &s).policy.state_bytes,
        0
    );
}

fn engine_prefetching(device_blocks: usize, prefetch: bool) -> Engine {
    let mut e = engine_with(device_blocks, 64 << 20, true, 64, 8192);
    let mut cfg = e.config().clone();
    cfg.prefetch = prefetch;
    e = Engine::try_new(cfg, LatencyModel::new(profile())).unwrap();
    e
}

fn with_kind(mut m: Option<TurnMarker>, kind: TurnKind) -> Option<TurnMarker> {
    if let Some(m) = m.as_mut() {
        m.kind = kind;
    }
    m
}

/// Session 1 runs two tool turns 2 s apart (the rank learns the tool gap), then a
/// 2,400-token request without a prompt end (`flood_tokens` output tokens) pushes
/// it — and session 2 (a `user` turn, never prefetched) — to the host tier.
/// Returns session 1's second prompt.
fn tool_session_pushed_to_host(e: &mut Engine, flood_tokens: usize) -> Vec<u32> {
    let mut a = toks(11, 1280);
    e.submit(req(1, &a, 1, marker(1)), 0.0).unwrap();
    run(e);
    a.extend(toks(12, 64));
    e.submit(req(2, &a, 1, marker(1)), e.clock() + 2000.0)
        .unwrap();
    run(e);
    let s2 = toks(30, 640);
    e.submit(
        req(3, &s2, 1, with_kind(marker(2), TurnKind::User)),
        e.clock() + 10.0,
    )
    .unwrap();
    run(e);
    e.submit(
        req(4, &toks(40, 2400), flood_tokens, None),
        e.clock() + 10.0,
    )
    .unwrap();
    a
}

#[test]
fn a_prefetched_tool_turn_returns_to_its_state_on_the_device() {
    let ret = |prefetch: bool| {
        let mut e = engine_prefetching(160, prefetch);
        let mut a = tool_session_pushed_to_host(&mut e, 1);
        run(&mut e);
        assert!(
            e.cache().host().record(&marker(1).unwrap().key).is_some(),
            "{:?} {:?}",
            e.cache().stats(),
            e.gauges()
        );
        a.extend(toks(13, 64));
        e.submit(req(5, &a, 1, marker(1)), e.clock() + 3000.0)
            .unwrap();
        let o = done(&run(&mut e), 5);
        e.cache().check().unwrap();
        (o, e.cache().stats())
    };
    let (off, s_off) = ret(false);
    let (on, s_on) = ret(true);
    assert_eq!((off.cached_tokens, off.restored_tokens), (1344, 1344));
    assert_eq!((on.cached_tokens, on.restored_tokens), (1344, 0), "{on:?}");
    assert_eq!(
        (s_off.prefetched, s_on.prefetched, s_on.prefetch_used),
        (0, 1, 1)
    );
    assert_eq!(s_on.prefetched_blocks, 84);
    assert!(
        on.ttft_ms() + off.restore_ms - 1e-9 <= off.ttft_ms(),
        "{on:?} vs {off:?}"
    );
    assert_eq!(
        on.computed_tokens(),
        off.computed_tokens(),
        "no extra recompute"
    );
}

#[test]
fn no_prefetch_while_running_work_holds_the_room() {
    let mut e = engine_prefetching(160, true);
    // The flood decodes for 2,000 tokens, past session 1's return.
    let mut a = tool_session_pushed_to_host(&mut e, 2000);
    let at = e.clock() + 3000.0;
    let mut out = Vec::new();
    e.advance(at, &mut out);
    assert!(e.cache().host().record(&marker(1).unwrap().key).is_some());
    a.extend(toks(13, 64));
    e.submit(req(5, &a, 1, marker(1)), at).unwrap();
    out.extend(run(&mut e));
    let o = done(&out, 5);
    let s = e.cache().stats();
    assert_eq!(
        s.prefetched, 0,
        "a prefetch took room from running work: {s:?}"
    );
    assert_eq!(o.restored_tokens, 1344, "served by a demand restore");
    e.cache().check().unwrap();
}

#[test]
fn demand_restores_take_the_host_link_before_prefetch_copies() {
    let mut e = engine_prefetching(160, true);
    let mut a = tool_session_pushed_to_host(&mut e, 1);
    run(&mut e);
    // The flood's end issued session 1's prefetch at the clock; session 2 (on the
    // host, never prefetched) returns at that instant and session 1 just after.
    let tf = e.clock();
    assert_eq!(e.cache().stats().prefetched, 1);
    let mut s2 = toks(30, 640);
    s2.extend(toks(31, 64));
    e.submit(req(6, &s2, 1, with_kind(marker(2), TurnKind::User)), tf)
        .unwrap();
    a.extend(toks(13, 64));
    e.submit(req(5, &a, 1, marker(1)), tf + 0.1).unwrap();
    let out = run(&mut e);
    let (o2, o1) = (done(&out, 6), done(&out, 5));
    let ms = |blocks: f64| blocks * 16.0 * 1024.0 / 1e6;
    assert_eq!(o2.restored_tokens, 640);
    assert!((o2.restore_ms - ms(40.0)).abs() < 1e-9, "{o2:?}");
    assert!(
        (o2.first_token - tf - o2.restore_ms - e.model().prefill_ms(64)).abs() < 1e-6,
        "the demand restore waited for the prefetch: {o2:?}"
    );
    assert_eq!((o1.restored_tokens, o1.cached_tokens), (0, 1344));
    assert!(
        o1.first_token >= tf + ms(84.0) + ms(40.0) - 1e-9,
        "session 1 did not wait for its prefetch, pushed back by the demand restore: {o1:?}"
    );
    e.cache().check().unwrap();
}

#[test]
fn prefetch_results_do_not_depend_on_how_often_time_is_advanced() {
    // Six tool sessions of four turns (prompts growing by 320 tokens) and requests
    // without a marker between them, on a device that holds about two sessions.
    let mut schedule: Vec<(u64, SimMs, Vec<u32>, Option<TurnMarker>)> = Vec::new();
    for turn in 0..4u32 {
        for s in 0..6u32 {
            let mut t = Vec::new();
            for k in 0..=turn {
                t.extend(toks(100 * s + k, 320));
            }
            let at = f64::from(turn) * 1500.0 + f64::from(s) * 97.0;
            schedule.push((schedule.len() as u64 + 1, at, t, marker(u128::from(s) + 1)));
        }
        let at = f64::from(turn) * 1500.0 + 700.0;
        schedule.push((schedule.len() as u64 + 1, at, toks(900 + turn, 1200), None));
    }
    schedule.sort_by(|a, b| a.1.total_cmp(&b.1));
    let outcomes = |step: f64| {
        let mut e = engine_prefetching(160, true);
        let mut out = Vec::new();
        let (mut t, mut next) = (0.0, 0);
        while next < schedule.len() || e.next_wakeup().is_some() {
            while next < schedule.len() && schedule[next].1 <= t {
                let (id, at, toks, mk) = &schedule[next];
                e.submit(req(*id, toks, 40, *mk), at.max(e.clock().min(t)))
                    .unwrap();
                next += 1;
            }
            e.advance(t, &mut out);
            t += step;
        }
        let mut d: Vec<(u64, u64, usize)> = out
            .iter()
            .filter_map(|ev| match ev {
                Event::Done { id, outcome } => Some((
                    *id,
                    (outcome.ttft_ms() * 1e6) as u64,
                    outcome.restored_tokens,
                )),
                _ => None,
            })
            .collect();
        d.sort();
        (d, e.cache().stats())
    };
    let (fine, stats) = outcomes(0.5);
    assert_eq!(fine.len(), 28);
    assert!(stats.prefetched > 0 && stats.prefetch_used > 0, "{stats:?}");
    let (coarse, stats_coarse) = outcomes(7.0);
    assert_eq!(fine, coarse);
    assert_eq!(stats, stats_coarse);
}

/// An admitted request's key is listed before its prompt end is retained
/// (waiting, then running), with its prompt's full blocks; a request without
/// a prompt-end marker, or an engine without retention, lists nothing; once it
/// finishes only the retention record remains.
#[test]
fn in_flight_keys_list_admitted_requests_until_they_finish() {
    let mut e = engine();
    let key = marker(0xa1).unwrap().key;
    e.submit(req(1, &toks(1, 100), 4, marker(0xa1)), 0.0)
        .unwrap();
    e.submit(req(2, &toks(2, 100), 4, None), 0.0).unwrap();
    let mut no_end = marker(0xb2);
    if let Some(m) = no_end.as_mut() {
        m.prompt_end = false;
    }
    e.submit(req(3, &toks(3, 100), 4, no_end), 0.0).unwrap();
    assert_eq!(e.in_flight_keys().collect::<Vec<_>>(), vec![(key, 96)]);
    assert_eq!(e.cache().retained().count(), 0, "nothing retained yet");
    // Running (the first step started), still listed.
    let mut out = Vec::new();
    e.advance(0.0, &mut out);
    assert_eq!(e.in_flight_keys().collect::<Vec<_>>(), vec![(key, 96)]);
    run(&mut e);
    assert_eq!(e.in_flight_keys().count(), 0);
    assert!(e.cache().retained().any(|(k, t, _)| k == key && t == 96));
    let mut off = engine_with(4096, 0, false, 64, 8192);
    off.submit(req(1, &toks(1, 100), 4, marker(0xa1)), 0.0)
        .unwrap();
    assert_eq!(off.in_flight_keys().count(), 0);
}

/// An unmetered request (the rank's rebalancing copy) is scheduled and
/// retained as any other — its KV crosses the link, its prompt end is held —
/// but none of its tokens, latencies or its finish reach the metrics; the
/// engine's busy time does count its step.
#[test]
fn an_unmetered_request_is_served_and_retained_but_not_counted() {
    let mut e = engine();
    e.submit(req(1, &toks(1, 500), 3, None), 0.0).unwrap();
    run(&mut e);
    let before = e.metrics().clone();
    let t = toks(7, 2000);
    let mut copy = req(2, &t, 1, marker(7));
    copy.kv_in_tokens = 2000 / BS * BS;
    copy.stream = false;
    e.submit_unmetered(copy, 100.0).unwrap();
    let ev = run(&mut e);
    let o = done(&ev, 2);
    assert_eq!(o.transferred_tokens, 2000 / BS * BS - BS, "{o:?}");
    let key = marker(7).unwrap().key;
    assert!(e.cache().retained().any(|(k, t, _)| k == key && t == 2000));
    let m = e.metrics();
    assert_eq!(
        (
            m.prompt_tokens,
            m.generation_tokens,
            m.finished,
            m.transferred_tokens
        ),
        (
            before.prompt_tokens,
            before.generation_tokens,
            before.finished,
            before.transferred_tokens
        )
    );
    assert_eq!(
        (m.ttft.count(), m.e2e.count(), m.queue.count()),
        (
            before.ttft.count(),
            before.e2e.count(),
            before.queue.count()
        )
    );
    assert!(m.busy_ms > before.busy_ms, "its step is engine time");
    // A request submitted after it is counted as usual.
    e.submit(req(3, &toks(3, 100), 2, None), 5000.0).unwrap();
    run(&mut e);
    assert_eq!(e.metrics().finished, before.finished + 1);
    assert!(e.unmetered.is_empty(), "its id is let go");
}

/// The busy share (`/load`'s `busy`) counts the time spent stepping: a lone
/// request's busy time over the time constant, decaying once idle, and the
/// part of a step in flight when read mid-step.
#[test]
fn the_busy_share_follows_the_steps() {
    let mut e = engine();
    assert_eq!(e.busy_share(0.0), 0.0);
    let t = toks(1, 2000);
    e.submit(req(1, &t, 3, None), 5.0).unwrap();
    // Mid-prefill: the step in flight counts up to now.
    let mut out = Vec::new();
    e.advance(50.0, &mut out);
    let mid = e.busy_share(50.0);
    assert!(mid > 0.0, "{mid}");
    let ev = run(&mut e);
    let o = done(&ev, 1);
    let end = 5.0 + o.e2e_ms();
    let busy = e.metrics().busy_ms;
    let share = e.busy_share(end);
    // All of the steps, at τ = 300 s: about busy / τ.
    let want = busy / tether_placement::BUSY_TAU_MS;
    assert!((share - want).abs() < want * 0.01, "{share} vs {want}");
    assert!(share > mid);
    // Idle for one τ keeps e⁻¹ of it; the gauges read at `now` say so too.
    let later = end + tether_placement::BUSY_TAU_MS;
    assert!((e.busy_share(later) - share * (-1.0f64).exp()).abs() < 1e-12);
    assert_eq!(e.gauges_at(later).busy, e.busy_share(later));
}

#[test]
fn the_reported_prefill_rate_is_what_a_full_step_prefills() {
    // Budget 8192: a lone cold prompt of 8192 tokens is one full step.
    let mut e = engine();
    let rate = e.gauges().prefill_tokens_per_s;
    assert!(rate > 0.0, "{rate}");
    let t = toks(3, 8192);
    e.submit(req(1, &t, 1, None), 0.0).unwrap();
    let o = done(&run(&mut e), 1);
    let want = 8192.0 / rate * 1e3;
    assert!(
        (o.ttft_ms() - want).abs() <= want * 0.01,
        "TTFT {} ms vs {want} ms at the reported {rate} tokens/s",
        o.ttft_ms()
    );
}
