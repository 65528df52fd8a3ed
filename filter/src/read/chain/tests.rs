use super::*;
use crate::api::Api;
use crate::config::Config;
use crate::decide::{BodyCall, on_body};
use crate::place::{Pools, Snapshot};
use crate::read::encoding::Encoding;
use crate::testkit::{SliceFetch, compress, headers};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::HashMap;

/// Slots in a map, as shared data holds them.
#[derive(Debug, Default)]
struct MapSlots(RefCell<HashMap<u32, Vec<u8>>>);

impl SlotStore for MapSlots {
    fn get(&self, slot: u32) -> Option<Vec<u8>> {
        self.0.borrow().get(&slot).cloned()
    }
    fn set(&self, slot: u32, value: &[u8]) -> bool {
        self.0.borrow_mut().insert(slot, value.to_vec());
        true
    }
}

fn table(store: &MapSlots, slots: u32, now_ms: u64) -> Table<'_, MapSlots> {
    Table {
        store,
        cfg: ChainConfig {
            slots,
            ttl_ms: 60_000,
            ..ChainConfig::default()
        },
        now_ms,
    }
}

const INSTRUCTIONS: &str = "You are Codex, a coding agent. Follow the repository's AGENTS.md.";

/// Turn `turn` (1-based) of a Responses chain: turn 1 carries the first user
/// message, later turns only the new tool output and `previous_response_id`.
fn responses_turn(turn: usize, first: &str, previous: Option<&str>) -> Vec<u8> {
    let input = if turn == 1 {
        json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": first}]}])
    } else {
        json!([{"type": "function_call_output", "call_id": format!("call_{turn}"), "output": "exit 0"}])
    };
    let mut body = json!({
        "model": "gpt-5-codex",
        "instructions": INSTRUCTIONS,
        "input": input,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "store": true,
        "stream": true,
    });
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    body.to_string().into_bytes()
}

fn plan_of(
    cfg: &Config,
    chains: &dyn Chains,
    hdrs: &[(&str, &str)],
    body: &[u8],
) -> crate::emit::Plan {
    let pools = Pools::new(cfg);
    let h = headers(
        &[
            &[
                (":path", "/v1/responses"),
                ("content-type", "application/json"),
            ],
            hdrs,
        ]
        .concat(),
    );
    let mut f = SliceFetch::new(body);
    let call = BodyCall {
        chains,
        ..BodyCall::new(Api::Responses, &h, body.len())
    };
    on_body(
        cfg,
        &pools,
        Snapshot::NONE,
        call,
        &mut |s, l| f.fetch(s, l),
        &mut |_| {},
    )
}

/// Runs a 4-turn chain through the decision, learning each answer's id as
/// the response path would; returns (key, source) per turn.
fn run_chain(cfg: &Config, store: &MapSlots, first: &str, ids: &[&str]) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let t = table(store, cfg.chains.slots, 1_000 + i as u64);
        let body = responses_turn(
            i + 1,
            first,
            i.checked_sub(1).and_then(|p| ids.get(p)).copied(),
        );
        let plan = plan_of(cfg, &t, &[], &body);
        let session = plan
            .read
            .chain_session(cfg)
            .expect("a head-keyed Responses request learns");
        assert!(t.learn(id.as_bytes(), session));
        out.push((plan.read.key, plan.read.source.clone()));
    }
    out
}

#[test]
fn a_chain_keeps_turn_one_key_and_chains_stay_apart() {
    let cfg = Config::default();
    let store = MapSlots::default();
    let a = run_chain(
        &cfg,
        &store,
        "fix the parser",
        &["resp_a1", "resp_a2", "resp_a3", "resp_a4"],
    );
    let b = run_chain(
        &cfg,
        &store,
        "fix the parser",
        &["resp_b1", "resp_b2", "resp_b3", "resp_b4"],
    );
    let c = run_chain(
        &cfg,
        &store,
        "write the docs",
        &["resp_c1", "resp_c2", "resp_c3", "resp_c4"],
    );
    for chain in [&a, &b, &c] {
        assert_eq!(chain[0].1, "head");
        assert!(chain[1..].iter().all(|t| t.1 == "chain:table"), "{chain:?}");
        assert!(
            chain.iter().all(|t| t.0 == chain[0].0),
            "one key along the chain: {chain:?}"
        );
    }
    // Same instructions + tools + first message: one head, inherent (documented).
    assert_eq!(a[0].0, b[0].0);
    assert_ne!(a[0].0, c[0].0);
}

