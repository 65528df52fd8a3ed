//! Whole decisions per format and identity source, as the glue would get them.

use super::*;
use crate::emit::{cache_salt, rewrite};
use crate::read::header_names::{ReadHeaders, is_internal_header};
use crate::read::identity::Headers;
use crate::read::{identity, turn};
use crate::testkit::{ALL_APIS, ALL_ORDERS, Convo, Order, SliceFetch, Step, headers};
use serde_json::{Value as J, json};

/// A configuration with every output on (`"outputs": "all"`) unless it names
/// its own: these tests look at whole decisions, turn markers included.
fn cfg(extra: &str) -> Config {
    let mut v: J = if extra.trim().is_empty() {
        json!({})
    } else {
        serde_json::from_str(extra).unwrap()
    };
    if let Some(o) = v.as_object_mut() {
        o.entry("outputs").or_insert(json!("all"));
    }
    Config::parse(v.to_string().as_bytes()).unwrap()
}

fn path_of(api: Api) -> &'static str {
    match api {
        Api::Chat => "/v1/chat/completions",
        Api::Responses => "/v1/responses",
        Api::Messages => "/v1/messages",
        Api::Completions => "/v1/completions",
    }
}

/// Runs header + body callbacks like the glue; returns the decision.
fn decide(cfg: &Config, api: Api, hdrs: &[(&str, &str)], body: &[u8]) -> Plan {
    let pools = Pools::new(cfg);
    let mut h = headers(&[
        (":path", path_of(api)),
        ("content-type", "application/json"),
    ]);
    h.extend(headers(hdrs));
    match on_headers(cfg, &pools, &h, body.is_empty()) {
        HeaderOutcome::Untouched => panic!("untouched"),
        HeaderOutcome::Decided(d) => *d,
        HeaderOutcome::ReadBody { api, reason } => {
            let mut f = SliceFetch::new(body);
            on_body(cfg, &pools, api, &h, body.len(), reason, &mut |s, l| {
                f.fetch(s, l)
            })
        }
    }
}

fn key(d: &Plan) -> u64 {
    d.read.identity.key()
}

#[test]
fn every_session_source_kind_is_found_in_every_format_and_order() {
    let c = cfg("");
    let base = Convo::new("You are a coder.", "Fix the bug in main.rs");
    let cases: Vec<(&str, J)> = vec![
        ("body:session_id", json!({"session_id": "s-1"})),
        (
            "body:vllm_xargs.agentic_context.session_id",
            json!({"vllm_xargs": {"agentic_context": {"session_id": "s-1"}}}),
        ),
        (
            "body:nvext.agent_context.session_id",
            json!({"nvext": {"agent_context": {"session_id": "s-1"}}}),
        ),
        ("body:prompt_cache_key", json!({"prompt_cache_key": "s-1"})),
        (
            "body:metadata.session_id",
            json!({"metadata": {"session_id": "s-1"}}),
        ),
        (
            "body:metadata.user_id",
            json!({"metadata": {"user_id": "user_x_session_s-1"}}),
        ),
        ("body:user+head", json!({"user": "alice"})),
    ];
    for api in ALL_APIS {
        for order in ALL_ORDERS {
            for (label, fields) in &cases {
                let mut convo = base.clone();
                for (k, v) in fields.as_object().unwrap() {
                    let k: &'static str = Box::leak(k.clone().into_boxed_str());
                    convo = convo.extra(k, v.clone());
                }
                let d = decide(&c, api, &[], &convo.body(api, order));
                assert_eq!(d.read.source, *label, "{api:?} {order:?}");
                assert!(!d.read.header_path);
                // The same run one turn later keeps its key.
                let later = convo
                    .clone()
                    .with(Step::User("and the tests".into()))
                    .body(api, order);
                if api != Api::Completions {
                    assert_eq!(
                        key(&decide(&c, api, &[], &later)),
                        key(&d),
                        "{api:?} {order:?} {label}"
                    );
                }
            }
            let d = decide(&c, api, &[], &base.body(api, order));
            assert_eq!(d.read.source, "head", "{api:?} {order:?}");
        }
    }
}

#[test]
fn header_sources_decide_in_the_header_callback() {
    let c = cfg("");
    let pools = Pools::new(&c);
    for name in [
        "x-session-id",
        "x-claude-code-session-id",
        "session-id",
        "session_id",
        "x-session-affinity",
        "x-opencode-session",
        "x-dynamo-session-id",
    ] {
        let h = headers(&[(":path", "/v1/messages"), (name, "run-7")]);
        let HeaderOutcome::Decided(d) = on_headers(&c, &pools, &h, false) else {
            panic!("{name}: not decided")
        };
        assert_eq!(d.read.source, format!("header:{name}"));
        assert!(d.read.header_path && d.read.turn.is_none());
        // Still a prompt end for the engine, but no kind it could not know.
        let out = &d.request_headers(&c, &pools);
        let get = |h: &str| out.iter().find(|(n, _)| *n == h).map(|(_, v)| v.as_str());
        assert_eq!(get("x-tether-prompt-end"), Some("1"), "{name}");
        assert_eq!(get("x-tether-turn-kind"), None, "{name}");
    }
    // Order matters: x-session-id wins over session-id.
    let h = headers(&[
        (":path", "/v1/messages"),
        ("session-id", "b"),
        ("x-session-id", "a"),
    ]);
    let HeaderOutcome::Decided(d) = on_headers(&c, &pools, &h, false) else {
        panic!()
    };
    assert_eq!(d.read.source, "header:x-session-id");
}

#[test]
fn key_ignores_client_address_and_user_but_not_subagent() {
    let c = cfg("");
    let body = Convo::new("s", "task").body(Api::Chat, Order::Sdk);
    let a = decide(
        &c,
        Api::Chat,
        &[("x-session-id", "r"), ("x-forwarded-for", "1.2.3.4")],
        &body,
    );
    let b = decide(
        &c,
        Api::Chat,
        &[
            ("x-session-id", "r"),
            ("x-forwarded-for", "5.6.7.8"),
            ("user-agent", "other"),
        ],
        &body,
    );
    assert_eq!(key(&a), key(&b));
    let s1 = decide(
        &c,
        Api::Chat,
        &[("x-session-id", "r"), ("x-claude-code-agent-id", "planner")],
        &body,
    );
    let s2 = decide(
        &c,
        Api::Chat,
        &[
            ("x-session-id", "r"),
            ("x-claude-code-agent-id", "verifier"),
        ],
        &body,
    );
    assert_ne!(key(&s1), key(&a));
    assert_ne!(key(&s1), key(&s2));
    assert_eq!(a.read.identity.subagent_hash(), 0);
    assert_ne!(s1.read.identity.subagent_hash(), 0);
}

