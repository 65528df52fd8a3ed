//! Request synthesis: the HTTP request a replay client sends for a trace
//! request, in any API the gateway filter understands, with identity sent the
//! way a chosen harness sends it.
//!
//! What it guarantees (tested against the rank's tokenizer and the filter's
//! own decision code):
//!
//! - **Exact length.** The prompt counts exactly `input_tokens` under the
//!   simulated tokenizer contract (`tether_rank_engine::prompt`: one word = one
//!   token, canonical prompt members per API). An `input_tokens` of 0 is sent
//!   as 1.
//! - **Shared blocks are shared text.** A token's word derives from the block
//!   id covering it and its offset ([`words`]), and messages are frozen once
//!   they appear ([`layout`]): two requests that share `k` blocks share at
//!   least `k × block_size` tokens of text, and a turn that extends its
//!   predecessor resends it byte for byte (so the rank can even reuse the tail
//!   of the last, partial block that the trace re-hashes). Rollbacks over a
//!   Responses tool result share up to that result's start only (its
//!   `call_id` sorts before its text).
//! - **A conversation's head identifies it.** The preamble (tool schemas and
//!   system prompt: the agent's `system_tokens` + `tool_tokens`, or one block
//!   when the trace does not say) and the first user message never change
//!   within an agent's conversation, and differ between conversations that do
//!   not share their first prompt — so the filter's head hash (its fallback
//!   key) keeps every turn of a session on one key even when sessions share a
//!   system prompt. (Legacy Completions has no structure: its head is the
//!   first 4 KiB of the prompt, about 1,365 synthesized tokens; sessions whose
//!   shared prefix is longer need an identity to be told apart.)
//! - `max_tokens` is the trace's output tokens (at least 1).

pub mod json;
pub mod layout;
pub mod render;
pub mod words;

use crate::trace::{AgentId, Api, RequestId, SessionId, Trace};
use layout::{Base, Layout};
use serde_json::{Value, json};
use std::collections::HashMap;
use xxhash_rust::xxh3::xxh3_128;

/// How a request says which agent run it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Nothing: the gateway falls back to the conversation-head hash.
    None,
    /// Claude Code: `x-claude-code-session-id`, and for subagents
    /// `x-claude-code-agent-id` and `x-claude-code-parent-agent-id`.
    ClaudeCode,
    /// OpenCode / AIPerf: `x-session-affinity` (the session, for every agent).
    SessionAffinity,
    /// NVIDIA Dynamo: `x-dynamo-session-id` (the agent's own id) and
    /// `x-dynamo-parent-session-id` (its parent's) for subagents.
    Dynamo,
    /// OpenAI `prompt_cache_key` in the body (the session, for every agent).
    PromptCacheKey,
    /// Body `metadata`: `session_id` and, for subagents, `agent_id`
    /// (Anthropic Messages: `user_id` = the session, its only metadata field).
    Metadata,
}

impl Identity {
    /// Every mode.
    pub const ALL: [Identity; 6] = [
        Identity::None,
        Identity::ClaudeCode,
        Identity::SessionAffinity,
        Identity::Dynamo,
        Identity::PromptCacheKey,
        Identity::Metadata,
    ];

    /// Its `--identity` name.
    pub const fn name(self) -> &'static str {
        match self {
            Identity::None => "none",
            Identity::ClaudeCode => "claude-code",
            Identity::SessionAffinity => "session-affinity",
            Identity::Dynamo => "dynamo",
            Identity::PromptCacheKey => "prompt-cache-key",
            Identity::Metadata => "metadata",
        }
    }

    /// Parses an `--identity` name.
    pub fn parse(s: &str) -> Result<Identity, crate::name::UnknownName> {
        crate::name::pick(&Self::ALL, Identity::name, s, "identity")
    }
}

