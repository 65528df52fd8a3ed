use super::*;
use crate::generate::{GenerateOptions, generate};
use crate::import::{ImportOptions, mooncake};
use crate::trace::TurnKind;
use std::collections::{HashMap, HashSet};
use tether_filter::config::Config;
use tether_filter::decide::{BodyCall, HeaderOutcome, on_body, on_headers};
use tether_filter::place::{Pools, Snapshot};
use tether_filter::read::Reading;
use tether_rank_engine::prompt::prompt_tokens;

/// A small generated trace: six sessions sharing one system prompt, subagents, tool loops.
/// First prompts pass 4 KiB (≈ 1,365 synthesized tokens), so legacy
/// Completions, whose head is the first 4 KiB of the prompt, can keep a key
/// too; the shared preamble (1,200 tokens) stays below that.
fn agents() -> Trace {
    generate(&GenerateOptions {
        sessions: 6,
        system_tokens: 600,
        tool_tokens: 600,
        tool_result_tokens: 120.0,
        first_message_tokens: 500.0,
        task_tokens: 500.0,
        sigma: 0.3,
        output_tokens: 60.0,
        user_turns_mean: 2.0,
        calls_per_turn_mean: 4.0,
        subagent_share: 0.7,
        subagent_calls_mean: 3.0,
        subagent_system_tokens: 700,
        subagent_tool_tokens: 600,
        // No compaction: a compaction replaces the first user message with a
        // summary, which changes the head (and the head-fallback key), as it
        // does for a real harness.
        max_context_tokens: 200_000,
        ..GenerateOptions::default()
    })
    .unwrap()
}

/// The regression guard of the replay client's large bodies (issue 27 part 4,
/// BENCHMARKS.md "The coding-agent corpus through Envoy"): a coding-agent
/// session resends its whole conversation every turn, and synthesizing it
/// hashes each block's words once for the session, not again every turn
/// (which made a 0.6 MB body cost the client a millisecond and more).
#[test]
fn a_long_session_hashes_each_block_once() {
    let t = generate(&GenerateOptions {
        seed: 19,
        sessions: 1,
        session_requests_median: Some(150.0),
        max_context_tokens: 60_000,
        ..crate::generate::Preset::CodingAgent.options()
    })
    .unwrap();
    let mut synth = SessionSynth::new(&t, SessionId(0), SynthOptions::default());
    let sent: u64 = synth
        .by_ref()
        .map(|(r, _)| u64::from(t.request(r).input_tokens))
        .sum();
    let distinct: HashSet<u64> = t
        .session_requests(SessionId(0))
        .into_iter()
        .flat_map(|r| t.hash_ids(r))
        .collect();
    let bs = u64::from(t.block_size());
    let hashed = synth.words_hashed();
    assert!(sent > 1_000_000, "a long session: {sent} tokens sent");
    // Every block the prompts use is hashed, once (the blocks' words are
    // the prompts' words: nearly every distinct block appears in one).
    let blocks = distinct.len() as u64 * bs;
    assert!(
        hashed <= blocks && hashed * 10 >= blocks * 9,
        "{hashed} words hashed for {} distinct blocks of {bs}",
        distinct.len()
    );
    // Hashing every word of every turn was `hashed == sent`.
    assert!(hashed * 5 < sent, "{hashed} words hashed for {sent} sent");
}

/// Five chats behind one 512-token system prompt (the Mooncake importer's fixture).
fn chats() -> Trace {
    let text = mooncake::tests::CHATS;
    let recs = mooncake::parse(std::io::Cursor::new(text.as_bytes()), "m").unwrap();
    mooncake::import_records(recs, &ImportOptions::default(), "m", None).unwrap()
}

struct Synthesized {
    req: RequestId,
    http: HttpRequest,
    tokens: Vec<u32>,
}

fn all(t: &Trace, opts: &SynthOptions) -> Vec<Synthesized> {
    synthesize_all(t, opts)
        .map(|(req, http)| {
            let body: serde_json::Value = serde_json::from_slice(&http.body).unwrap();
            let api = opts.api.unwrap_or(t.request(req).api);
            let tokens = prompt_tokens(api, &body);
            Synthesized { req, http, tokens }
        })
        .collect()
}

