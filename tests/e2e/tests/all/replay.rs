//! `tether replay` through real Envoy in front of real `tether-rank`
//! processes, with bootstraps rendered by `tether_envoy::render` (the code
//! behind `tether gateway`): tether routing against round robin, reports that
//! add up, a rank dying mid-replay, and every rendered mode validated by Envoy.

use crate::support::need_envoy_and_filter;
use serde_json::Map;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_e2e::stack::{rank_args, replay_blocking};
use tether_e2e::{Stack, StackSpec, paths};
use tether_envoy::{GatewaySpec, Mode, render};
use tether_fleet::replay::assemble::Source;
use tether_fleet::replay::{Options, Route, Schedule};
use tether_fleet::report::Report;
use tether_fleet::synth::{Identity, SynthOptions};
use tether_fleet::trace::{
    AgentSpec, EndReason, RequestSpec, SessionSpec, Trace, TraceBuilder, TurnKind,
};

const SPEEDUP: f64 = 100.0;

fn need_rank() {
    crate::support::need(paths::require(
        "tether-rank",
        paths::tether_rank_bin(),
        "run `cargo build -p tether-rank --bin tether-rank` (make test-e2e does)",
    ));
}

/// A short agent trace: `sessions` sessions of `turns` tool-loop turns on a
/// 1,280-token head of their own, each turn adding 3 blocks of 64 tokens;
/// every other session hands work to a 3-turn subagent after its second turn.
fn agent_trace(sessions: usize, turns: usize) -> Trace {
    let mut b = TraceBuilder::new(64).unwrap();
    let mut next_block = 0u64;
    let mut fresh = |n: u64| {
        let ids: Vec<u64> = (next_block..next_block + n).collect();
        next_block += n;
        ids
    };
    for s in 0..sessions {
        let sid = b
            .session(SessionSpec {
                id: format!("s{s}"),
                start_ms: Some(s as u64 * 1500),
                ..Default::default()
            })
            .unwrap();
        let main = b
            .agent(
                sid,
                AgentSpec {
                    id: "main".into(),
                    agent_type: "main".into(),
                    system_tokens: Some(1000),
                    tool_tokens: Some(200),
                    ..Default::default()
                },
            )
            .unwrap();
        let mut ids = fresh(20);
        let mut at = 0u64;
        for t in 0..turns {
            let (kind, ended) = match t {
                0 => (TurnKind::First, EndReason::ToolCall),
                _ if t + 1 == turns => (TurnKind::Tool, EndReason::EndTurn),
                _ => (TurnKind::Tool, EndReason::ToolCall),
            };
            let mut spec = RequestSpec::new(at, (ids.len() as u32) * 64 - 10, 24, kind);
            spec.ended_by = Some(ended);
            b.request(main, spec, &ids).unwrap();
            if s % 2 == 0 && t == 1 {
                let sub = b
                    .agent(
                        sid,
                        AgentSpec {
                            id: "explore".into(),
                            agent_type: "explore".into(),
                            parent: Some("main".into()),
                            spawned_by_turn: Some(1),
                            system_tokens: Some(600),
                            tool_tokens: Some(100),
                        },
                    )
                    .unwrap();
                let mut sub_ids = fresh(12);
                for k in 0..3u64 {
                    let kind = if k == 0 {
                        TurnKind::Handoff
                    } else {
                        TurnKind::Tool
                    };
                    b.request(
                        sub,
                        RequestSpec::new(
                            at + 1000 + k * 1500,
                            (sub_ids.len() as u32) * 64 - 5,
                            16,
                            kind,
                        ),
                        &sub_ids,
                    )
                    .unwrap();
                    sub_ids.extend(fresh(2));
                }
                at += 5000;
            }
            at += 2500;
            ids.extend(fresh(3));
        }
    }
    b.build().unwrap()
}

fn options(identity: Identity) -> Options {
    Options {
        targets: Vec::new(),
        route: Route::Session,
        schedule: Schedule::Fixed,
        max_inflight: 32,
        speedup: Some(SPEEDUP),
        max_gap_ms: 10_000,
        synth: SynthOptions {
            identity,
            ..Default::default()
        },
        timeout: Duration::from_secs(60),
        sessions: None,
        ranks: Vec::new(),
        gateway_admin: None,
        progress: false,
    }
}

fn run(trace: &Arc<Trace>, mode: Mode, identity: Identity, label: &str) -> Report {
    let mut spec = StackSpec::new(4, mode, &[]);
    spec.rank_args = rank_args(SPEEDUP, "lru", 1 << 20, 0.0);
    let stack = Stack::start(&spec).unwrap_or_else(|e| panic!("starting the stack: {e}"));
    let opts = stack.options(options(identity));
    let src = Source {
        path: "test".into(),
        format: "tether".into(),
    };
    let (r, _) = replay_blocking(trace, &src, &opts, label).unwrap();
    r
}

