use super::*;
use crate::sim::config::PdOptions;
use crate::sim::testkit::agent_trace;
use tether_rank_engine::engine::EngineSettings;

fn profile() -> Profile {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"
    );
    Profile::from_file(std::path::Path::new(p)).unwrap()
}

fn cfg(policy: Policy, cache: CacheMode, ranks: usize) -> SimConfig {
    SimConfig {
        policy,
        cache,
        fleet: FleetShape::aggregated(ranks),
        engine: EngineSettings {
            block_size: 0,
            // Small devices, so the caches are under pressure.
            device_kv_tokens: Some(6 * 1024),
            ..EngineSettings::default()
        },
        host_bytes: 1 << 31,
        ..SimConfig::default()
    }
}

fn run(t: &Trace, c: &SimConfig) -> RunOutput {
    let oracle = oracle_hits(t, engine_block(t, c));
    simulate(t, &profile(), c, &oracle, true, None).unwrap()
}

#[test]
fn requests_are_conserved_and_hits_never_exceed_prompts_or_the_oracle() {
    let t = agent_trace(40, 6, 400, 150, 64);
    for policy in Policy::ALL {
        for cache in CacheMode::ALL {
            let out = run(&t, &cfg(policy, cache, 4));
            let r = &out.report;
            assert_eq!(
                r.finished + r.sim.refused + r.sim.failed,
                r.requests,
                "{}",
                r.label()
            );
            assert_eq!(r.requests, t.requests().len() as u64);
            assert_eq!(r.sim.refused + r.sim.failed, 0, "{}", r.label());
            assert_eq!(out.records.len() as u64, r.finished);
            let served: Vec<_> = out.records.iter().filter_map(|o| o.served()).collect();
            assert_eq!(served.len(), out.records.len());
            assert!(served.iter().all(|s| s.cached_tokens <= s.prompt_tokens));
            assert!(served.iter().all(|s| s.timing.ttft_ms > 0.0));
            let hits: u64 = served.iter().map(|s| s.cached_tokens).sum();
            assert_eq!(hits, r.hit_tokens, "{}", r.label());
            assert_eq!(r.hit_tokens + r.computed_tokens, r.prompt_tokens);
            assert!(
                r.hit_tokens <= r.sim.oracle_hit_tokens,
                "{}: {} hits > oracle {}",
                r.label(),
                r.hit_tokens,
                r.sim.oracle_hit_tokens
            );
            assert!(
                r.sim.gpu_seconds > 0.0
                    && r.sim.usd_per_mtok.is_finite()
                    && r.sim.tokens_per_gpu_s > 0.0
            );
        }
    }
}

#[test]
fn the_oracle_serves_every_block_seen_before() {
    let t = agent_trace(20, 5, 400, 100, 64);
    let r = run(&t, &cfg(Policy::Oracle, CacheMode::Lru, 4)).report;
    // Its hits are exactly the infinite cache's (every request's KV fits).
    assert_eq!(r.hit_tokens, r.sim.oracle_hit_tokens);
    assert!((r.sim.oracle_share - 1.0).abs() < 1e-12);
    assert!(r.returning.hit_ratio > 0.5);
}

#[test]
fn the_same_configuration_gives_the_same_result() {
    let t = agent_trace(30, 5, 300, 120, 64);
    for policy in [
        Policy::TetherBounded,
        Policy::TetherLoad,
        Policy::TetherResident,
        Policy::Prefix,
        Policy::ClientHash,
    ] {
        let c = cfg(policy, CacheMode::RetentionHost, 3);
        let (a, b) = (run(&t, &c), run(&t, &c));
        assert_eq!(a.records, b.records);
        let strip = |mut r: RunReport| {
            r.wall_s = 0.0;
            serde_json::to_string(&r).unwrap()
        };
        assert_eq!(strip(a.report), strip(b.report));
    }
}