fn opts(api: Api, identity: Identity) -> SynthOptions {
    SynthOptions {
        api: Some(api),
        identity,
        ..SynthOptions::default()
    }
}

#[test]
fn prompts_count_exactly_the_input_tokens_in_every_api() {
    for t in [agents(), chats()] {
        for api in Api::ALL {
            for s in all(&t, &opts(api, Identity::None)) {
                let want = t.request(s.req).input_tokens as usize;
                assert_eq!(s.tokens.len(), want, "{api:?} request {:?}", s.req);
                assert_eq!(s.http.path, api.path());
                let body: serde_json::Value = serde_json::from_slice(&s.http.body).unwrap();
                let max = match api {
                    Api::Responses => &body["max_output_tokens"],
                    _ => &body["max_tokens"],
                };
                assert_eq!(max, &json!(t.request(s.req).output_tokens.max(1)));
            }
        }
    }
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Within an agent, two requests sharing `k` blocks share at least `k`
/// blocks of text and less than `k + 1`; a turn that extends its predecessor
/// starts with all of it.
#[test]
fn shared_blocks_are_shared_text() {
    for (t, want_pairs) in [(agents(), 50), (chats(), 6)] {
        let bs = t.block_size() as usize;
        for api in Api::ALL {
            let out = all(&t, &opts(api, Identity::None));
            let by_req: HashMap<RequestId, &Synthesized> = out.iter().map(|s| (s.req, s)).collect();
            let mut pairs = 0;
            for a in t.agents() {
                for (i, &ri) in a.requests.iter().enumerate() {
                    for &rj in &a.requests[i + 1..] {
                        let (x, y) = (&by_req[&ri].tokens, &by_req[&rj].tokens);
                        let k = t
                            .blocks()
                            .common_prefix(t.request(ri).blocks, t.request(rj).blocks);
                        let shared = lcp(x, y);
                        let extends = rj == a.requests[i + 1] && k + 1 >= t.block_count(ri);
                        if extends && y.len() >= x.len() {
                            assert_eq!(
                                shared,
                                x.len(),
                                "{api:?} {ri:?} → {rj:?}: the next turn resends the whole prompt"
                            );
                        }
                        if api != Api::Responses || extends {
                            assert!(
                                shared >= k * bs,
                                "{api:?} {ri:?} {rj:?}: {shared} < {k} blocks"
                            );
                        }
                        assert!(
                            shared < (k + 1) * bs || shared == x.len().min(y.len()),
                            "{api:?} {ri:?} {rj:?}: {shared} tokens shared, only {k} blocks"
                        );
                        pairs += 1;
                    }
                }
            }
            assert!(pairs >= want_pairs, "{pairs}");
        }
    }
}

/// Sessions sharing a system prompt share its full blocks as text — and
/// nothing after (the block where the first user message starts differs).
#[test]
fn sessions_share_the_system_prompt_text_and_nothing_after_it() {
    let t = agents();
    let out = all(&t, &opts(Api::Chat, Identity::None));
    let firsts: Vec<&Synthesized> = t
        .sessions()
        .iter()
        .map(|s| t.agent(s.agents[0]).requests[0])
        .map(|r| out.iter().find(|s| s.req == r).unwrap())
        .collect();
    for w in firsts.windows(2) {
        let shared = lcp(&w[0].tokens, &w[1].tokens);
        // tools + system = 1,200 tokens: 18 full blocks of 64.
        assert_eq!(shared, 18 * 64);
    }
}

/// The filter as `tether gateway` configures it in front of retaining ranks:
/// the mode's default outputs plus the turn markers (`retain`): what it read.
fn decide(http: &HttpRequest) -> Reading {
    let cfg = Config::parse(br#"{"outputs":["hash","retain"]}"#).unwrap();
    let pools = Pools::new(&cfg);
    let mut h: Vec<(String, Vec<u8>)> = vec![(":path".to_owned(), http.path.as_bytes().to_vec())];
    h.extend(
        http.headers
            .iter()
            .map(|(k, v)| (k.clone(), v.as_bytes().to_vec())),
    );
    match on_headers(&cfg, &pools, Snapshot::NONE, &h, http.body.is_empty()) {
        HeaderOutcome::Untouched => panic!("untouched {}", http.path),
        HeaderOutcome::Decided(d) => d.read,
        HeaderOutcome::ReadBody { api, reason } => {
            let body = &http.body;
            let call = BodyCall {
                reason,
                ..BodyCall::new(api, &h, body.len())
            };
            on_body(
                &cfg,
                &pools,
                Snapshot::NONE,
                call,
                &mut |s, l| body.get(s..s.checked_add(l)?).map(<[u8]>::to_vec),
                &mut |_| {},
            )
            .read
        }
    }
}

/// The gateway's own decision code gives every turn of an agent one key and
/// different sessions different keys, in every API and identity mode — also
/// when sessions share a system prompt and when no identity is sent (the
/// conversation-head fallback).
#[test]
fn the_filter_keys_every_turn_of_an_agent_alike_and_sessions_apart() {
    for (t, name) in [(agents(), "generated"), (chats(), "mooncake")] {
        for api in Api::ALL {
            for identity in Identity::ALL {
                let out = all(&t, &opts(api, identity));
                let mut by_agent: HashMap<AgentId, HashSet<u64>> = HashMap::new();
                let mut by_session: HashMap<SessionId, HashSet<u64>> = HashMap::new();
                for s in &out {
                    let d = decide(&s.http);
                    assert!(
                        !d.source.starts_with("fallback"),
                        "{name} {api:?} {identity:?}: {}",
                        d.source
                    );
                    let r = t.request(s.req);
                    by_agent
                        .entry(r.agent)
                        .or_default()
                        .insert(d.identity.key());
                    by_session
                        .entry(r.session)
                        .or_default()
                        .insert(d.identity.key());
                    if identity == Identity::None {
                        assert_eq!(d.source, "head");
                    }
                }
                for (a, keys) in &by_agent {
                    assert_eq!(
                        keys.len(),
                        1,
                        "{name} {api:?} {identity:?}: agent {a:?} got keys {keys:?}"
                    );
                }
                let mut owner: HashMap<u64, SessionId> = HashMap::new();
                for (s, keys) in &by_session {
                    for k in keys {
                        if let Some(o) = owner.insert(*k, *s) {
                            assert_eq!(
                                o, *s,
                                "{name} {api:?} {identity:?}: sessions {o:?} and {s:?} share key {k:x}"
                            );
                        }
                    }
                    if identity == Identity::SessionAffinity {
                        assert_eq!(
                            keys.len(),
                            1,
                            "session-affinity names the session for every agent"
                        );
                    }
                }
            }
        }
    }
}

/// What opened the turn reaches the gateway: the filter's turn detection
/// reads tool results as `tool`, a subagent's result as `handoff`, and a user
/// reply as `user` (body path, every API but Completions).
#[test]
fn the_filter_reads_the_turn_kind_the_trace_records() {
    let t = agents();
    for api in [Api::Chat, Api::Responses, Api::Messages] {
        let mut seen = HashSet::new();
        for s in all(&t, &opts(api, Identity::PromptCacheKey)) {
            let r = t.request(s.req);
            let d = decide(&s.http);
            let kind = d.turn.map(|t| t.kind);
            let prev_extends = t.turn_of(s.req) > 0 && {
                let a = t.agent(r.agent);
                let prev = a.requests[t.turn_of(s.req) - 1];
                t.blocks().common_prefix(t.request(prev).blocks, r.blocks) + 1
                    >= t.block_count(prev)
            };
            if prev_extends
                && matches!(
                    r.opened_by,
                    TurnKind::Tool | TurnKind::Handoff | TurnKind::User
                )
            {
                assert_eq!(kind, Some(r.opened_by), "{api:?} {:?}", s.req);
                seen.insert(r.opened_by);
            }
        }
        assert_eq!(seen.len(), 3, "{api:?}: {seen:?}");
    }
}

#[test]
fn identity_is_sent_as_each_harness_sends_it() {
    let t = agents();
    let sub = t.agents().iter().position(|a| a.parent.is_some()).unwrap();
    let sub_req = t.agents()[sub].requests[0];
    let get = |identity: Identity, api: Api| {
        all(&t, &opts(api, identity))
            .into_iter()
            .find(|s| s.req == sub_req)
            .unwrap()
            .http
    };
    let h = get(Identity::ClaudeCode, Api::Messages);
    let (sid, aid, pid) = (
        h.header("x-claude-code-session-id").unwrap(),
        h.header("x-claude-code-agent-id").unwrap(),
        h.header("x-claude-code-parent-agent-id").unwrap(),
    );
    assert_eq!(sid.len(), 36);
    assert_ne!(sid, aid);
    assert_eq!(
        pid, sid,
        "a first-level subagent's parent is the main agent"
    );
    assert_eq!(h.header("anthropic-version"), Some("2023-06-01"));
    let h = get(Identity::Dynamo, Api::Chat);
    assert_eq!(h.header("x-dynamo-session-id"), Some(aid));
    assert_eq!(h.header("x-dynamo-parent-session-id"), Some(sid));
    let h = get(Identity::SessionAffinity, Api::Chat);
    assert_eq!(h.header("x-session-affinity"), Some(sid));
    let body = |h: &HttpRequest| serde_json::from_slice::<serde_json::Value>(&h.body).unwrap();
    assert_eq!(
        body(&get(Identity::PromptCacheKey, Api::Responses))["prompt_cache_key"],
        json!(sid)
    );
    assert_eq!(
        body(&get(Identity::Metadata, Api::Chat))["metadata"],
        json!({"session_id": sid, "agent_id": aid})
    );
    assert_eq!(
        body(&get(Identity::Metadata, Api::Messages))["metadata"],
        json!({"user_id": sid})
    );
    let h = get(Identity::None, Api::Chat);
    assert!(h.headers.iter().all(|(k, _)| k == "content-type"));
    // A salt gives another replay other ids.
    let salted = synthesize_all(
        &t,
        &SynthOptions {
            identity: Identity::ClaudeCode,
            salt: "run-2".into(),
            ..SynthOptions::default()
        },
    )
    .find(|(r, _)| *r == sub_req)
    .unwrap()
    .1;
    assert_ne!(salted.header("x-claude-code-session-id"), Some(sid));
    // ... and other prompt text, so a cache warmed by another replay has
    // nothing for it, while one salt gives one text (its own turns still share).
    let with_salt = |salt: &str| {
        let r = synthesize_all(
            &t,
            &SynthOptions {
                identity: Identity::ClaudeCode,
                salt: salt.into(),
                ..SynthOptions::default()
            },
        )
        .find(|(r, _)| *r == sub_req)
        .unwrap()
        .1;
        let b = body(&r);
        assert!(b["messages"].is_array(), "{b}");
        b["messages"].clone()
    };
    assert_ne!(with_salt("run-2"), with_salt(""));
    assert_eq!(with_salt("run-2"), with_salt("run-2"));
}

#[test]
fn bodies_follow_sdk_key_order_and_options() {
    let t = chats();
    let o = SynthOptions {
        stream: true,
        exact_output: true,
        model: "m1".into(),
        ..opts(Api::Messages, Identity::Metadata)
    };
    let (_, h) = synthesize_all(&t, &o).next().unwrap();
    let text = String::from_utf8(h.body).unwrap();
    let keys: Vec<&str> = [
        "\"max_tokens\"",
        "\"messages\"",
        "\"model\"",
        "\"metadata\"",
        "\"stream\"",
        "\"system\"",
    ]
    .into_iter()
    .collect();
    let at: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
    assert!(text.contains("\"model\":\"m1\"") && text.contains("\"ignore_eos\":true"));
}

/// The importers' fixtures (an AgentX run with nested subagents, Bailian
/// chats with re-hashed padding blocks) synthesize exactly too, and keep one
/// key per agent with and without identity.
#[test]
fn imported_fixtures_synthesize_exactly() {
    let dir = std::env::temp_dir().join(format!("tether-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ax = dir.join("run.json");
    std::fs::write(&ax, crate::import::agentx::tests::RUN).unwrap();
    let agentx = crate::import::agentx::import_path(&ax, &ImportOptions::default()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let recs = crate::import::bailian::parse(
        std::io::Cursor::new(crate::import::bailian::tests::CHATS.as_bytes()),
        "b",
    )
    .unwrap();
    let bailian =
        crate::import::bailian::import_records(recs, &ImportOptions::default(), "b", None).unwrap();
    for t in [agentx, bailian] {
        for api in Api::ALL {
            for identity in [Identity::None, Identity::ClaudeCode] {
                let mut keys: HashMap<AgentId, HashSet<u64>> = HashMap::new();
                for s in all(&t, &opts(api, identity)) {
                    assert_eq!(s.tokens.len(), t.request(s.req).input_tokens as usize);
                    keys.entry(t.request(s.req).agent)
                        .or_default()
                        .insert(decide(&s.http).identity.key());
                }
                if api != Api::Completions || identity != Identity::None {
                    assert!(
                        keys.values().all(|k| k.len() == 1),
                        "{api:?} {identity:?} {keys:?}"
                    );
                }
            }
        }
    }
}

/// A compaction replaces the first user message with a summary: the head
/// (and with no identity the key) changes, as for a real harness; an
/// explicit identity keeps the agent's key.
#[test]
fn a_compaction_keeps_the_key_only_with_an_identity() {
    let t = generate(&GenerateOptions {
        sessions: 2,
        system_tokens: 600,
        tool_tokens: 600,
        max_context_tokens: 12_000,
        summary_tokens: 1_000.0,
        subagent_share: 0.0,
        ..GenerateOptions::default()
    })
    .unwrap();
    let keys = |identity| {
        let mut k: HashMap<AgentId, HashSet<u64>> = HashMap::new();
        for s in all(&t, &opts(Api::Chat, identity)) {
            assert_eq!(s.tokens.len(), t.request(s.req).input_tokens as usize);
            k.entry(t.request(s.req).agent)
                .or_default()
                .insert(decide(&s.http).identity.key());
        }
        k
    };
    assert!(keys(Identity::None).values().any(|k| k.len() > 1));
    assert!(keys(Identity::ClaudeCode).values().all(|k| k.len() == 1));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Random small traces — tiny prompts, odd block sizes, preambles that do
    /// not fit — still synthesize to exactly `input_tokens` in every API.
    #[test]
    fn random_traces_synthesize_exactly(
        seed in 0u64..1_000_000,
        bs in proptest::sample::select(vec![1u32, 3, 16, 64, 512]),
        system in 0u32..400,
        tools in 0u32..400,
        first in 1.0f64..200.0,
        shared in proptest::bool::ANY,
    ) {
        let t = generate(&GenerateOptions {
            seed,
            sessions: 3,
            block_size: bs,
            shared_system_prompt: shared,
            system_tokens: system,
            tool_tokens: tools,
            first_message_tokens: first,
            user_message_tokens: 5.0,
            task_tokens: 3.0,
            tool_result_tokens: 30.0,
            output_tokens: 20.0,
            user_turns_mean: 2.0,
            calls_per_turn_mean: 3.0,
            subagent_share: 0.5,
            subagent_calls_mean: 2.0,
            subagent_system_tokens: system / 2,
            subagent_tool_tokens: tools / 3,
            max_context_tokens: 1_500,
            summary_tokens: 100.0,
            ..GenerateOptions::default()
        }).unwrap();
        for api in Api::ALL {
            for s in all(&t, &opts(api, Identity::Metadata)) {
                proptest::prop_assert_eq!(s.tokens.len(), t.request(s.req).input_tokens as usize, "{:?} {:?}", api, s.req);
            }
        }
    }
}