#[test]
fn an_unseen_continuation_is_keyed_by_its_previous_response_and_then_carried() {
    let cfg = Config::default();
    let store = MapSlots::default();
    let t = table(&store, 64, 0);
    let k = |prev: &str| {
        let p = plan_of(&cfg, &t, &[], &responses_turn(2, "x", Some(prev)));
        (
            p.read.key,
            p.read.source.clone(),
            p.read.chain_session(&cfg).map(<[u8]>::to_vec),
        )
    };
    let (k1, s1, session) = k("resp_x1");
    let (k2, _, _) = k("resp_y1");
    assert_eq!(s1, "chain:unseen");
    assert_ne!(k1, k2, "two unseen chains never share a key");
    assert_eq!(k("resp_x1").0, k1, "stable for the same previous response");
    // Its answer is learned under the unseen key: the next turn hits it.
    assert!(t.learn(b"resp_x2", &session.unwrap_or_default()));
    let (k3, s3, _) = k("resp_x2");
    assert_eq!((k3, s3.as_str()), (k1, "chain:table"));
    // Without any table (NoChains) the same continuation gets the same unseen key.
    let p = plan_of(
        &cfg,
        &NoChains,
        &[],
        &responses_turn(2, "x", Some("resp_x1")),
    );
    assert_eq!(p.read.key, k1);
}

#[test]
fn explicit_ids_still_win_over_the_chain() {
    let cfg = Config::default();
    let store = MapSlots::default();
    let t = table(&store, 64, 0);
    assert!(t.learn(b"resp_1", b"learned"));
    let mut body: Value = serde_json::from_slice(&responses_turn(2, "x", Some("resp_1"))).unwrap();
    body["prompt_cache_key"] = json!("pck-7");
    let p = plan_of(&cfg, &t, &[], body.to_string().as_bytes());
    assert_eq!(p.read.source, "body:prompt_cache_key");
    assert_eq!(p.read.chain_session(&cfg), None, "nothing to learn");
    let p = plan_of(
        &cfg,
        &t,
        &[("x-session-id", "s-1")],
        &responses_turn(2, "x", Some("resp_1")),
    );
    assert_eq!(p.read.source, "header:x-session-id");
    // Without them, the chain.
    let p = plan_of(&cfg, &t, &[], &responses_turn(2, "x", Some("resp_1")));
    assert_eq!(p.read.source, "chain:table");
}

#[test]
fn entries_expire_and_slots_are_bounded() {
    let store = MapSlots::default();
    assert!(table(&store, 8, 0).learn(b"resp_old", b"s"));
    assert_eq!(
        table(&store, 8, 59_999).lookup(b"resp_old"),
        Some(b"s".to_vec())
    );
    assert_eq!(
        table(&store, 8, 60_000).lookup(b"resp_old"),
        None,
        "past the TTL"
    );
    // Never more slots than configured, whatever is learned.
    for i in 0..1000 {
        table(&store, 8, 100_000 + i).learn(format!("resp_{i}").as_bytes(), b"s");
    }
    assert!(store.0.borrow().keys().all(|k| *k < 8));
    assert!(store.0.borrow().len() <= 8);
    // The newest id is found; an id never learned is not (no false hit).
    assert!(table(&store, 8, 101_000).lookup(b"resp_999").is_some());
    assert_eq!(table(&store, 8, 101_000).lookup(b"resp_never"), None);
    // Sessions over the bound are not learned.
    assert!(!table(&store, 8, 0).learn(b"resp_long", &[b'x'; MAX_SESSION + 1]));
}