/// How requests are synthesized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthOptions {
    /// How identity is sent.
    pub identity: Identity,
    /// Send every request with this API instead of the trace's.
    pub api: Option<Api>,
    /// Model for requests the trace names none for.
    pub model: String,
    /// `stream: true` (with `stream_options.include_usage` for Chat).
    pub stream: bool,
    /// Ask the server for exactly `output_tokens` (vLLM's `ignore_eos` and
    /// `min_tokens`; not for servers that refuse unknown fields).
    pub exact_output: bool,
    /// Mixed into every session and agent id and into every word of every
    /// prompt, so two replays of one trace share neither ids nor prompt text
    /// (and no cache keyed by either); empty: the trace's own ids and text.
    pub salt: String,
    /// Send the session's tenant in this header (what the gateway's
    /// `tenant_header` names; an auth layer sets it in production).
    pub tenant_header: Option<String>,
}

impl Default for SynthOptions {
    fn default() -> Self {
        Self {
            identity: Identity::None,
            api: None,
            model: "tether-model".to_owned(),
            stream: false,
            exact_output: false,
            salt: String::new(),
            tenant_header: None,
        }
    }
}

/// The seed a replay's `--salt` mixes into every word (0 without one: the
/// trace's own text, byte for byte).
fn content_seed(salt: &str) -> u64 {
    if salt.is_empty() {
        0
    } else {
        xxhash_rust::xxh3::xxh3_64(salt.as_bytes()) | 1
    }
}

/// One HTTP request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRequest {
    /// Always `POST`.
    pub method: &'static str,
    /// `/v1/chat/completions`, `/v1/responses`, `/v1/messages` or `/v1/completions`.
    pub path: &'static str,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    /// JSON.
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A UUID-shaped id from a hash of `parts` (harnesses send UUIDs).
fn uuid(parts: &[&str]) -> String {
    let mut buf = Vec::new();
    for p in parts {
        buf.extend_from_slice(&(p.len() as u32).to_le_bytes());
        buf.extend_from_slice(p.as_bytes());
    }
    let h = format!("{:032x}", xxh3_128(&buf));
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Synthesizes one session's requests, in its arrival order.
#[derive(Debug)]
pub struct SessionSynth<'t> {
    trace: &'t Trace,
    opts: SynthOptions,
    order: Vec<RequestId>,
    next: usize,
    done: Vec<RequestId>,
    layouts: HashMap<RequestId, Layout>,
    ids: HashMap<RequestId, Vec<u64>>,
    /// Each block's words, rendered once for the session's turns.
    words: words::WordCache,
}

/// How many earlier requests of a session a rollback searches for its base.
const BASE_SEARCH: usize = 64;

impl<'t> SessionSynth<'t> {
    /// A synthesizer for `session`.
    pub fn new(trace: &'t Trace, session: SessionId, opts: SynthOptions) -> Self {
        Self {
            trace,
            opts,
            order: trace.session_requests(session),
            next: 0,
            done: Vec::new(),
            layouts: HashMap::new(),
            ids: HashMap::new(),
            words: words::WordCache::default(),
        }
    }

    /// Words hashed so far: each block's words are hashed once for the
    /// session, however many turns resend them (see `words::WordCache`).
    pub fn words_hashed(&self) -> u64 {
        self.words.hashed()
    }

    /// The layout a synthesized request used (for tests and inspection).
    pub fn layout(&self, id: RequestId) -> Option<&Layout> {
        self.layouts.get(&id)
    }

    fn api_of(&self, id: RequestId) -> Api {
        self.opts.api.unwrap_or(self.trace.request(id).api)
    }