#[test]
fn session_affinity_keeps_returning_turns_cached_and_round_robin_does_not() {
    let t = agent_trace(24, 6, 500, 200, 64);
    let tether = run(&t, &cfg(Policy::TetherBounded, CacheMode::Retention, 4)).report;
    let rr = run(&t, &cfg(Policy::RoundRobin, CacheMode::Retention, 4)).report;
    assert!(tether.returning.hit_ratio > 0.6, "{:?}", tether.returning);
    // Round robin still hits the shared system prompt (4 of every prompt's blocks).
    assert!(tether.returning.hit_ratio > rr.returning.hit_ratio + 0.1);
    assert!(tether.sim.oracle_share > rr.sim.oracle_share);
    assert!(tether.ttft_ms.mean < rr.ttft_ms.mean);
}

#[test]
fn disaggregated_serving_prefills_remotely_above_the_threshold_and_moves_the_kv() {
    let t = agent_trace(16, 4, 400, 150, 64);
    let mut c = cfg(Policy::TetherBounded, CacheMode::Retention, 3);
    c.fleet = FleetShape::disaggregated(2, 3);
    c.pd = PdOptions {
        threshold_tokens: 0,
        kv_link_gbps: 10.0,
        by_cost: false,
    };
    let r = run(&t, &c).report;
    let pd = r.sim.pd.unwrap();
    assert_eq!(r.finished, r.requests);
    assert_eq!(pd.remote_prefills, r.requests);
    assert!(pd.transferred_tokens > 0 && pd.transfer_ms_mean > 0.0);
    // With a high threshold returning turns (mostly cached on their decode rank) prefill in place.
    c.pd.threshold_tokens = 200;
    let r2 = run(&t, &c).report;
    let pd2 = r2.sim.pd.unwrap();
    assert_eq!(r2.finished, r2.requests);
    assert!(pd2.local_prefills > 0 && pd2.remote_prefills > 0, "{pd2:?}");
    assert!(pd2.remote_prefills < pd.remote_prefills);
    // The decode rank holds what was transferred to it: returning turns hit there.
    assert!(r2.returning.hit_ratio > 0.5, "{:?}", r2.returning);
    assert_eq!(r2.sim.gpus, 5);
}