#[test]
fn response_ids_from_json_and_sse_answers() {
    let json_answer = br#"{"id":"resp_0123abcd","object":"response","created_at":1,"status":"completed","output":[{"id":"msg_1"}]}"#;
    assert_eq!(response_id(json_answer), Some(b"resp_0123abcd".to_vec()));
    // Cut right after the id: enough.
    assert_eq!(
        response_id(&json_answer[..26]),
        Some(b"resp_0123abcd".to_vec())
    );
    assert_eq!(response_id(&json_answer[..12]), None, "cut inside the id");
    let sse = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_77\",\"object\":\"response\",\"status\":\"in_progress\"";
    assert_eq!(response_id(sse), Some(b"resp_77".to_vec()));
    assert_eq!(
        response_id(b"event: response.created\ndata: {\"type\":\"resp"),
        None
    );
    assert_eq!(
        response_id(b"data: {\"type\":\"error\",\"error\":{\"id\":\"x\"}}\n\n"),
        None
    );
    assert_eq!(response_id(b"{\"object\":\"response\"}"), None);
    assert_eq!(response_id(b"\xff\xfe garbage"), None);
    assert_eq!(response_id(b""), None);
}

#[test]
fn compressed_bodies_are_read_like_plain_ones() {
    let cfg = Config::default();
    let mut body: Value = serde_json::from_slice(&responses_turn(1, "hi", None)).unwrap();
    body["prompt_cache_key"] = json!("pck-42");
    let plain = body.to_string().into_bytes();
    let want = plan_of(&cfg, &NoChains, &[], &plain);
    assert_eq!(want.read.source, "body:prompt_cache_key");
    for (enc, name) in [
        (Encoding::Gzip, "gzip"),
        (Encoding::Deflate, "deflate"),
        (Encoding::Zstd, "zstd"),
    ] {
        let p = plan_of(
            &cfg,
            &NoChains,
            &[("content-encoding", name)],
            &compress(enc, &plain),
        );
        assert_eq!(
            (p.read.key, p.read.source.as_str()),
            (want.read.key, "body:prompt_cache_key"),
            "{name}"
        );
        assert!(p.read.decoded);
    }
}

#[test]
fn compressed_turns_keep_their_head_key_and_bad_streams_fall_back_stably() {
    let cfg: Config = Config::parse(br#"{"max_decompressed_bytes": 65536}"#).unwrap();
    // Chat turns without ids: the head hash, through gzip and zstd alike.
    let turn = |n: usize| {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a helpful agent."}),
            json!({"role": "user", "content": "plan the release"}),
        ];
        for i in 1..n {
            messages.push(json!({"role": "assistant", "content": format!("step {i}")}));
            messages.push(json!({"role": "user", "content": format!("ok {i}")}));
        }
        json!({"model": "m", "messages": messages})
            .to_string()
            .into_bytes()
    };
    let chat = |hdr: &[(&str, &str)], body: &[u8]| {
        let pools = Pools::new(&cfg);
        let h = headers(
            &[
                &[
                    (":path", "/v1/chat/completions"),
                    ("content-type", "application/json"),
                ],
                hdr,
            ]
            .concat(),
        );
        let mut f = SliceFetch::new(body);
        on_body(
            &cfg,
            &pools,
            Snapshot::NONE,
            BodyCall::new(Api::Chat, &h, body.len()),
            &mut |s, l| f.fetch(s, l),
            &mut |_| {},
        )
    };
    for (enc, name) in [(Encoding::Gzip, "gzip"), (Encoding::Zstd, "zstd")] {
        let keys: Vec<_> = (1..=4)
            .map(|n| chat(&[("content-encoding", name)], &compress(enc, &turn(n))))
            .collect();
        assert!(
            keys.iter()
                .all(|p| p.read.source == "head" && p.read.key == keys[0].read.key),
            "{name}"
        );
        assert_eq!(
            keys[0].read.key,
            chat(&[], &turn(1)).read.key,
            "{name}: as uncompressed"
        );
        // A bomb: over the bound, the fallback key of what decoded (its head: stable).
        let pad = |n: usize| {
            let mut b = turn(n);
            b.extend(std::iter::repeat_n(b' ', 200_000));
            b
        };
        let bombs: Vec<_> = (1..=3)
            .map(|n| chat(&[("content-encoding", name)], &compress(enc, &pad(n))))
            .collect();
        assert!(
            bombs
                .iter()
                .all(|p| p.read.source == "fallback:decompressed_too_large"),
            "{name}"
        );
        // Truncated: what decoded before the cut is the same head every turn.
        let cut: Vec<_> = (3..=4)
            .map(|n| {
                let packed = compress(enc, &[turn(n), vec![b' '; 10_000]].concat());
                chat(&[("content-encoding", name)], &packed[..packed.len() - 12])
            })
            .collect();
        assert!(
            cut.iter()
                .all(|p| p.read.source == "fallback:compressed_corrupt"),
            "{name}: {:?}",
            cut[0].read.source
        );
        // Bad magic: nothing decodes.
        let bad = chat(
            &[("content-encoding", name)],
            b"\x00\x01\x02 not compressed",
        );
        assert_eq!(bad.read.source, "fallback:compressed_corrupt");
    }
}