/// The report adds up: counts match the trace, cached ≤ prompt everywhere,
/// per-engine load sums to the totals, the configuration was read.
fn check_adds_up(r: &Report, trace: &Trace) {
    let requests = trace.requests().len() as u64;
    assert_eq!(r.requests.in_trace, requests);
    assert_eq!(r.requests.sent, requests, "{:?}", r.requests);
    assert_eq!(
        r.requests.completed, requests,
        "errors: {:?}",
        r.requests.errors_by_kind
    );
    assert_eq!(r.requests.errors, 0);
    assert!(r.tokens.cached <= r.tokens.prompt);
    assert_eq!(r.tokens.cached + r.tokens.computed, r.tokens.prompt);
    let input: u64 = trace
        .requests()
        .iter()
        .map(|q| u64::from(q.input_tokens))
        .sum();
    assert_eq!(
        r.tokens.prompt, input,
        "the rank counted exactly the trace's prompt tokens"
    );
    let output: u64 = trace
        .requests()
        .iter()
        .map(|q| u64::from(q.output_tokens))
        .sum();
    assert_eq!(r.tokens.output, output);
    let per_engine: u64 = r.load.engines.iter().map(|e| e.requests).sum();
    assert_eq!(per_engine, requests);
    assert_eq!(r.load.unattributed, 0);
    assert_eq!(r.load.engines.len(), 4);
    let engine_prompt: u64 = r.load.engines.iter().map(|e| e.prompt_tokens).sum();
    assert_eq!(engine_prompt, r.tokens.prompt);
    assert_eq!(r.run.clock, "simulated");
    assert!(r.hit_ratio.overall <= r.hit_ratio.ideal_global + 0.02);
    assert!(
        r.config.gateway.is_some(),
        "gateway configuration read from the admin"
    );
    assert_eq!(r.config.ranks.len(), 4);
    assert!(r.cost.usd_per_mtok.is_some_and(|c| c > 0.0));
    assert_eq!(r.cost.basis.as_deref(), Some("busy"));
    assert_eq!(
        r.trace.content_hash,
        tether_fleet::trace::content_hash(trace)
    );
}

/// Ranks started with their own `--rank-id` answer with that name, not an
/// address: the replay finds them among the gateway's endpoints (read from
/// Envoy's admin) and still reads their configuration and busy time, so the
/// report is costed; without the admin it says which ranks it could not read.
#[test]
fn ranks_with_their_own_ids_are_found_through_the_gateway() {
    need_envoy_and_filter();
    need_rank();
    // Sixteen sessions, so both ranks answer (keys hash over addresses whose
    // ports change per run: with four, all landed on one rank about one run
    // in eight, and a single answering name behind a single target is read
    // as "the target is that rank").
    let trace = Arc::new(agent_trace(16, 3));
    let mut spec = StackSpec::new(2, Mode::Pick, &[]);
    spec.rank_args = rank_args(SPEEDUP, "lru", 1 << 20, 0.0);
    spec.rank_id_prefix = Some("gpu-".into());
    let stack = Stack::start(&spec).unwrap_or_else(|e| panic!("starting the stack: {e}"));
    let src = Source {
        path: "test".into(),
        format: "tether".into(),
    };
    let mut opts = stack.options(options(Identity::None));
    opts.ranks.clear();
    let (r, out) = replay_blocking(&trace, &src, &opts, "ids").unwrap();
    let mut names: Vec<&str> = r.config.ranks.iter().map(|i| i.rank.as_str()).collect();
    names.sort();
    assert_eq!(names, ["gpu-0", "gpu-1"], "warnings: {:?}", out.warnings);
    assert!(r.cost.usd_per_mtok.is_some_and(|c| c > 0.0), "{:?}", r.cost);
    assert_eq!(r.cost.basis.as_deref(), Some("busy"));

    opts.gateway_admin = None;
    let (r, out) = replay_blocking(&trace, &src, &opts, "ids-blind").unwrap();
    let mut served: Vec<&str> = out
        .observations
        .iter()
        .filter_map(|o| o.served().and_then(|s| s.rank.as_deref()))
        .collect();
    served.sort();
    served.dedup();
    assert_eq!(served, ["gpu-0", "gpu-1"], "both ranks answer");
    assert!(r.config.ranks.is_empty(), "{:?}", r.config.ranks);
    assert!(
        out.warnings
            .iter()
            .any(|w| w.contains("gpu-0") && w.contains("--gateway-admin")),
        "{:?}",
        out.warnings
    );
}