#[test]
fn scaling_steps_charge_only_active_ranks() {
    let t = agent_trace(20, 4, 300, 200, 64);
    let full = run(&t, &cfg(Policy::Tether, CacheMode::Lru, 4)).report;
    let mut c = cfg(Policy::Tether, CacheMode::Lru, 4);
    c.fleet.steps = vec![
        crate::sim::Step {
            start_ms: 0.0,
            prefill: 0,
            decode: 2,
        },
        crate::sim::Step {
            start_ms: 2000.0,
            prefill: 0,
            decode: 4,
        },
    ];
    let scaled = run(&t, &c).report;
    assert_eq!(scaled.finished, scaled.requests);
    assert!(scaled.sim.gpu_seconds < full.sim.gpu_seconds);
    let expect = 2.0 * 2.0 + 4.0 * (scaled.span_s - 2.0);
    assert!(
        (scaled.sim.gpu_seconds - expect).abs() < 1e-6,
        "{} vs {expect}",
        scaled.sim.gpu_seconds
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let t = agent_trace(2, 2, 100, 100, 64);
    let p = profile();
    let o = oracle_hits(&t, 64);
    let err = |c: SimConfig| {
        simulate(&t, &p, &c, &o, false, None)
            .unwrap_err()
            .to_string()
    };
    let mut c = cfg(Policy::Oracle, CacheMode::Lru, 2);
    c.fleet = FleetShape::disaggregated(1, 1);
    assert!(err(c).contains("aggregated"));
    let mut c = cfg(Policy::Tether, CacheMode::Lru, 2);
    c.engine.block_size = 48;
    assert!(err(c).contains("divide"));
    let c = cfg(Policy::Tether, CacheMode::Lru, 0);
    assert!(err(c).contains("at least one"));
    let mut c = cfg(Policy::Tether, CacheMode::RetentionHost, 2);
    c.host_bytes = 0;
    assert!(err(c).contains("host"));
    let mut c = cfg(Policy::TetherBounded, CacheMode::Lru, 2);
    c.balance_factor = 1.0;
    assert!(err(c).contains("balance factor"));
    // No shared timeline.
    let nt = crate::sim::testkit::one_turn_sessions(
        vec![crate::trace::SessionSpec {
            id: "x".into(),
            ..Default::default()
        }],
        10,
        &[1],
    );
    let e = simulate(
        &nt,
        &p,
        &cfg(Policy::Tether, CacheMode::Lru, 1),
        &[0],
        false,
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("--stagger-ms"), "{e}");
}

/// The profile's `max_model_len` refuses exactly what `tether-rank` refuses:
/// prompt plus the requested output over the window (the rank's own rule).
#[test]
fn requests_over_the_context_window_are_refused_as_the_rank_refuses_them() {
    let t = agent_trace(6, 4, 400, 150, 64);
    let mut p = profile();
    let prompts: Vec<(u64, u64)> = t
        .requests()
        .iter()
        .map(|r| (u64::from(r.input_tokens), u64::from(r.output_tokens.max(1))))
        .collect();
    let mut lens: Vec<u64> = prompts.iter().map(|(i, o)| i + o).collect();
    lens.sort_unstable();
    let limit = lens[lens.len() / 2];
    p.max_model_len = Some(limit);
    let rank_rule = tether_rank_engine::engine::ContextLimit(Some(limit));
    let expect = prompts
        .iter()
        .filter(|(i, o)| rank_rule.check(*i, *o).is_err())
        .count() as u64;
    assert!(
        expect > 0 && expect < lens.len() as u64,
        "{expect} of {}",
        lens.len()
    );
    let c = cfg(Policy::Tether, CacheMode::Lru, 2);
    let oracle = oracle_hits(&t, engine_block(&t, &c));
    let out = simulate(&t, &p, &c, &oracle, true, None).unwrap();
    let r = &out.report;
    assert_eq!(r.sim.too_long, expect);
    assert_eq!(r.sim.refused, expect);
    assert_eq!(r.finished + r.sim.refused, r.requests);
    assert!(
        out.records
            .iter()
            .filter_map(|o| o.served())
            .all(|s| s.prompt_tokens + s.output_tokens <= limit)
    );
    // The oracle saves only what a fleet of this window could: a refused
    // request is served nothing and leaves nothing behind, so the oracle's
    // own run is the whole of it (with every request counted it read 27 %
    // of itself on a coding-agent trace through a 128 K window).
    let within = oracle_hits_within(&t, engine_block(&t, &c), rank_rule);
    for ((i, o), h) in prompts.iter().zip(&within) {
        if rank_rule.check(*i, *o).is_err() {
            assert_eq!(*h, 0);
        }
    }
    assert!(within.iter().zip(&oracle).all(|(w, o)| w <= o));
    let sum_served = |hits: &[u32]| -> u64 {
        (hits.iter().zip(&prompts))
            .filter(|(_, (i, o))| rank_rule.check(*i, *o).is_ok())
            .map(|(&h, _)| u64::from(h))
            .sum()
    };
    let c = cfg(Policy::Oracle, CacheMode::Lru, 2);
    let r = simulate(&t, &p, &c, &within, false, None).unwrap().report;
    assert_eq!(r.sim.refused, expect);
    assert_eq!(r.sim.oracle_hit_tokens, sum_served(&within));
    assert!(
        (r.sim.oracle_share - 1.0).abs() < 1e-12,
        "{}",
        r.sim.oracle_share
    );
    // Hits computed without the window: the refused still stay out of the
    // baseline.
    let r = simulate(&t, &p, &c, &oracle, false, None).unwrap().report;
    assert_eq!(r.sim.oracle_hit_tokens, sum_served(&oracle));
}

#[test]
fn residency_placement_keeps_the_cache_and_spreads_the_load() {
    // Generated agent sessions (heavy-tailed sizes), arriving 5 s apart and
    // replayed 5× faster on 8 full-size ranks.
    let t = crate::generate::generate(&crate::generate::GenerateOptions {
        seed: 3,
        sessions: 40,
        session_gap_ms: 5_000.0,
        // Inside the profile's 131,072-token window (nothing refused).
        max_context_tokens: 120_000,
        ..Default::default()
    })
    .unwrap();
    let mut c = cfg(Policy::Tether, CacheMode::RetentionHost, 8);
    c.engine.device_kv_tokens = None;
    c.speedup = 5.0;
    c.candidates = 3;
    let plain = run(&t, &c).report;
    c.policy = Policy::TetherResident;
    let out = run(&t, &c);
    let r = out.report;
    let counts = r.sim.resident.unwrap();
    eprintln!(
        "plain {:?}\nresident {:?}\n{counts:?}",
        plain.sim.balance, r.sim.balance
    );
    eprintln!(
        "oracle share {} vs {}",
        plain.sim.oracle_share, r.sim.oracle_share
    );
    assert_eq!(r.finished, r.requests);
    // Every decision is counted once per request (decode pool only here).
    assert_eq!(
        counts.stay + counts.least + counts.migrate + counts.recompute + counts.bounded,
        r.requests
    );
    // Returning keys mostly stay with their state; new keys are spread.
    assert!(counts.stay > counts.least, "{counts:?}");
    assert!(
        r.sim.oracle_share >= 0.95 * plain.sim.oracle_share,
        "{} vs {}",
        r.sim.oracle_share,
        plain.sim.oracle_share
    );
    assert!(r.sim.balance.busy_max_over_mean < plain.sim.balance.busy_max_over_mean);
    // Migrated turns are served from the transferred state, not recomputed.
    if counts.migrate > 0 {
        assert_eq!(counts.migrated_served, counts.migrate);
        assert!(counts.migrated_tokens > 0 && counts.migrate_transfer_ms_mean > 0.0);
    }
}

#[test]
fn an_overloaded_holder_hands_its_sessions_on_with_their_state() {
    // Few ranks, a tight bound, and every session on one rank at first: the
    // holder runs over the bound and keys move with their KV.
    let t = agent_trace(24, 10, 100, 5, 64);
    let mut c = cfg(Policy::TetherResident, CacheMode::Retention, 4);
    c.candidates = 4;
    c.resident_bound = tether_placement::LoadBound {
        factor: 1.1,
        floor: 1.0,
    };
    c.load_poll_ms = 20.0;
    c.engine.device_kv_tokens = Some(64 * 1024);
    // By legs first (pull is the default).
    c.migrate = crate::sim::Migrate::Leg;
    let r = run(&t, &c).report;
    let counts = r.sim.resident.unwrap();
    eprintln!("{counts:?} {:?}", r.returning);
    assert!(counts.migrate > 0, "{counts:?}");
    assert_eq!(counts.migrated_served, counts.migrate);
    assert!(counts.migrated_tokens > 0);
    // Pulled instead: the new rank reads the state, the old home runs nothing,
    // and the transferred tokens count as saved prefill.
    let mut pc = c.clone();
    pc.migrate = crate::sim::Migrate::Pull;
    let rp = run(&t, &pc).report;
    let cp = rp.sim.resident.unwrap();
    assert!(cp.migrate > 0 && cp.migrated_served == cp.migrate, "{cp:?}");
    assert!(cp.migrated_tokens > 0);
    assert!(rp.returning.hit_ratio > 0.5, "{:?}", rp.returning);
    // Over a link too slow to beat recompute, the same holders recompute instead.
    c.pd.kv_link_gbps = 0.001;
    let r0 = run(&t, &c).report;
    let c0 = r0.sim.resident.unwrap();
    assert_eq!(c0.migrate, 0, "{c0:?}");
    assert!(c0.recompute > 0, "{c0:?}");
    assert!(r.returning.hit_tokens > r0.returning.hit_tokens);
}

/// The pull's lease round trip (`transfer_setup_ms`) is in its TTFT, as
/// `tether-rank`'s is: with a 15 ms round trip no pulled turn (part of its
/// prompt neither on the new rank's device nor restored there) answers
/// sooner than 15 ms, and the fastest pulled turn answers at least 15 ms later
/// than with none. (Measured without the charge: the fastest pulled turn
/// answered in 21.7 ms at every round trip from 0 to 15 ms, so the second
/// check fails if the round trip is not charged; with it, 56.7 ms.)
#[test]
fn a_pull_waits_for_its_lease_round_trip() {
    let t = agent_trace(24, 10, 100, 5, 512);
    let mut c = cfg(Policy::TetherResident, CacheMode::Retention, 4);
    c.candidates = 4;
    c.resident_bound = tether_placement::LoadBound {
        factor: 1.1,
        floor: 1.0,
    };
    c.load_poll_ms = 20.0;
    c.engine.device_kv_tokens = Some(512 * 1024);
    assert_eq!(c.migrate, crate::sim::Migrate::Pull, "the default");
    // The same placements at both round trips: a longer one shifts busy time,
    // and the busy share would move which turns are pulled.
    c.resident_busy_weight = 0.0;
    let mut fastest = Vec::new();
    for setup in [0.0, 15.0] {
        c.transfer_setup_ms = setup;
        let pulled: Vec<f64> = run(&t, &c)
            .records
            .iter()
            .filter_map(|o| o.served())
            .filter(|s| {
                let local = s.device_cached_tokens.unwrap_or(0) + s.restored_tokens.unwrap_or(0);
                s.cached_tokens > local
            })
            .map(|s| s.timing.ttft_ms)
            .collect();
        let f = pulled.iter().copied().fold(f64::INFINITY, f64::min);
        eprintln!(
            "setup {setup} ms: {} pulled, fastest TTFT {f:.1} ms",
            pulled.len()
        );
        assert!(!pulled.is_empty() && f >= setup, "setup {setup}: {f}");
        fastest.push(f);
    }
    assert!(fastest[1] >= fastest[0] + 15.0, "{fastest:?}");
}

#[test]
fn session_affine_prefill_finds_the_session_on_its_prefill_rank() {
    let t = agent_trace(16, 6, 400, 150, 64);
    let mut c = cfg(Policy::TetherLoad, CacheMode::Retention, 3);
    c.fleet = FleetShape::disaggregated(3, 3);
    c.engine.device_kv_tokens = Some(64 * 1024);
    c.pd = PdOptions {
        threshold_tokens: 0,
        kv_link_gbps: 10.0,
        by_cost: false,
    };
    let by_load = run(&t, &c);
    c.policy = Policy::TetherResident;
    let affine = run(&t, &c);
    let hits = |o: &RunOutput| o.report.hit_tokens;
    eprintln!("hits by load {} affine {}", hits(&by_load), hits(&affine));
    assert_eq!(affine.report.finished, affine.report.requests);
    assert!(hits(&affine) > hits(&by_load));
    let counts = affine.report.sim.resident.unwrap();
    // Decode and prefill placements are both counted.
    assert!(
        counts.stay + counts.least + counts.migrate + counts.recompute > affine.report.requests
    );
}

/// P/D by cost: under `tether-resident` a returning turn whose decode holder
/// has its context is prefilled there (the prefill leg would recompute more),
/// while a cold prompt still goes remote; fewer prompt tokens are computed
/// than with the threshold alone.
#[test]
fn pd_by_cost_keeps_a_returning_turn_on_its_decode_holder() {
    let t = agent_trace(16, 6, 400, 150, 64);
    let mut c = cfg(Policy::TetherResident, CacheMode::Retention, 3);
    c.fleet = FleetShape::disaggregated(2, 3);
    // Ties by rendezvous order: with the busy share breaking them, this small
    // trace's sessions stay affine on the prefill pool as well (prefill busy
    // max/mean 1.14 against 2.0), every prefill rank holds as much as the decode
    // holder and the rule never has to choose.
    c.resident_busy_weight = 0.0;
    c.engine.device_kv_tokens = Some(64 * 1024);
    c.pd = PdOptions {
        threshold_tokens: 0,
        kv_link_gbps: 10.0,
        by_cost: false,
    };
    let by_threshold = run(&t, &c).report;
    c.pd.by_cost = true;
    let by_cost = run(&t, &c).report;
    let (pt, pc) = (by_threshold.sim.pd.unwrap(), by_cost.sim.pd.unwrap());
    eprintln!("threshold {pt:?}\ncost {pc:?}");
    assert_eq!(by_cost.finished, by_cost.requests);
    assert_eq!(pt.kept_local_by_cost, 0);
    assert!(pc.kept_local_by_cost > 0, "{pc:?}");
    // Every session's first turn is cold on both pools: still disaggregated.
    assert!(pc.remote_prefills >= 16, "{pc:?}");
    assert!(pc.remote_prefills < pt.remote_prefills);
    assert!(
        by_cost.computed_tokens < by_threshold.computed_tokens,
        "{} vs {}",
        by_cost.computed_tokens,
        by_threshold.computed_tokens
    );
}

#[test]
fn resident_settings_out_of_range_are_refused() {
    let t = agent_trace(2, 2, 100, 10, 64);
    let mut c = cfg(Policy::TetherResident, CacheMode::Retention, 2);
    c.candidates = 0;
    let oracle = oracle_hits(&t, 64);
    let e = simulate(&t, &profile(), &c, &oracle, false, None).unwrap_err();
    assert!(e.to_string().contains("candidate"), "{e}");
    c.candidates = 2;
    c.resident_bound.factor = 1.0;
    let e = simulate(&t, &profile(), &c, &oracle, false, None).unwrap_err();
    assert!(e.to_string().contains("factor"), "{e}");
}

/// Rebalancing in tool gaps: on generated agent traffic over 4 ranks, homes
/// holding more KV than the mean copy tool turns' states to cooler candidates;
/// copies are never trace requests (every request finished once, the same
/// prompt tokens), each returning turn settles its twins once, and the cache
/// hit ratio stays within 2 points of the same run without rebalancing.
#[test]
fn rebalancing_copies_states_in_tool_gaps_without_counting_them_as_requests() {
    let t = crate::generate::generate(&crate::generate::GenerateOptions {
        seed: 5,
        sessions: 24,
        session_gap_ms: 3_000.0,
        max_context_tokens: 60_000,
        ..Default::default()
    })
    .unwrap();
    let mut c = cfg(Policy::TetherResident, CacheMode::RetentionHost, 4);
    c.engine.device_kv_tokens = Some(96 * 1024);
    c.speedup = 4.0;
    c.load_poll_ms = 100.0;
    let plain = run(&t, &c).report;
    c.rebalance = Some(tether_placement::Rebalance { kv_factor: 1.05 });
    let r = run(&t, &c).report;
    let k = r.sim.resident.unwrap();
    eprintln!(
        "{k:?}\nplain {:?}\nrebalanced {:?}",
        plain.sim.balance, r.sim.balance
    );
    assert!(k.rebalanced > 0 && k.rebalanced_tokens > 0, "{k:?}");
    assert_eq!(
        (r.finished, r.prompt_tokens),
        (plain.finished, plain.prompt_tokens)
    );
    assert!(
        k.rebalance_used + k.rebalance_unused <= k.rebalanced,
        "{k:?}"
    );
    assert!(k.rebalance_used > 0, "{k:?}");
    // Homes let their device copy go to the host tier when a copy lands.
    assert!(
        k.rebalance_demoted > 0 && k.rebalance_demoted <= k.rebalanced,
        "{k:?}"
    );
    assert!(
        r.hit_ratio > plain.hit_ratio - 0.02,
        "{} vs {}",
        r.hit_ratio,
        plain.hit_ratio
    );
    assert!(plain.sim.balance.kv_imbalance_p95 > 0.0);
    // Refused: a factor that relieves every rank.
    c.rebalance = Some(tether_placement::Rebalance { kv_factor: 1.0 });
    let oracle = oracle_hits(&t, engine_block(&t, &c));
    let e = simulate(&t, &profile(), &c, &oracle, false, None).unwrap_err();
    assert!(e.to_string().contains("KV factor"), "{e}");
}