#[test]
fn subagents_sharing_a_body_session_field_get_their_own_keys() {
    let c = cfg("");
    for api in [Api::Chat, Api::Responses, Api::Messages] {
        let main = Convo::new("main agent", "build it").extra("prompt_cache_key", json!("run"));
        let sub =
            Convo::new("explorer subagent", "find files").extra("prompt_cache_key", json!("run"));
        let km = key(&decide(&c, api, &[], &main.body(api, Order::Sdk)));
        let ks = key(&decide(&c, api, &[], &sub.body(api, Order::Sdk)));
        assert_ne!(km, ks, "{api:?}");
        // An explicit agent id also separates them and needs no head.
        let a = main.clone().extra(
            "vllm_xargs",
            json!({"agentic_context": {"session_id": "run", "agent_id": "a1"}}),
        );
        let d = decide(&c, api, &[], &a.body(api, Order::Sdk));
        assert_eq!(d.read.source, "body:vllm_xargs.agentic_context.session_id");
        assert_ne!(d.read.identity.subagent_hash(), 0);
    }
}

#[test]
fn tenant_is_part_of_every_key() {
    let c = cfg(r#"{"tenant_header":"x-auth-tenant"}"#);
    let body = Convo::new("s", "t").body(Api::Chat, Order::Sdk);
    let a = decide(
        &c,
        Api::Chat,
        &[("x-session-id", "r"), ("x-auth-tenant", "acme")],
        &body,
    );
    let b = decide(
        &c,
        Api::Chat,
        &[("x-session-id", "r"), ("x-auth-tenant", "globex")],
        &body,
    );
    assert_ne!(key(&a), key(&b));
    assert_ne!(a.read.identity.tenant_hash(), b.read.identity.tenant_hash());
}

/// The tenant scopes every hash that leaves the filter, not only the key: two
/// tenants using the same session, subagent and parent names share nothing.
#[test]
fn tenant_scopes_the_session_subagent_and_parent_hashes() {
    let c = cfg(r#"{"tenant_header":"x-auth-tenant"}"#);
    let body = Convo::new("s", "t").body(Api::Chat, Order::Sdk);
    let run = |tenant: &str| {
        decide(
            &c,
            Api::Chat,
            &[
                ("x-session-id", "r"),
                ("x-claude-code-agent-id", "a"),
                ("x-parent-session-id", "p"),
                ("x-auth-tenant", tenant),
            ],
            &body,
        )
        .read
        .identity
    };
    let (a, b) = (run("acme"), run("globex"));
    assert_eq!(
        (a.session.as_slice(), b.session.as_slice()),
        (&b"r"[..], &b"r"[..])
    );
    assert_ne!(a.session_hash(), b.session_hash());
    assert_ne!(a.subagent_hash(), b.subagent_hash());
    assert_ne!(a.parent_hash(), b.parent_hash());
    assert!(a.parent_hash().is_some());
    // Each hash is the placement crate's, over this tenant's raw values.
    use tether_placement::keys;
    assert_eq!(a.session_hash(), keys::session_hash(b"acme", b"r"));
    assert_eq!(a.subagent_hash(), keys::subagent_hash(b"acme", Some(b"a")));
    assert_eq!(a.parent_hash(), Some(keys::parent_hash(b"acme", b"p")));
    assert_eq!(a.tenant_hash(), keys::tenant_hash(b"acme"));
    assert_eq!(
        key(&decide(
            &c,
            Api::Chat,
            &[
                ("x-session-id", "r"),
                ("x-claude-code-agent-id", "a"),
                ("x-auth-tenant", "acme")
            ],
            &body
        )),
        keys::routing_key(b"acme", b"r", Some(b"a"))
    );
}

/// Body identity values have the same length limit as headers: up to
/// `MAX_ID_BYTES` is an id, one byte more is skipped as bad (and counted), so
/// the next source decides; long numbers are not ids at all.
#[test]
fn body_identity_values_have_a_length_limit() {
    let c = cfg("");
    let at_limit = "s".repeat(identity::MAX_ID_BYTES);
    let over = "s".repeat(identity::MAX_ID_BYTES + 1);
    let body = |sid: &J| {
        Convo::new("sys", "task")
            .extra("session_id", sid.clone())
            .extra("prompt_cache_key", json!("pck"))
            .body(Api::Chat, Order::Sdk)
    };
    let d = decide(&c, Api::Chat, &[], &body(&json!(at_limit)));
    assert_eq!(
        (d.read.source.as_str(), d.read.bad_headers),
        ("body:session_id", 0)
    );
    assert_eq!(d.read.identity.session, at_limit.as_bytes());
    let d = decide(&c, Api::Chat, &[], &body(&json!(over)));
    assert_eq!(
        (d.read.source.as_str(), d.read.bad_headers),
        ("body:prompt_cache_key", 1)
    );
    // Numbers: up to 64 characters are ids, longer ones are absent (not counted).
    let raw = |n: usize| {
        format!(
            r#"{{"session_id":{},"prompt_cache_key":"pck","messages":[{{"role":"user","content":"hi"}}]}}"#,
            "7".repeat(n)
        )
    };
    let d = decide(&c, Api::Chat, &[], raw(64).as_bytes());
    assert_eq!(d.read.source, "body:session_id");
    let d = decide(&c, Api::Chat, &[], raw(65).as_bytes());
    assert_eq!(
        (d.read.source.as_str(), d.read.bad_headers),
        ("body:prompt_cache_key", 0)
    );
    // Headers: the same limit, at the byte.
    let d = decide(
        &c,
        Api::Chat,
        &[("x-session-id", &at_limit)],
        &body(&json!("b")),
    );
    assert_eq!(
        (d.read.source.as_str(), d.read.bad_headers),
        ("header:x-session-id", 0)
    );
    let d = decide(
        &c,
        Api::Chat,
        &[("x-session-id", &over)],
        &body(&json!("b")),
    );
    assert_eq!(
        (d.read.source.as_str(), d.read.bad_headers),
        ("body:session_id", 1)
    );
}

/// Unusable subagent, parent and tenant headers are skipped and each is counted
/// once; the next good source of the same list is used.
#[test]
fn bad_subagent_parent_and_tenant_headers_are_each_counted() {
    let c = cfg(r#"{"tenant_header":"x-auth-tenant"}"#);
    let pools = Pools::new(&c);
    let mut h = headers(&[
        (":path", "/v1/chat/completions"),
        ("x-session-id", "run"),
        ("x-claude-code-agent-id", ""),
        ("thread-id", "sub-1"),
        ("x-parent-session-id", "p1"),
        ("x-parent-session-id", "p2"),
        ("x-codex-parent-thread-id", "parent-ok"),
        ("x-auth-tenant", "t1"),
        ("x-auth-tenant", "t2"),
    ]);
    h.push(("x-claude-code-parent-agent-id".into(), vec![0xff, 0xfe]));
    let HeaderOutcome::Decided(d) = on_headers(&c, &pools, &h, false) else {
        panic!("a session header decides in the header callback")
    };
    assert_eq!(
        d.read.bad_headers, 4,
        "empty subagent, repeated parent, non-UTF-8 parent, repeated tenant"
    );
    assert_eq!(d.read.identity.subagent.as_deref(), Some(&b"sub-1"[..]));
    assert_eq!(d.read.identity.parent.as_deref(), Some(&b"parent-ok"[..]));
    assert!(d.read.identity.tenant.is_empty());
    // Each kind alone counts exactly one.
    for (name, value) in [
        ("x-claude-code-agent-id", ""),
        ("x-dynamo-parent-session-id", ""),
        ("x-auth-tenant", ""),
    ] {
        let h = headers(&[
            (":path", "/v1/chat/completions"),
            ("x-session-id", "run"),
            (name, value),
        ]);
        let HeaderOutcome::Decided(d) = on_headers(&c, &pools, &h, false) else {
            panic!("{name}: not decided")
        };
        assert_eq!(d.read.bad_headers, 1, "{name}");
    }
}

#[test]
fn bad_identity_headers_are_skipped_and_counted() {
    let c = cfg("");
    let pools = Pools::new(&c);
    let long = "x".repeat(2000);
    for bad in [
        vec![("x-session-id", "")],
        vec![("x-session-id", long.as_str())],
        vec![("x-session-id", "a"), ("x-session-id", "b")],
    ] {
        let mut h = headers(&[
            (":path", "/v1/chat/completions"),
            ("x-claude-code-session-id", "good"),
        ]);
        h.extend(headers(&bad));
        let HeaderOutcome::Decided(d) = on_headers(&c, &pools, &h, false) else {
            panic!()
        };
        assert_eq!(d.read.source, "header:x-claude-code-session-id");
        assert_eq!(d.read.bad_headers, 1);
    }
    let mut h = headers(&[
        (":path", "/v1/chat/completions"),
        ("x-claude-code-session-id", "good"),
    ]);
    h.push(("x-session-id".into(), vec![0xff, 0xfe]));
    let HeaderOutcome::Decided(d) = on_headers(&c, &pools, &h, false) else {
        panic!()
    };
    assert_eq!(d.read.bad_headers, 1);
}

#[test]
fn fallbacks_have_reasons_and_stable_keys() {
    let c = cfg(r#"{"max_body_bytes": 100000}"#);
    let pools = Pools::new(&c);
    let body = Convo::new("s", "t").body(Api::Chat, Order::Sdk);
    let run = |h: &[(&str, &str)], body: &[u8]| -> Plan {
        let mut hh = headers(&[(":path", "/v1/chat/completions")]);
        hh.extend(headers(h));
        match on_headers(&c, &pools, &hh, body.is_empty()) {
            HeaderOutcome::Decided(d) => *d,
            HeaderOutcome::ReadBody { api, reason } => {
                let mut f = SliceFetch::new(body);
                on_body(&c, &pools, api, &hh, body.len(), reason, &mut |s, l| {
                    f.fetch(s, l)
                })
            }
            HeaderOutcome::Untouched => panic!(),
        }
    };
    assert_eq!(
        run(&[("content-type", "text/plain")], &body).read.source,
        "fallback:not_json"
    );
    assert_eq!(
        run(&[("content-encoding", "gzip")], &body).read.source,
        "fallback:compressed_corrupt"
    );
    assert_eq!(
        run(&[("content-encoding", "br")], &body).read.source,
        "fallback:compressed"
    );
    assert_eq!(
        run(&[], b"{\"messages\": [}").read.source,
        "fallback:malformed_json"
    );
    assert_eq!(
        run(&[], &body[..body.len() - 3]).read.source,
        "fallback:truncated"
    );
    assert_eq!(run(&[], b"").read.source, "fallback:no_body");
    assert_eq!(
        run(&[], b"{\"model\":\"m\"}").read.source,
        "fallback:no_conversation"
    );
    let big = Convo::new("s", &"y".repeat(200_000)).body(Api::Chat, Order::Sdk);
    assert_eq!(run(&[], &big).read.source, "fallback:too_large");
    // The fallback key depends on the body head, so later turns of a run keep it.
    let t1 = Convo::new("s", &"p".repeat(5000));
    let t2 = t1.clone().with(Step::User("more".into()));
    let (b1, b2) = (
        t1.body(Api::Chat, Order::Sdk),
        t2.body(Api::Chat, Order::Sdk),
    );
    assert_ne!(
        key(&run(&[("content-encoding", "br")], &b1)),
        key(&run(&[("content-encoding", "br")], b"{}"))
    );
    let (d1, d2) = (
        run(&[("content-encoding", "br")], &b1),
        run(&[("content-encoding", "br")], &b2),
    );
    assert_eq!(key(&d1), key(&d2));
    // Unknown paths are not routed at all.
    let h = headers(&[(":path", "/v2/other"), ("x-session-id", "a")]);
    assert_eq!(on_headers(&c, &pools, &h, false), HeaderOutcome::Untouched);
}

#[test]
fn client_internal_headers_are_recognised() {
    for h in [
        "x-tether-key",
        "X-Tether-Turn",
        "x-tether-anything",
        "x-data-parallel-rank",
        "x-gateway-destination-endpoint",
        "x-prefiller-host-port",
    ] {
        assert!(is_internal_header(h), "{h}");
    }
    for h in ["x-session-id", "content-type", "x-tetherkey"] {
        assert!(!is_internal_header(h), "{h}");
    }
}

#[test]
fn salting_rewrites_the_body_and_drops_client_salts() {
    let c = cfg(
        r#"{"cache_salt":{"secret":"k"},"tenant_header":"x-t","mode":"pick","endpoints":[{"address":"10.0.0.1:8000","dp_size":4}],"outputs":["all","body_session_id","routed_dp_rank"]}"#,
    );
    let mut long = Convo::new("s", "t");
    for i in 0..300 {
        long = long.with(Step::User(format!("{i} {}", "z".repeat(300))));
    }
    for (label, body) in [
        ("none", Convo::new("s", "t").body(Api::Chat, Order::Sdk)),
        (
            "head",
            Convo::new("s", "t")
                .extra("cache_salt", json!("evil"))
                .body(Api::Chat, Order::IdsFirst),
        ),
        (
            "tail",
            long.clone()
                .extra("cache_salt", json!("evil"))
                .extra("routed_dp_rank", json!(3))
                .body(Api::Chat, Order::Sdk),
        ),
        (
            "escaped",
            br#"{"cache\u005fsalt":"evil","messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
        ),
        (
            "empty-conv-first",
            br#"{"messages":[{"role":"user","content":"hi"}],"cache_salt":"evil"}"#.to_vec(),
        ),
    ] {
        let d = decide(&c, Api::Chat, &[("x-t", "acme")], &body);
        let edit = d.edit.clone().unwrap_or_else(|| panic!("{label}: no edit"));
        let out = rewrite::apply(&body, &edit);
        let v: J = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("{label}: {e}: {}", String::from_utf8_lossy(&out)));
        assert_eq!(v["cache_salt"], json!(cache_salt(b"k", b"acme")), "{label}");
        assert_eq!(v["session_id"], json!(identity::hex16(key(&d))), "{label}");
        assert_eq!(
            v["routed_dp_rank"],
            json!(d.placed.pick.as_ref().unwrap().rank),
            "{label}"
        );
        assert_eq!(
            memchr::memmem::find_iter(&out, b"evil").count(),
            0,
            "{label}"
        );
        // Everything else is preserved.
        let orig: J = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["messages"], orig["messages"], "{label}");
        if label == "none" {
            assert!(
                edit.len < 10,
                "prefix-only edit expected, replaced {}",
                edit.len
            );
        }
    }
    assert_ne!(cache_salt(b"k", b"acme"), cache_salt(b"k", b"globex"));
    assert_ne!(cache_salt(b"k", b"acme"), cache_salt(b"k2", b"acme"));
}

#[test]
fn salting_forces_the_body_path() {
    let c = cfg(r#"{"cache_salt":{"secret":"k"}}"#);
    let pools = Pools::new(&c);
    let h = headers(&[(":path", "/v1/chat/completions"), ("x-session-id", "a")]);
    assert!(matches!(
        on_headers(&c, &pools, &h, false),
        HeaderOutcome::ReadBody { .. }
    ));
    let c = cfg(r#"{"header_fast_path":false}"#);
    assert!(matches!(
        on_headers(&c, &pools, &h, false),
        HeaderOutcome::ReadBody { .. }
    ));
}

#[test]
fn big_bodies_are_decided_from_their_ends() {
    let c = cfg("");
    let pools = Pools::new(&c);
    let mut convo = Convo::new("sys", "task").extra("metadata", json!({"user_id": "u_session_1"}));
    for i in 0..1000 {
        convo = convo.with(Step::Tool {
            id: format!("c{i}"),
            tool: "Read".into(),
            result: "r".repeat(4000),
        });
    }
    for api in [Api::Chat, Api::Responses, Api::Messages] {
        let body = convo.body(api, Order::Sdk);
        assert!(body.len() > 4_000_000);
        let h = headers(&[(":path", path_of(api))]);
        let mut f = SliceFetch::new(&body);
        let d = on_body(&c, &pools, api, &h, body.len(), None, &mut |s, l| {
            f.fetch(s, l)
        });
        assert_eq!(d.read.source, "body:metadata.user_id", "{api:?}");
        assert_eq!(
            d.read.turn.map(|t| t.kind),
            Some(turn::TurnKind::Tool),
            "{api:?}"
        );
        assert_eq!(d.read.turn.and_then(|t| t.count), None, "{api:?}");
        assert!(f.fetched < 64 * 1024, "{api:?}: fetched {}", f.fetched);
        // The same run, small enough to be walked whole, gets the same key and an exact count.
        let small = Convo::new("sys", "task")
            .extra("metadata", json!({"user_id": "u_session_1"}))
            .with(Step::Tool {
                id: "c0".into(),
                tool: "Read".into(),
                result: "r".into(),
            });
        let ds = decide(&c, api, &[], &small.body(api, Order::Sdk));
        assert_eq!(key(&ds), key(&d), "{api:?}");
        assert_eq!(ds.read.turn.and_then(|t| t.count), Some(2), "{api:?}");
    }
}

#[test]
fn salted_deployments_refuse_bodies_they_cannot_rewrite() {
    let c = cfg(r#"{"cache_salt":{"secret":"k"},"max_body_bytes":1000}"#);
    let body = br#"{"cache_salt":"evil","messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(decide(&c, Api::Chat, &[], body).reject, None);
    assert_eq!(
        decide(&c, Api::Chat, &[], b"{\"cache_salt\":\"evil\",")
            .reject
            .map(|r| r.0),
        Some(400)
    );
    assert_eq!(
        decide(&c, Api::Chat, &[("content-encoding", "gzip")], body)
            .reject
            .map(|r| r.0),
        Some(415)
    );
    let big = Convo::new("s", &"y".repeat(2000))
        .extra("cache_salt", json!("evil"))
        .body(Api::Chat, Order::Sdk);
    assert_eq!(
        decide(&c, Api::Chat, &[], &big).reject.map(|r| r.0),
        Some(413)
    );
    // A JSON object without a conversation is still salted, not refused.
    let d = decide(&c, Api::Chat, &[], br#"{"model":"m","cache_salt":"evil"}"#);
    assert_eq!(
        (d.read.source.as_str(), d.reject),
        ("fallback:no_conversation", None)
    );
    let out = rewrite::apply(
        br#"{"model":"m","cache_salt":"evil"}"#,
        d.edit.as_ref().unwrap(),
    );
    assert!(!String::from_utf8_lossy(&out).contains("evil"));
    // Without salting nothing is refused.
    assert_eq!(
        decide(&cfg(r#"{"max_body_bytes":1000}"#), Api::Chat, &[], &big).reject,
        None
    );
}

/// The glue copies only [`ReadHeaders`] out of Envoy: every decision
/// must come out the same as from the full header map.
#[test]
fn decisions_read_only_the_named_headers() {
    let configs = [
        cfg(""),
        cfg(
            r#"{"tenant_header":"x-org","mode":"pick","endpoints":[{"address":"10.0.0.1:8000","dp_size":2}]}"#,
        ),
        cfg(
            r#"{"session_sources":["header:x-run","body:session_id"],"subagent_sources":["header:x-agent"],"parent_sources":["header:x-up"],"tenant_header":"x-org"}"#,
        ),
        cfg(r#"{"header_fast_path":false}"#),
    ];
    let noise = [
        (":method", "POST"),
        (":authority", "gw"),
        ("user-agent", "sdk"),
        ("x-request-id", "abc"),
        ("x-sessionid", "near-miss"),
    ];
    let identity_sets: [&[(&str, &str)]; 6] = [
        &[],
        &[
            ("x-session-id", "s1"),
            ("x-org", "t1"),
            ("thread-id", "sub"),
        ],
        &[
            ("x-run", "r1"),
            ("x-agent", "a1"),
            ("x-up", "p1"),
            ("x-org", "t2"),
        ],
        &[("x-session-id", "s1"), ("x-session-id", "s2")],
        &[("X-Session-Id", "mixed-case"), ("x-parent-session-id", "p")],
        &[("content-encoding", "gzip"), ("x-session-affinity", "aff")],
    ];
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"session_id":"b1"}"#;
    for c in &configs {
        let pools = Pools::new(c);
        let read = ReadHeaders::new(c);
        for ids in identity_sets {
            for ct in ["application/json", "text/plain"] {
                let mut full = headers(&[(":path", "/v1/chat/completions"), ("content-type", ct)]);
                full.extend(headers(&noise));
                full.extend(headers(ids));
                let kept: Vec<_> = full
                    .iter()
                    .filter(|(k, _)| read.contains(k.as_bytes()))
                    .cloned()
                    .collect();
                assert!(kept.len() + noise.len() <= full.len(), "noise is dropped");
                assert!(kept.iter().any(|(k, _)| k == ":path"));
                for eos in [false, true] {
                    let a = on_headers(c, &pools, &full, eos);
                    assert_eq!(a, on_headers(c, &pools, &kept, eos), "{ids:?} {ct}");
                    if let HeaderOutcome::ReadBody { api, reason } = a {
                        let run = |h: &Headers| {
                            let mut f = SliceFetch::new(body);
                            on_body(c, &pools, api, h, body.len(), reason, &mut |s, l| {
                                f.fetch(s, l)
                            })
                        };
                        assert_eq!(run(&full), run(&kept), "{ids:?} {ct}");
                        let fb = |h: &Headers| fallback(c, &pools, api, h, b"x", Reason::TooLarge);
                        assert_eq!(fb(&full), fb(&kept));
                    }
                }
            }
        }
    }
}

#[test]
fn read_headers_match_names_of_any_length_and_case() {
    let long = format!("x-{}", "a".repeat(70));
    let c = cfg(&format!(
        r#"{{"session_sources":["header:{long}","body:session_id"],"tenant_header":"x-org"}}"#
    ));
    let read = ReadHeaders::new(&c);
    for yes in [
        ":path",
        "Content-Type",
        "content-encoding",
        "x-org",
        "X-ORG",
        long.as_str(),
    ] {
        assert!(read.contains(yes.as_bytes()), "{yes}");
    }
    let longer = format!("{long}b");
    for no in [
        "x-session-id",
        "x-or",
        "x-orgs",
        "",
        longer.as_str(),
        "session_id",
    ] {
        assert!(!read.contains(no.as_bytes()), "{no}");
    }
}

/// The wire contract end to end: what the filter emits for a decision parses,
/// with the engine's own reader, into the marker the engine must act on — for
/// every turn kind on the body path and for the header path (no kind: the
/// engine's user-reply default).
#[test]
fn emitted_markers_parse_into_the_engine_marker() {
    use tether_wire::{HexId, RetentionMs, TurnKind, TurnMarker};
    let c = cfg("");
    let pools = Pools::new(&c);
    let parse = |d: &Plan| {
        let out = d.request_headers(&c, &pools);
        TurnMarker::from_headers(out.iter().map(|(k, v)| (*k, v.as_str())))
            .expect("the filter's own headers parse")
            .expect("a session is always named")
    };
    let call = |id: &str, tool: &str| Step::Tool {
        id: id.into(),
        tool: tool.into(),
        result: "done".into(),
    };
    let cases = [
        (Convo::new("sys", "task"), TurnKind::First, 1),
        (
            Convo::new("sys", "task").with(Step::User("more".into())),
            TurnKind::User,
            2,
        ),
        (
            Convo::new("sys", "task").with(call("c1", "Read")),
            TurnKind::Tool,
            2,
        ),
        (
            Convo::new("sys", "task").with(call("c1", "Task")),
            TurnKind::Handoff,
            2,
        ),
    ];
    // Legacy completions carry one prompt string: no turn structure to read.
    for api in [Api::Chat, Api::Responses, Api::Messages] {
        for (convo, kind, turn) in &cases {
            let body = convo
                .clone()
                .extra("metadata", json!({"session_id": "run-7"}))
                .body(api, Order::Sdk);
            let d = decide(&c, api, &[], &body);
            let m = parse(&d);
            let id = &d.read.identity;
            assert_eq!(m.kind, *kind, "{api:?}");
            assert!(m.prompt_end, "{api:?} {kind:?}");
            assert_eq!(m.turn, Some(*turn), "{api:?} {kind:?}");
            assert_eq!(m.retention_ms, Some(RetentionMs::DEFAULT.get(*kind)));
            assert_eq!(m.key.session, HexId(u128::from(id.session_hash())));
            assert_eq!(m.key.tenant, HexId(u128::from(id.tenant_hash())));
            assert_eq!(m.key.subagent, HexId(u128::from(id.subagent_hash())));
        }
    }
    // Header path: a prompt end without a kind, which the engine reads as `user`.
    let body = Convo::new("sys", "task")
        .with(call("c1", "Read"))
        .body(Api::Chat, Order::Sdk);
    let d = decide(&c, Api::Chat, &[("x-session-id", "run-7")], &body);
    assert!(d.read.header_path);
    let m = parse(&d);
    assert!(m.prompt_end);
    assert_eq!(
        (m.kind, m.turn, m.retention_ms),
        (TurnKind::User, None, None)
    );
    assert_eq!(
        m.key.session,
        HexId(u128::from(d.read.identity.session_hash()))
    );
}

/// Only a session named by a *body* field is shared by every subagent of a run
/// (so the head hash tells them apart); a session header names one agent, which
/// stays the main agent (subagent hash 0) even when the body is read.
#[test]
fn a_header_session_on_the_body_path_stays_the_main_agent() {
    let c = cfg(r#"{"header_fast_path":false}"#);
    let body = Convo::new("explorer subagent", "find files").body(Api::Chat, Order::Sdk);
    let d = decide(&c, Api::Chat, &[("x-session-id", "run")], &body);
    assert!(!d.read.header_path, "the body was read");
    assert_eq!(d.read.source, "header:x-session-id");
    assert_eq!(d.read.identity.subagent, None);
    assert_eq!(d.read.identity.subagent_hash(), 0);
    // The same session as a body field: the head names the agent.
    let d = decide(
        &c,
        Api::Chat,
        &[],
        &Convo::new("explorer subagent", "find files")
            .extra("session_id", json!("run"))
            .body(Api::Chat, Order::Sdk),
    );
    assert_eq!(d.read.source, "body:session_id");
    assert_ne!(d.read.identity.subagent_hash(), 0);
}

/// A request whose headers end the stream has no body callback to wait for: the
/// header callback decides it, with the `no_body` fallback when no header names the session.
#[test]
fn a_bodiless_request_is_decided_in_the_header_callback() {
    let c = cfg(r#"{"tenant_header":"x-t"}"#);
    let pools = Pools::new(&c);
    let h = headers(&[(":path", "/v1/chat/completions"), ("x-t", "acme")]);
    let HeaderOutcome::Decided(d) = on_headers(&c, &pools, &h, true) else {
        panic!("end of stream: decided now")
    };
    assert_eq!(d.read.source, "fallback:no_body");
    assert!(d.read.header_path);
    assert_eq!(d.read.identity.tenant, b"acme");
    // With a body to come, the same headers wait for it.
    assert!(matches!(
        on_headers(&c, &pools, &h, false),
        HeaderOutcome::ReadBody { reason: None, .. }
    ));
}

/// `content-encoding: identity` (any case, padded) or empty is no encoding at all.
#[test]
fn identity_encoding_is_not_compressed() {
    let c = cfg("");
    let body = Convo::new("s", "t")
        .extra("session_id", json!("run"))
        .body(Api::Chat, Order::Sdk);
    for enc in ["identity", " IDENTITY ", ""] {
        let d = decide(&c, Api::Chat, &[("content-encoding", enc)], &body);
        assert_eq!(d.read.source, "body:session_id", "{enc:?}");
    }
    let d = decide(&c, Api::Chat, &[("content-encoding", "br")], &body);
    assert_eq!(d.read.source, "fallback:compressed");
}

/// Fallback keys are scoped by tenant like every other key (a repeated tenant
/// header counts as no tenant).
#[test]
fn fallback_keys_carry_the_tenant() {
    let c = cfg(r#"{"tenant_header":"x-t"}"#);
    let pools = Pools::new(&c);
    let run = |tenant: &[(&str, &str)]| {
        let mut h = headers(&[
            (":path", "/v1/chat/completions"),
            ("content-encoding", "gzip"),
        ]);
        h.extend(headers(tenant));
        fallback(&c, &pools, Api::Chat, &h, b"same body", Reason::Compressed)
    };
    let (a, b) = (run(&[("x-t", "acme")]), run(&[("x-t", "globex")]));
    assert_eq!(a.read.identity.tenant, b"acme");
    assert_eq!(b.read.identity.tenant, b"globex");
    assert_ne!(key(&a), key(&b));
    let none = run(&[("x-t", "acme"), ("x-t", "acme2")]);
    assert!(none.read.identity.tenant.is_empty());
    assert_eq!(key(&none), key(&run(&[])));
}

/// `max_body_bytes` is the largest body read: one byte more is `too_large`.
#[test]
fn max_body_bytes_is_inclusive() {
    let body = Convo::new("s", "t")
        .extra("session_id", json!("run"))
        .body(Api::Chat, Order::Sdk);
    let at = cfg(&format!(r#"{{"max_body_bytes":{}}}"#, body.len()));
    assert_eq!(
        decide(&at, Api::Chat, &[], &body).read.source,
        "body:session_id"
    );
    let below = cfg(&format!(r#"{{"max_body_bytes":{}}}"#, body.len() - 1));
    assert_eq!(
        decide(&below, Api::Chat, &[], &body).read.source,
        "fallback:too_large"
    );
}

/// `turn_count_max_bytes` decides which bodies are walked whole (and counted).
#[test]
fn turn_count_max_bytes_sets_the_whole_walk_limit() {
    let mut convo = Convo::new("s", "t").extra("session_id", json!("run"));
    for i in 0..40 {
        convo = convo.with(Step::User(format!("turn {i} {}", "w".repeat(1200))));
    }
    let body = convo.body(Api::Chat, Order::Sdk);
    // Larger than the head and tail reads together, so only a whole walk counts it.
    assert!(body.len() > 40 * 1024, "{}", body.len());
    let count = |limit: usize| {
        let c = cfg(&format!(r#"{{"turn_count_max_bytes":{limit}}}"#));
        decide(&c, Api::Chat, &[], &body)
            .read
            .turn
            .and_then(|t| t.count)
    };
    assert_eq!(count(body.len()), Some(41));
    assert_eq!(count(32 * 1024), None, "read from its ends, not counted");
}

/// An empty body id is absent (the next source decides); `+head` sources key a
/// user's runs apart by their conversation; an explicit subagent id is kept even
/// when the session is a body field shared by a run's subagents.
#[test]
fn body_identity_edge_cases() {
    let c = cfg("");
    let body = Convo::new("s", "t")
        .extra("session_id", json!(""))
        .extra("prompt_cache_key", json!("pck"))
        .body(Api::Chat, Order::Sdk);
    let d = decide(&c, Api::Chat, &[], &body);
    assert_eq!(
        (d.read.source.as_str(), d.read.bad_headers),
        ("body:prompt_cache_key", 0)
    );
    // user+head: one user, two runs -> two keys; the same run a turn later -> the same key.
    let run1 = Convo::new("s", "fix the parser").extra("user", json!("alice"));
    let run2 = Convo::new("s", "write the docs").extra("user", json!("alice"));
    let k1 = decide(&c, Api::Chat, &[], &run1.body(Api::Chat, Order::Sdk));
    let k2 = decide(&c, Api::Chat, &[], &run2.body(Api::Chat, Order::Sdk));
    assert_eq!(
        (k1.read.source.as_str(), k2.read.source.as_str()),
        ("body:user+head", "body:user+head")
    );
    assert_ne!(key(&k1), key(&k2));
    // The head is part of the session (a run), not a subagent of the user's session.
    assert_ne!(
        k1.read.identity.session_hash(),
        k2.read.identity.session_hash()
    );
    assert_eq!(k1.read.identity.subagent, None);
    let later = run1.clone().with(Step::User("and the tests".into()));
    assert_eq!(
        key(&decide(
            &c,
            Api::Chat,
            &[],
            &later.body(Api::Chat, Order::Sdk)
        )),
        key(&k1)
    );
    // A shared body session field with an explicit subagent header: the header names it.
    let shared = Convo::new("sub", "task").extra("prompt_cache_key", json!("run"));
    let d = decide(
        &c,
        Api::Chat,
        &[("x-claude-code-agent-id", "agent-7")],
        &shared.body(Api::Chat, Order::Sdk),
    );
    assert_eq!(d.read.source, "body:prompt_cache_key");
    assert_eq!(d.read.identity.subagent.as_deref(), Some(&b"agent-7"[..]));
}

/// Only the configured outputs are emitted, and what no output reads is not
/// computed: no turn classification without a marker output, no count
/// without `turn`.
#[test]
fn outputs_trim_what_is_computed_and_emitted() {
    let convo = Convo::new("s", "t")
        .extra("session_id", json!("run"))
        .with(Step::User("more".into()));
    let body = convo.body(Api::Chat, Order::Sdk);
    let names = |c: &Config, d: &Plan| -> Vec<&'static str> {
        let pools = Pools::new(c);
        d.request_headers(c, &pools)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let plain = Config::parse(br#"{"mode":"hash"}"#).unwrap();
    let d = decide(&plain, Api::Chat, &[], &body);
    assert_eq!(
        d.read.turn, None,
        "no marker output: the turn is not classified"
    );
    assert_eq!(names(&plain, &d), ["x-tether-key"]);
    let retain = Config::parse(br#"{"outputs":["hash","retain"]}"#).unwrap();
    let d = decide(&retain, Api::Chat, &[], &body);
    assert_eq!(
        d.read.turn.map(|t| (t.kind, t.count)),
        Some((turn::TurnKind::User, None))
    );
    assert_eq!(
        names(&retain, &d),
        [
            "x-tether-key",
            "x-tether-tenant",
            "x-tether-session",
            "x-tether-subagent",
            "x-tether-prompt-end",
            "x-tether-turn-kind",
            "x-tether-retention-ms"
        ]
    );
    let counted = Config::parse(br#"{"outputs":["turn"]}"#).unwrap();
    let d = decide(&counted, Api::Chat, &[], &body);
    assert_eq!(d.read.turn.and_then(|t| t.count), Some(2));
    assert_eq!(names(&counted, &d), ["x-tether-turn"]);
    // The header path sets the key alone, and the prompt end only when asked.
    let d = decide(&plain, Api::Chat, &[("x-session-id", "s1")], &body);
    assert!(d.read.header_path);
    assert_eq!(names(&plain, &d), ["x-tether-key"]);
    let d = decide(&retain, Api::Chat, &[("x-session-id", "s1")], &body);
    assert!(names(&retain, &d).contains(&"x-tether-prompt-end"));
}

/// Preset `vllm`: the markers go into the body's `kv_transfer_params.tether`,
/// merged with the client's own parameters, and a client's `tether` never
/// survives — wherever it sits (before or after a long conversation, twice,
/// with an escaped key), whatever it holds; the engine's reader gets the same
/// marker from the body as from the headers.
#[test]
fn vllm_markers_go_into_kv_transfer_params() {
    use tether_wire::TurnMarker;
    let vllm = cfg(r#"{"outputs":["vllm","retain","turn"]}"#);
    let pools = Pools::new(&vllm);
    let apply = |body: &[u8]| -> (Plan, J) {
        let d = decide(&vllm, Api::Chat, &[], body);
        let edit = d.edit.clone().expect("rewritten");
        let out = crate::emit::rewrite::apply(body, &edit);
        let v: J = serde_json::from_slice(&out).expect("still JSON");
        (d, v)
    };
    let spoof =
        json!({"do_remote_prefill": true, "tether": {"session": "ffff", "prompt_end": "1"}});
    let mut long = Convo::new("s", "t");
    for i in 0..400 {
        long = long.with(Step::User(format!("turn {i} {}", "x".repeat(100))));
    }
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "short",
            Convo::new("s", "t")
                .with(Step::User("more".into()))
                .extra("session_id", json!("run"))
                .extra("kv_transfer_params", spoof.clone())
                .body(Api::Chat, Order::Sdk),
        ),
        (
            "after a long conversation",
            long.clone()
                .extra("session_id", json!("run"))
                .extra("kv_transfer_params", spoof.clone())
                .body(Api::Chat, Order::Sdk),
        ),
        (
            "before a long conversation",
            long.clone()
                .extra("session_id", json!("run"))
                .extra("kv_transfer_params", spoof.clone())
                .body(Api::Chat, Order::IdsFirst),
        ),
        (
            "none sent",
            long.clone()
                .extra("session_id", json!("run"))
                .body(Api::Chat, Order::Sdk),
        ),
    ];
    for (what, body) in cases {
        let (d, v) = apply(&body);
        let kv = &v["kv_transfer_params"];
        let tether = kv["tether"].as_object().expect("our object");
        let from_body = TurnMarker::from_fields(
            tether
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("?"))),
        )
        .unwrap()
        .expect("a session");
        let headers = &d.request_headers(&vllm, &pools);
        let from_headers = TurnMarker::from_headers(headers.iter().map(|(k, v)| (*k, v.as_str())))
            .unwrap()
            .expect("a session");
        assert_eq!(from_body, from_headers, "{what}");
        // Counted only when the conversation was walked whole (a short body).
        assert_eq!(from_body.turn.is_some(), what == "short", "{what}");
        assert_ne!(tether.get("session"), Some(&json!("ffff")), "{what}");
        assert_eq!(d.spoofed_markers, what != "none sent", "{what}: counted");
        if what != "none sent" {
            assert_eq!(
                kv["do_remote_prefill"],
                json!(true),
                "{what}: client's kept"
            );
        }
        assert_eq!(
            v["messages"],
            serde_json::from_slice::<J>(&body).unwrap()["messages"]
        );
    }
    // Twice, the second with an escaped member name: one object, ours.
    let body = br#"{"kv_transfer_params":{"tether":{"session":"1"}},"model":"m","messages":[{"role":"user","content":"hi"}],"session_id":"r","kv_transfer_params":{"x":1,"tet\u0068er":{"session":"2"}}}"#;
    let (d, v) = apply(body);
    assert!(d.spoofed_markers);
    assert_eq!(v["kv_transfer_params"]["x"], json!(1));
    let raw = String::from_utf8(crate::emit::rewrite::apply(
        body,
        &decide(&vllm, Api::Chat, &[], body).edit.unwrap(),
    ))
    .unwrap();
    assert_eq!(raw.matches("kv_transfer_params").count(), 1, "{raw}");
    assert!(
        !raw.contains("tet\\u0068er") && !raw.contains(r#""session":"1""#),
        "{raw}"
    );
}

/// With markers in the body, a body the filter cannot rewrite is refused (as
/// with salting): its client `kv_transfer_params.tether` would reach the engine.
#[test]
fn vllm_markers_refuse_bodies_that_cannot_be_rewritten() {
    let c = cfg(r#"{"outputs":"vllm","max_body_bytes":1000}"#);
    let big = Convo::new("s", &"y".repeat(2000)).body(Api::Chat, Order::Sdk);
    assert_eq!(
        decide(&c, Api::Chat, &[], &big).reject.map(|r| r.0),
        Some(413)
    );
    assert_eq!(
        decide(&c, Api::Chat, &[], b"{\"messages\":[")
            .reject
            .map(|r| r.0),
        Some(400)
    );
    // Every routed request takes the body path: no header-path decision.
    let ok = Convo::new("s", "t").body(Api::Chat, Order::Sdk);
    let d = decide(&c, Api::Chat, &[("x-session-id", "s")], &ok);
    assert!(!d.read.header_path && d.edit.is_some() && d.reject.is_none());
}

/// Without output `turn` a small body is read whole because its two ends
/// cover it, not because a value sat in its middle: no middle read is
/// counted (`tether_body_middle_read`); with `turn` it is walked whole under
/// `turn_count_max_bytes`, not counted either.
#[test]
fn a_small_body_read_whole_is_no_middle_read() {
    let body = Convo::new("s", "t")
        .with(Step::User("more".into()))
        .extra("prompt_cache_key", json!("k"))
        .body(Api::Chat, Order::Sdk);
    for config in [r#"{}"#, r#"{"outputs":["hash","turn"]}"#] {
        let d = decide(&cfg(config), Api::Chat, &[], &body);
        assert!(d.read.stats.full, "{config}: read whole");
        assert!(!d.read.stats.middle, "{config}: counted as a middle read");
    }
    // A last entry longer than the tail read makes the ends grow: that is one.
    let big = Convo::new(&"s".repeat(40_000), "t")
        .with(Step::User("u".repeat(40_000)))
        .extra("prompt_cache_key", json!("k"))
        .body(Api::Chat, Order::Sdk);
    let d = decide(&cfg("{}"), Api::Chat, &[], &big);
    assert!(d.read.stats.middle && d.read.stats.full);
}

// The pipeline's entry points on no load view, as the glue calls them.

fn on_headers(cfg: &Config, pools: &Pools, h: &Headers, end_of_stream: bool) -> HeaderOutcome {
    super::on_headers(cfg, pools, Snapshot::NONE, h, end_of_stream)
}

fn on_body(
    cfg: &Config,
    pools: &Pools,
    api: Api,
    headers: &Headers,
    size: usize,
    reason: Option<Reason>,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Plan {
    let call = BodyCall {
        reason,
        ..BodyCall::new(api, headers, size)
    };
    super::on_body(cfg, pools, Snapshot::NONE, call, fetch, &mut |_| {})
}

fn fallback(
    cfg: &Config,
    pools: &Pools,
    api: Api,
    headers: &Headers,
    prefix: &[u8],
    reason: Reason,
) -> Plan {
    super::fallback(cfg, pools, Snapshot::NONE, api, headers, prefix, reason)
}