#[test]
fn tether_routing_beats_round_robin_on_returning_turns() {
    need_envoy_and_filter();
    need_rank();
    let trace = Arc::new(agent_trace(12, 6));
    let rr = run(&trace, Mode::RoundRobin, Identity::None, "round-robin");
    let pick = run(&trace, Mode::Pick, Identity::None, "tether-pick");
    let hash = run(&trace, Mode::Hash, Identity::ClaudeCode, "tether-hash");
    for r in [&rr, &pick, &hash] {
        check_adds_up(r, &trace);
    }
    println!(
        "returning-turn hit: round robin {:.3}, pick {:.3}, hash {:.3} (ideal {:.3})",
        rr.hit_ratio.returning,
        pick.hit_ratio.returning,
        hash.hit_ratio.returning,
        rr.hit_ratio.ideal_session_returning
    );
    // Tether keeps every turn on the rank holding its prefix; round robin
    // finds it there only when an earlier turn happened to land on the same rank.
    assert!(
        pick.hit_ratio.returning >= rr.hit_ratio.returning + 0.25,
        "pick vs rr"
    );
    assert!(
        hash.hit_ratio.returning >= rr.hit_ratio.returning + 0.25,
        "hash vs rr"
    );
    assert!(
        pick.hit_ratio.of_ideal_returning >= 0.95,
        "{:?}",
        pick.hit_ratio
    );
    assert_eq!(
        rr.config
            .gateway
            .as_ref()
            .and_then(|g| g.lb_policy.as_deref()),
        Some("round_robin")
    );
    assert_eq!(
        pick.config
            .gateway
            .as_ref()
            .and_then(|g| g.lb_policy.as_deref()),
        Some("override_host")
    );
    let c = tether_fleet::report::compare::compare(&[rr, pick]).unwrap();
    assert!(
        c.changed.iter().any(|(k, _)| k == "gateway.lb_policy"),
        "{:?}",
        c.changed
    );
    assert!(c.changed.iter().any(|(k, _)| k == "gateway.plugin.mode"));
}

#[test]
fn a_rank_dying_mid_replay_is_counted_and_pick_mode_retries_on_the_fallback() {
    need_envoy_and_filter();
    need_rank();
    let trace = Arc::new(agent_trace(16, 8));
    let mut spec = StackSpec::new(4, Mode::Pick, &[]);
    spec.rank_args = rank_args(SPEEDUP, "lru", 1 << 20, 0.0);
    let mut stack = Stack::start(&spec).unwrap();
    let opts = stack.options(options(Identity::None));
    let src = Source {
        path: "test".into(),
        format: "tether".into(),
    };
    let victim = stack.ranks[1].addr().to_string();
    let started = Instant::now();
    let handle = {
        let trace = trace.clone();
        let opts = opts.clone();
        std::thread::spawn(move || replay_blocking(&trace, &src, &opts, "rank dies"))
    };
    // A third of the way through the trace's ~30 s (0.3 s of wall time at 100×).
    std::thread::sleep(Duration::from_millis(150));
    stack.ranks[1].kill();
    let (r, out) = handle.join().unwrap().unwrap();
    let took = started.elapsed();
    println!(
        "{:?} retried {} in {took:?}",
        r.requests, r.requests.retried
    );
    assert!(took < Duration::from_secs(60), "no hang: {took:?}");
    assert_eq!(
        r.requests.sent,
        trace.requests().len() as u64,
        "every request was still sent"
    );
    assert_eq!(r.requests.completed + r.requests.errors, r.requests.sent);
    // After the kill, requests placed on the dead rank were retried on their fallback.
    assert!(r.requests.retried > 0, "{:?}", r.requests);
    let after_kill = out
        .observations
        .iter()
        .filter_map(|o| o.served())
        .filter(|s| s.attempts > 1)
        .all(|s| s.rank.as_deref() != Some(victim.as_str()));
    assert!(after_kill, "a retried request was served by the dead rank");
    // In-flight requests on the dying rank fail and are counted, by kind.
    let counted: u64 = r.requests.errors_by_kind.values().sum();
    assert_eq!(counted, r.requests.errors);
}

#[test]
fn rendered_bootstraps_pass_envoy_validate() {
    need_envoy_and_filter();
    let wasm = paths::require_filter_wasm().unwrap().display().to_string();
    for mode in Mode::ALL {
        for n in [1usize, 4, 8] {
            let spec = GatewaySpec {
                mode,
                ranks: (0..n)
                    .map(|i| format!("127.0.0.1:{}", 18000 + i).parse().unwrap())
                    .collect(),
                dp_size: 2,
                plugin_config: Map::new(),
                filter_wasm: wasm.clone(),
                listen: "127.0.0.1:0".parse().unwrap(),
                admin: "127.0.0.1:0".parse().unwrap(),
                retries: 2,
                hash_balance_factor: Some(125),
                rank_names: Vec::new(),
                timeouts: tether_envoy::Timeouts::default(),
                eject_after: 5,
                eject_for_s: 30,
            };
            let yaml = render(&spec).unwrap();
            tether_e2e::Envoy::validate(&yaml)
                .unwrap_or_else(|e| panic!("{} × {n}: {e}", mode.name()));
        }
    }
}