    /// The base a request builds on: its agent's previous request when it
    /// extends it, else the earlier request of the session sharing most.
    fn base(&self, r: RequestId) -> Option<(RequestId, u64, bool)> {
        let t = self.trace;
        let req = t.request(r);
        let api = self.api_of(r);
        let store = t.blocks();
        let agent = t.agent(req.agent);
        let pos = agent.requests.iter().position(|&x| x == r)?;
        if let Some(&prev) = pos.checked_sub(1).and_then(|i| agent.requests.get(i))
            && self.api_of(prev) == api
            && self.layouts.contains_key(&prev)
        {
            let p = t.request(prev);
            let (n_prev, n_r) = (store.len(p.blocks), store.len(req.blocks));
            let shared = store.common_prefix(p.blocks, req.blocks) as u64;
            let no_ids = n_prev == 0 || n_r == 0;
            if no_ids || shared + 1 >= n_prev as u64 {
                let shared = if no_ids {
                    u64::MAX / 2 / u64::from(t.block_size())
                } else {
                    shared
                };
                return Some((prev, shared, true));
            }
        }
        self.done
            .iter()
            .rev()
            .take(BASE_SEARCH)
            .filter(|&&q| self.api_of(q) == api)
            .map(|&q| {
                let shared = store.common_prefix(t.request(q).blocks, req.blocks) as u64;
                let same_agent = t.request(q).agent == req.agent;
                (q, shared, same_agent)
            })
            .max_by_key(|&(q, shared, same_agent)| (shared, same_agent, q))
            .filter(|&(_, shared, _)| shared > 0)
            .map(|(q, shared, _)| (q, shared, false))
    }

    fn plan(&self, r: RequestId) -> Layout {
        let t = self.trace;
        let req = t.request(r);
        let api = self.api_of(r);
        let total = u64::from(req.input_tokens.max(1));
        let bs = u64::from(t.block_size());
        if let Some((q, shared, extends)) = self.base(r)
            && let Some(l) = self.layouts.get(&q).and_then(|bl| {
                layout::turn(
                    Base {
                        layout: bl,
                        shared_blocks: shared,
                        output_tokens: u64::from(t.request(q).output_tokens),
                        extends,
                    },
                    bs,
                    total,
                    req.opened_by,
                    r,
                )
            })
        {
            return l;
        }
        let a = t.agent(req.agent);
        let (system, tools) = match (a.system_tokens, a.tool_tokens) {
            (None, None) => (bs, 0),
            (s, k) => (u64::from(s.unwrap_or(0)), u64::from(k.unwrap_or(0))),
        };
        layout::fresh(api, system, tools, total, r)
    }

    fn agent_id(&self, a: AgentId) -> String {
        let t = self.trace;
        let s = t.session(t.agent(a).session);
        match t.agent(a).parent {
            None => uuid(&[&self.opts.salt, &s.id]),
            Some(_) => uuid(&[&self.opts.salt, &s.id, &t.agent(a).id]),
        }
    }

    /// Synthesizes request `r` (its session's earlier requests must be done).
    fn synthesize(&mut self, r: RequestId) -> HttpRequest {
        let t = self.trace;
        let ids = t.hash_ids(r);
        self.ids.insert(r, ids);
        let l = self.plan(r);
        let bs = u64::from(t.block_size());
        let ids = &self.ids;
        let cache = &mut self.words;
        let content = content_seed(&self.opts.salt);
        let mut words = |src: RequestId, from: u64, to: u64| {
            cache.words(
                words::Source {
                    ids: ids.get(&src).map_or(&[][..], Vec::as_slice),
                    block_size: bs,
                    salt: u64::from(src.0),
                    content,
                },
                from,
                to,
            )
        };
        let prompt = render::prompt_members(&l, &mut words);
        let req = self.build(r, l.api, prompt);
        self.layouts.insert(r, l);
        self.done.push(r);
        req
    }

