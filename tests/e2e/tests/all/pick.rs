//! Pick mode through `envoy/demo.yaml` (override_host): sessions and
//! subagents stay on one rank across many turns, subagents spread, a client IP
//! change moves nothing, body-only identities route, spoofed headers are dropped.

use crate::support::*;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::bootstrap;

fn fleet() -> Fleet {
    Fleet::pick(bootstrap::DEMO, 4, &[1, 1, 1, 2], json!({}), &[])
}

/// Grows a conversation by one turn: mostly tool rounds, every fourth a user reply.
fn grow(conv: &mut Conversation, t: usize) -> &'static str {
    if t % 4 == 3 {
        conv.assistant(&format!("step {t} done"));
        conv.user(&format!("next, part {t}"));
        "user"
    } else {
        conv.tool_round(
            &format!("call_{t}"),
            "Read",
            json!({"arg": format!("src/f{t}.rs")}),
            &format!("contents of f{t}"),
        );
        "tool"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_and_its_subagents_each_keep_one_rank_for_20_plus_turns() {
    let f = fleet();
    let session = "sess-3b1f0c";
    let mut main = Conversation::new(
        Api::Messages,
        "You are the planner.",
        &["Read", "Task"],
        "fix the flaky test",
    );
    let mut places = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let mut retries = 0;
    for t in 0..24 {
        if t > 0 {
            grow(&mut main, t);
        }
        let req = header_turn(&main, session, None);
        let e = f.echo(req.clone()).await;
        assert_eq!(
            e.header("x-tether-key-source"),
            Some("header:x-claude-code-session-id"),
            "turn {t}"
        );
        assert_eq!(
            e.header("x-tether-subagent"),
            Some("0000000000000000"),
            "main agent"
        );
        // The header path never reads the body: a prompt end, but no turn kind.
        assert_eq!(e.header("x-tether-prompt-end"), Some("1"), "turn {t}");
        assert_eq!(e.header("x-tether-turn-kind"), None, "turn {t}");
        places.insert(place(&e));
        keys.insert(e.header("x-tether-key").map(str::to_owned));
        if t % 5 == 2 {
            // The harness retries the very same request: same key, same rank.
            let again = f.echo(req).await;
            assert_eq!(place(&again), place(&e), "retry of turn {t} moved");
            retries += 1;
        }
    }
    assert_eq!(places.len(), 1, "main agent moved: {places:?}");
    assert_eq!(keys.len(), 1, "main agent key changed: {keys:?}");
    assert!(retries >= 4);

    // Twelve subagents of the same session, OpenAI Chat with tool calls, 20
    // turns each (interleaved, as a fan-out runs), every seventh retried.
    let mut by_agent: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    let mut convs: Vec<Conversation> = (0..12)
        .map(|i| {
            Conversation::new(
                Api::Chat,
                &format!("You are worker {i}."),
                &["bash"],
                &format!("subtask {i}"),
            )
        })
        .collect();
    for t in 0..20 {
        for (i, conv) in convs.iter_mut().enumerate() {
            if t > 0 {
                grow(conv, t);
            }
            let agent = format!("agent-{i:02}");
            let req = header_turn(conv, session, Some(&agent));
            let e = f.echo(req.clone()).await;
            let slot = by_agent.entry(agent).or_default();
            slot.0.insert(place(&e));
            if t % 7 == 6 {
                slot.0.insert(place(&f.echo(req).await));
            }
            slot.1
                .insert(e.header("x-tether-key").unwrap_or_default().to_owned());
        }
    }
    for (agent, (p, k)) in &by_agent {
        assert_eq!(p.len(), 1, "{agent} moved: {p:?}");
        assert_eq!(k.len(), 1, "{agent} key changed: {k:?}");
    }
    let sub_keys: BTreeSet<&String> = by_agent.values().flat_map(|(_, k)| k.iter()).collect();
    assert_eq!(sub_keys.len(), 12, "every subagent has its own key");
    assert!(
        !keys.iter().flatten().any(|k| sub_keys.contains(k)),
        "subagent keys differ from the main agent's"
    );
    let endpoints: BTreeSet<String> = by_agent
        .values()
        .flat_map(|(p, _)| p.iter())
        .map(|p| p.split('/').next().unwrap_or_default().to_owned())
        .collect();
    println!("12 subagents over endpoints: {endpoints:?}");
    assert!(
        endpoints.len() >= 2,
        "subagents of one session spread over ranks, got {endpoints:?}"
    );

    // Prometheus shows the filter's counters (header path used by every request above).
    let m = f.metrics();
    let header_path = counter(&m, "tether_requests_header_path");
    let names: Vec<&str> = m
        .names()
        .into_iter()
        .filter(|n| n.contains("tether_requests"))
        .collect();
    println!("prometheus names: {names:?}");
    assert!(
        header_path >= 24.0 + 240.0,
        "tether_requests_header_path = {header_path}; names: {:?}",
        m.names()
    );
    assert!(counter(&m, "tether_key_source_header_x_claude_code_session_id") >= 264.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ip_change_does_not_move_a_session() {
    let f = fleet();
    let before: IpAddr = [127, 0, 0, 1].into();
    let after: IpAddr = [127, 0, 0, 2].into();
    for s in 0..8 {
        let session = format!("ip-change-{s}");
        let mut conv = Conversation::new(Api::Messages, "sys", &["Read"], "hello");
        let mut seen = BTreeSet::new();
        for t in 0..6 {
            if t > 0 {
                grow(&mut conv, t);
            }
            let ip = if t < 3 { before } else { after };
            let resp = f
                .client
                .clone()
                .bind(ip)
                .send(f.envoy.listen_addr(), header_turn(&conv, &session, None))
                .await;
            let e = echo_of(resp.expect("answered"));
            // Envoy saw the real peer address (use_remote_address): the IP did change.
            assert_eq!(
                e.header("x-envoy-external-address"),
                Some(ip.to_string().as_str()),
                "peer address seen by Envoy"
            );
            seen.insert(place(&e));
        }
        assert_eq!(
            seen.len(),
            1,
            "{session} moved when the client IP changed: {seen:?}"
        );
    }
}

/// Top-level body fields naming the session.
type Identity = Vec<(&'static str, serde_json::Value)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_only_identities_route_on_the_body_path() {
    let f = fleet();
    let before = counter(&f.metrics(), "tether_requests_body_path");
    let cases: Vec<(Api, &str, Identity)> = vec![
        (
            Api::Responses,
            "body:prompt_cache_key",
            vec![("prompt_cache_key", json!("pck-1"))],
        ),
        (
            Api::Chat,
            "body:session_id",
            vec![("session_id", json!("sid-1"))],
        ),
        (
            Api::Messages,
            "body:metadata.user_id",
            vec![("metadata", json!({"user_id": "user_x_session_9"}))],
        ),
        (
            Api::Chat,
            "body:vllm_xargs.agentic_context.session_id",
            vec![(
                "vllm_xargs",
                json!({"agentic_context": {"session_id": "vx-1"}}),
            )],
        ),
    ];
    let mut sent = 0;
    for (api, source, identity) in cases {
        let mut conv = Conversation::new(api, "You are a verifier.", &["bash"], "verify");
        let mut seen = BTreeSet::new();
        for t in 0..6 {
            let kind = if t == 0 { "first" } else { grow(&mut conv, t) };
            let e = f.echo(body_turn(&conv, &identity)).await;
            sent += 1;
            assert_eq!(
                e.header("x-tether-key-source"),
                Some(source),
                "{api:?} turn {t}: {:?}",
                e.headers
            );
            // The body path reads the conversation's end: the turn markers are there.
            assert_eq!(
                e.header("x-tether-turn-kind"),
                Some(kind),
                "{api:?} turn {t}"
            );
            assert_eq!(
                e.header("x-tether-prompt-end"),
                Some("1"),
                "{api:?} turn {t}"
            );
            // header_mutation copied the body-path decision into headers.
            assert!(e.header("x-tether-key").is_some_and(|k| k.len() == 16));
            assert!(e.header("x-gateway-destination-endpoint").is_some());
            seen.insert((place(&e), e.header("x-tether-key").map(str::to_owned)));
        }
        assert_eq!(seen.len(), 1, "{source}: moved or rekeyed: {seen:?}");
    }
    // Two subagents sharing one prompt_cache_key (no agent id) still get their own keys.
    let a = Conversation::new(
        Api::Responses,
        "You are the test writer.",
        &["bash"],
        "write tests",
    );
    let b = Conversation::new(
        Api::Responses,
        "You are the reviewer.",
        &["grep"],
        "review the diff",
    );
    let id = [("prompt_cache_key", json!("shared-run-7"))];
    let (ea, eb) = (
        f.echo(body_turn(&a, &id)).await,
        f.echo(body_turn(&b, &id)).await,
    );
    sent += 2;
    assert_ne!(
        ea.header("x-tether-key"),
        eb.header("x-tether-key"),
        "subagents sharing prompt_cache_key"
    );
    let after = counter(&f.metrics(), "tether_requests_body_path");
    assert!(
        after - before >= sent as f64,
        "body-path counter {before} -> {after}, sent {sent}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_internal_headers_are_dropped_on_both_paths() {
    let f = fleet();
    let conv = Conversation::new(Api::Responses, "sys", &[], "hi");
    let spoof = |req: tether_e2e::Request, victim: &str| {
        req.header("x-tether-key", "ffffffffffffffff")
            .header("x-tether-key-source", "header:evil")
            .header("x-tether-subagent", "1111111111111111")
            .header("x-tether-turn-kind", "handoff")
            .header("x-gateway-destination-endpoint", victim)
            .header("x-data-parallel-rank", "9")
    };
    let header_req = header_turn(&conv, "honest-session", None);
    let body_req = body_turn(&conv, &[("prompt_cache_key", json!("honest-pck"))]);
    for (path, req) in [("header", header_req), ("body", body_req)] {
        let honest = f.echo(req.clone()).await;
        let chosen = place(&honest);
        let victim = f
            .ranks
            .iter()
            .find(|r| !chosen.starts_with(r.name()))
            .expect("another rank")
            .addr()
            .to_string();
        let e = f.echo(spoof(req, &victim)).await;
        assert_eq!(
            place(&e),
            chosen,
            "{path} path: spoofed endpoint/DP rank took effect"
        );
        for h in [
            "x-tether-key",
            "x-tether-key-source",
            "x-tether-subagent",
            "x-tether-turn-kind",
            "x-gateway-destination-endpoint",
        ] {
            assert_eq!(e.header(h), honest.header(h), "{path} path: {h} spoofed");
        }
        assert_ne!(e.header("x-tether-key"), Some("ffffffffffffffff"));
        assert_ne!(e.header("x-data-parallel-rank"), Some("9"));
    }
    assert!(counter(&f.metrics(), "tether_spoofed_header_removed") >= 2.0);
}