/// `tether replay --route resident` with the ranks as targets (no gateway):
/// the replay polls their `/load`, places every request with the filter's
/// residency rule and sends the turn markers they retain by; returning turns
/// find their state where the replay sent them, where round robin over the
/// same ranks mostly does not.
#[test]
fn replay_route_resident_places_by_what_the_ranks_hold() {
    need_rank();
    let trace = Arc::new(agent_trace(12, 6));
    let mut args = rank_args(SPEEDUP, "retention", 1 << 20, 0.0);
    args.extend(["--role".to_owned(), "decode".to_owned()]);
    // The report and the share of prompt tokens the ranks did not compute
    // (cached, restored, or pulled from an old holder: a migrated turn's
    // state moves with `pull`, the default, and usage's cached tokens leave
    // the pulled part out).
    let run_over = |route: Route, label: &str| -> (Report, f64) {
        let ranks: Vec<tether_e2e::SimRank> = (0..4)
            .map(|_| tether_e2e::SimRank::start(&args).expect("tether-rank starts"))
            .collect();
        let origins: Vec<String> = ranks
            .iter()
            .map(|r| format!("http://{}", r.addr()))
            .collect();
        let mut opts = options(Identity::None);
        opts.targets = origins
            .iter()
            .map(|o| tether_fleet::replay::Target::parse(o).expect("target"))
            .collect();
        opts.route = route;
        opts.ranks = origins;
        let src = Source {
            path: "test".into(),
            format: "tether".into(),
        };
        let (r, _) = replay_blocking(&trace, &src, &opts, label).expect("replay");
        let computed: f64 = ranks
            .iter()
            .map(|k| k.metrics().expect("tether-rank /metrics"))
            .flat_map(|m| m.samples)
            .filter(|s| {
                s.name == "vllm:prompt_tokens_by_source_total"
                    && s.labels.get("source").map(String::as_str) == Some("local_compute")
            })
            .map(|s| s.value)
            .sum();
        drop(ranks);
        let saved = 1.0 - computed / (r.tokens.prompt as f64).max(1.0);
        (r, saved)
    };
    let rule = tether_placement::Rule {
        candidates: 3,
        bound: tether_placement::LoadBound {
            factor: 1.5,
            floor: 1.0,
        },
        cost: tether_placement::MoveCost::from_link(131_072.0, 50.0, 5.0, 20_000.0),
        unseen: tether_placement::Unseen::default(),
        over_bound: tether_placement::OverBound::default(),
    };
    let (resident, resident_saved) = run_over(
        Route::Resident {
            rule,
            poll_ms: 50,
            migrate: tether_fleet::sim::Migrate::Pull,
            own_rates: true,
        },
        "resident",
    );
    let (rr, rr_saved) = run_over(Route::RoundRobin, "round-robin");
    for r in [&resident, &rr] {
        // No gateway here: the rest of `check_adds_up` holds.
        assert_eq!(r.requests.completed, trace.requests().len() as u64);
        assert_eq!(r.requests.errors, 0, "{:?}", r.requests.errors_by_kind);
        assert_eq!(r.tokens.cached + r.tokens.computed, r.tokens.prompt);
        assert_eq!(r.load.unattributed, 0);
    }
    println!(
        "returning-turn hit: resident {:.3} ({:.3} of ideal), round robin {:.3}; \
         saved prefill: resident {resident_saved:.3}, round robin {rr_saved:.3}",
        resident.hit_ratio.returning, resident.hit_ratio.of_ideal_returning, rr.hit_ratio.returning
    );
    // Saved prefill, not cached tokens: since `pull` is the default a turn
    // the rule moves brings its state along, and counting only the cached
    // part put the margin at 0.239 once in CI (cached 0.734 vs 0.495).
    assert!(
        resident_saved >= rr_saved + 0.25,
        "resident vs round robin: saved prefill {resident_saved:.3} vs {rr_saved:.3}"
    );
    // 0.80, not more: at this trace's few requests in flight the load bound
    // (floor 1) hands a returning key over whenever its holder is briefly
    // the busiest, so the figure moves with timing — 0.849–0.990 (median
    // about 0.93) over 48 runs here, 0.846 once in CI beside the other tests —
    // while round robin sits near 0.5 of ideal.
    assert!(
        resident.hit_ratio.of_ideal_returning >= 0.80,
        "{:?}",
        resident.hit_ratio
    );
    // Every rank took work: new keys spread over their candidates.
    assert!(
        resident
            .load
            .engines
            .iter()
            .filter(|e| e.requests > 0)
            .count()
            >= 3,
        "{:?}",
        resident.load.engines
    );
}