#[test]
fn a_body_that_must_be_rewritten_is_not_decoded() {
    let cfg: Config =
        Config::parse(br#"{"cache_salt": {"secret": "0123456789abcdef0123456789abcdef"}}"#)
            .unwrap();
    let body = responses_turn(1, "hi", None);
    let p = plan_of(
        &cfg,
        &NoChains,
        &[("content-encoding", "gzip")],
        &compress(Encoding::Gzip, &body),
    );
    assert_eq!(p.read.source, "fallback:compressed");
    assert!(p.reject.is_some());
}

#[test]
fn response_ids_from_compressed_answers_and_their_first_bytes() {
    use crate::read::encoding::ContentEncoding;
    let answer =
        br#"{"id":"resp_zz9","object":"response","status":"completed","output":[]}"#.repeat(40);
    for enc in [Encoding::Gzip, Encoding::Deflate, Encoding::Zstd] {
        let packed = compress(enc, &answer);
        let coded = ContentEncoding::Decodable(enc);
        assert_eq!(
            coded_response_id(coded, &packed),
            Some(b"resp_zz9".to_vec()),
            "{enc:?}"
        );
        // Only the first bytes have arrived: what decodes is searched.
        let first = packed.get(..packed.len().min(60)).unwrap_or_default();
        let got = coded_response_id(coded, first);
        assert!(
            got.is_none() || got == Some(b"resp_zz9".to_vec()),
            "{enc:?}: {got:?}"
        );
    }
    assert_eq!(coded_response_id(ContentEncoding::Other, &answer), None);
    assert_eq!(
        coded_response_id(ContentEncoding::Identity, &answer),
        Some(b"resp_zz9".to_vec())
    );
}

/// The chain id the response path hands the client for `engine`, answering `plan`.
fn sealed(cfg: &Config, plan: &crate::emit::Plan, engine: &str) -> String {
    let session = plan
        .read
        .chain_session(cfg)
        .expect("answer carries the chain");
    let id = crate::read::chain_id::seal(
        &cfg.chains.key,
        &plan.read.identity.tenant,
        session,
        engine.as_bytes(),
    )
    .expect("carried");
    String::from_utf8(id).expect("ASCII")
}

/// The body the engine gets: the plan's edit applied.
fn upstream(plan: &crate::emit::Plan, body: &[u8]) -> Value {
    let sent = plan
        .edit
        .as_ref()
        .map_or_else(|| body.to_vec(), |e| crate::emit::rewrite::apply(body, e));
    serde_json::from_slice(&sent).expect("the engine gets JSON")
}

#[test]
fn chain_ids_keep_one_key_on_replicas_that_share_nothing() {
    for cfg in [
        Config::default(),
        // A body rewrite too: the unwrap rides on it.
        Config::parse(br#"{"cache_salt": {"secret": "0123456789abcdef"}}"#).unwrap(),
    ] {
        let first = plan_of(&cfg, &NoChains, &[], &responses_turn(1, "fix it", None));
        assert_eq!(first.read.source, "head");
        let mut previous = sealed(&cfg, &first, "resp_e1");
        for turn in 2..=4 {
            // Every turn on a replica with no table at all.
            let body = responses_turn(turn, "fix it", Some(&previous));
            let p = plan_of(&cfg, &NoChains, &[], &body);
            assert_eq!(
                (p.read.key, p.read.source.as_str()),
                (first.read.key, "chain")
            );
            let engine = format!("resp_e{}", turn - 1);
            assert_eq!(upstream(&p, &body)["previous_response_id"], engine.as_str());
            if cfg.cache_salt.is_none() {
                let e = p.edit.as_ref().expect("unwrapped in place");
                assert_eq!(crate::emit::rewrite::apply(&body, e).len(), body.len());
            }
            let mut counters = Vec::new();
            p.for_each_counter(&cfg, |c| counters.push(c));
            assert!(counters.contains(&crate::emit::metrics::Counter::Fixed(
                crate::emit::metrics::Fixed::ChainCarried
            )));
            previous = sealed(&cfg, &p, &format!("resp_e{turn}"));
        }
    }
}

#[test]
fn a_forged_or_foreign_chain_id_is_never_opened() {
    let cfg =
        Config::parse(br#"{"tenant_header": "x-tenant", "chains": {"secret": "k"}}"#).unwrap();
    let a = [("x-tenant", "acme")];
    let first = plan_of(&cfg, &NoChains, &a, &responses_turn(1, "fix it", None));
    let good = sealed(&cfg, &first, "resp_e1");
    // Its engine id swapped for another response's: the tag no longer fits.
    let forged = good.replace("resp_e1", "resp_e2");
    let other_tenant = [("x-tenant", "globex")];
    for (hdrs, id) in [
        (&a, forged.as_str()),
        (&other_tenant, good.as_str()),
        (&a, "resp_tt1zz"),
    ] {
        let body = responses_turn(2, "fix it", Some(id));
        let p = plan_of(&cfg, &NoChains, hdrs, &body);
        assert_eq!(p.read.source, "chain:forged", "{id}");
        assert!(p.read.chain.forged);
        assert_eq!(p.edit, None, "forwarded as sent");
        assert_ne!(p.read.key, first.read.key);
        assert_eq!(
            plan_of(&cfg, &NoChains, hdrs, &body).read.key,
            p.read.key,
            "stable"
        );
        let mut counters = Vec::new();
        p.for_each_counter(&cfg, |c| counters.push(c));
        assert!(counters.contains(&crate::emit::metrics::Counter::Fixed(
            crate::emit::metrics::Fixed::ChainForged
        )));
        // Its answer carries the chain on from its own key.
        assert!(p.read.chain_session(&cfg).is_some());
    }
    // An explicit session source keys it, yet a good chain id is still unwrapped.
    let mut body: Value = serde_json::from_slice(&responses_turn(2, "x", Some(&good))).unwrap();
    body["prompt_cache_key"] = json!("pck");
    let bytes = body.to_string().into_bytes();
    let p = plan_of(&cfg, &NoChains, &a, &bytes);
    assert_eq!(p.read.source, "body:prompt_cache_key");
    assert_eq!(upstream(&p, &bytes)["previous_response_id"], "resp_e1");
}

#[test]
fn a_chain_begun_before_chain_ids_goes_on_from_the_table() {
    let cfg = Config::default();
    let store = MapSlots::default();
    let t = table(&store, 64, 0);
    // Learned by the filter before the upgrade: plain engine ids.
    let first = plan_of(&cfg, &t, &[], &responses_turn(1, "fix it", None));
    assert!(t.learn(b"resp_old1", first.read.chain_session(&cfg).unwrap()));
    let body = responses_turn(2, "fix it", Some("resp_old1"));
    let p = plan_of(&cfg, &t, &[], &body);
    assert_eq!(
        (p.read.key, p.read.source.as_str()),
        (first.read.key, "chain:table")
    );
    assert_eq!(p.edit, None, "a plain id goes to the engine as sent");
    // Its answer gets a chain id: the next turn needs no table.
    let next = sealed(&cfg, &p, "resp_new2");
    let p3 = plan_of(
        &cfg,
        &NoChains,
        &[],
        &responses_turn(3, "fix it", Some(&next)),
    );
    assert_eq!(
        (p3.read.key, p3.read.source.as_str()),
        (first.read.key, "chain")
    );
}