    fn build(&self, r: RequestId, api: Api, prompt: Vec<(&'static str, Value)>) -> HttpRequest {
        let t = self.trace;
        let req = t.request(r);
        let session = t.session(req.session);
        let agent = t.agent(req.agent);
        let sid = uuid(&[&self.opts.salt, &session.id]);
        let aid = self.agent_id(req.agent);
        let parent = agent.parent.map(|p| self.agent_id(p));
        let sub = agent.parent.is_some();
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        if api == Api::Messages {
            headers.push(("anthropic-version".to_owned(), "2023-06-01".to_owned()));
        }
        if let (Some(h), Some(tenant)) = (&self.opts.tenant_header, &session.tenant) {
            headers.push((h.to_ascii_lowercase(), tenant.clone()));
        }
        let mut h = |k: &str, v: &str| headers.push((k.to_owned(), v.to_owned()));
        let (mut cache_key, mut metadata) = (None, None);
        match self.opts.identity {
            Identity::None => {}
            Identity::ClaudeCode => {
                h("x-claude-code-session-id", &sid);
                if let Some(p) = &parent {
                    h("x-claude-code-agent-id", &aid);
                    h("x-claude-code-parent-agent-id", p);
                }
            }
            Identity::SessionAffinity => h("x-session-affinity", &sid),
            Identity::Dynamo => {
                h("x-dynamo-session-id", &aid);
                if let Some(p) = &parent {
                    h("x-dynamo-parent-session-id", p);
                }
            }
            Identity::PromptCacheKey => cache_key = Some(json!(sid)),
            Identity::Metadata => {
                metadata = Some(match (api, sub) {
                    (Api::Messages, _) => json!({ "user_id": sid }),
                    (_, true) => json!({ "session_id": sid, "agent_id": aid }),
                    (_, false) => json!({ "session_id": sid }),
                });
            }
        }
        let model = json!(t.model_of(r).unwrap_or(&self.opts.model));
        let max = json!(req.output_tokens.max(1));
        let user = session.user.as_ref().map(|u| json!(u));
        let mut prompt: HashMap<&str, Value> = prompt.into_iter().collect();
        let mut take = |k: &str| prompt.remove(k);
        let stream = self.opts.stream.then_some(Value::Bool(true));
        let mut m: Vec<(&str, Option<Value>)> = match api {
            Api::Chat => vec![
                ("model", Some(model)),
                ("messages", take("messages")),
                ("max_tokens", Some(max)),
                ("stream", stream.clone()),
                (
                    "stream_options",
                    self.opts.stream.then(|| json!({ "include_usage": true })),
                ),
                ("tools", take("tools")),
                ("prompt_cache_key", cache_key),
                ("metadata", metadata),
                ("user", user),
            ],
            Api::Responses => vec![
                ("model", Some(model)),
                ("input", take("input")),
                ("instructions", take("instructions")),
                ("max_output_tokens", Some(max)),
                ("stream", stream),
                ("tools", take("tools")),
                ("prompt_cache_key", cache_key),
                ("metadata", metadata),
                ("user", user),
            ],
            Api::Messages => vec![
                ("max_tokens", Some(max)),
                ("messages", take("messages")),
                ("model", Some(model)),
                ("prompt_cache_key", cache_key),
                ("metadata", metadata),
                ("stream", stream),
                ("system", take("system")),
                ("tools", take("tools")),
            ],
            Api::Completions => vec![
                ("model", Some(model)),
                ("prompt", take("prompt")),
                ("max_tokens", Some(max)),
                ("stream", stream),
                ("prompt_cache_key", cache_key),
                ("metadata", metadata),
                ("user", user),
            ],
        };
        if self.opts.exact_output {
            m.push(("ignore_eos", Some(json!(true))));
            m.push(("min_tokens", Some(json!(req.output_tokens.max(1)))));
        }
        let mut body = Vec::with_capacity(64 + u64::from(req.input_tokens) as usize * 3);
        body.push(b'{');
        let mut first = true;
        for (k, v) in m {
            let Some(v) = v else { continue };
            if !first {
                body.push(b',');
            }
            first = false;
            body.extend_from_slice(format!("\"{k}\":").as_bytes());
            json::write(&mut body, &v);
        }
        body.push(b'}');
        HttpRequest {
            method: "POST",
            path: api.path(),
            headers,
            body,
        }
    }
}

impl Iterator for SessionSynth<'_> {
    type Item = (RequestId, HttpRequest);

    fn next(&mut self) -> Option<Self::Item> {
        let r = *self.order.get(self.next)?;
        self.next += 1;
        Some((r, self.synthesize(r)))
    }
}

/// Every request of a trace, session by session, each session's in arrival order.
pub fn synthesize_all<'t>(
    trace: &'t Trace,
    opts: &SynthOptions,
) -> impl Iterator<Item = (RequestId, HttpRequest)> + 't {
    let opts = opts.clone();
    (0..trace.sessions().len() as u32)
        .flat_map(move |s| SessionSynth::new(trace, SessionId(s), opts.clone()))
}

#[cfg(test)]
mod tests;
