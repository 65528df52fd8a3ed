//! A seeded generator of agent traces: sessions of a planner agent working
//! through user turns in tool loops, handing tasks to subagents, its prompt
//! growing every call; think and tool times; sessions arriving concurrently;
//! optionally one system prompt shared by every session.
//!
//! Block ids are content-addressed the way real traces are: a session's
//! context is a list of segments (system prompt, tool schemas, messages), each
//! block's id is a chained hash of the content it covers (so a turn that
//! extends the previous prompt keeps its full blocks and re-hashes the last,
//! partial one, and sessions sharing a system prompt share its blocks), and
//! hashes are renumbered to consecutive integers in order of first appearance,
//! as Mooncake and AgentX do. The same seed and options always give the same
//! trace: the generator has its own small PRNG and distributions, so no
//! dependency update can change a committed example.
//!
//! Defaults, the `coding-agent` preset ([`Preset`]) and where their figures
//! come from are in `docs/trace-format.md` ("Generated traces").

mod preset;
mod shape;

pub use preset::Preset;

use shape::Shape;

use crate::trace::{
    AgentSpec, Api, EndReason, Header, ModelError, RequestSpec, SessionSpec, Trace, TraceBuilder,
    TurnKind,
};
use serde::Serialize;
use std::collections::HashMap;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Everything the generator draws from, with documented defaults.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenerateOptions {
    /// PRNG seed.
    pub seed: u64,
    /// Sessions.
    pub sessions: u32,
    /// Mean gap between session starts, ms (Poisson arrivals).
    pub session_gap_ms: f64,
    /// When set, sessions start uniformly at random over this span, ms
    /// (a Poisson process of `sessions` arrivals in it), drawn from a stream
    /// of their own: the sessions are the same at any span.
    pub session_span_ms: Option<f64>,
    /// Tokens per block.
    pub block_size: u32,
    /// API of every request.
    #[serde(serialize_with = "api_name")]
    pub api: Api,
    /// Model name recorded on every request.
    pub model: Option<String>,
    /// Sessions are spread round-robin over this many tenants (`t0`, `t1`, …; 0 = none).
    pub tenants: u32,
    /// Every session's planner uses the same system prompt and tools (and
    /// every subagent of a type the same ones), so they share those blocks.
    pub shared_system_prompt: bool,
    /// Distinct harness preambles (system prompt and tools of the planner
    /// and of every subagent type) shared across sessions; a session picks
    /// harness `k` with weight 1/(k+1). Needs `shared_system_prompt`.
    pub harnesses: u32,
    /// Planner system prompt, tokens.
    pub system_tokens: u32,
    /// Planner tool schemas, tokens.
    pub tool_tokens: u32,
    /// When set, a session's size is drawn first: its requests (planner and
    /// subagents together) are log-normal with this median, and user turns
    /// and subagent calls follow from it (`user_turns_mean` and
    /// `subagent_calls_mean` are then unused).
    pub session_requests_median: Option<f64>,
    /// σ of the log of the session size (with `session_requests_median`).
    pub session_requests_sigma: f64,
    /// Share of a subagent-using session's requests that its subagents make
    /// (with `session_requests_median`).
    pub subagent_request_share: f64,
    /// Mean user turns per session (≥ 1).
    pub user_turns_mean: f64,
    /// Mean model calls per user turn (≥ 1): a tool loop.
    pub calls_per_turn_mean: f64,
    /// Share of sessions that use subagents.
    pub subagent_share: f64,
    /// Mean subagents of a session that uses them (≥ 1).
    pub subagents_mean: f64,
    /// Mean model calls of a subagent (≥ 1).
    pub subagent_calls_mean: f64,
    /// Subagent system prompt, tokens.
    pub subagent_system_tokens: u32,
    /// Subagent tool schemas, tokens.
    pub subagent_tool_tokens: u32,
    /// Median first user message, tokens.
    pub first_message_tokens: f64,
    /// Median later user message, tokens.
    pub user_message_tokens: f64,
    /// Median tool result, tokens.
    pub tool_result_tokens: f64,
    /// A tool result's median is at least this share of the room left below
    /// `max_context_tokens` (0 = off): agents read whole files early and make
    /// small edits late, so contexts grow fast and then level off.
    pub tool_result_headroom: f64,
    /// Median subagent task message, tokens.
    pub task_tokens: f64,
    /// Median output, tokens.
    pub output_tokens: f64,
    /// Log-normal shape (σ of the log) of every token-count distribution.
    pub sigma: f64,
    /// Median tool time, ms.
    pub tool_ms: f64,
    /// Median user think time between turns, ms.
    pub think_ms: f64,
    /// σ of the log of the user think time.
    pub think_sigma: f64,
    /// When a prompt would exceed this, the harness compacts: the context
    /// restarts from the preamble plus a summary.
    pub max_context_tokens: u32,
    /// Median summary after a compaction, tokens.
    pub summary_tokens: f64,
    /// Assumed response time per output token, ms (lays out arrivals only).
    pub response_ms_per_token: f64,
    /// Assumed fixed response time, ms.
    pub response_ms_fixed: f64,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            seed: 1,
            sessions: 8,
            session_gap_ms: 20_000.0,
            session_span_ms: None,
            block_size: 64,
            api: Api::Chat,
            model: None,
            tenants: 0,
            shared_system_prompt: true,
            harnesses: 1,
            system_tokens: 3_000,
            tool_tokens: 9_000,
            session_requests_median: None,
            session_requests_sigma: 0.8,
            subagent_request_share: 0.35,
            user_turns_mean: 4.0,
            calls_per_turn_mean: 11.0,
            subagent_share: 0.44,
            subagents_mean: 2.0,
            subagent_calls_mean: 10.0,
            subagent_system_tokens: 1_500,
            subagent_tool_tokens: 4_000,
            first_message_tokens: 300.0,
            user_message_tokens: 150.0,
            tool_result_tokens: 4_000.0,
            tool_result_headroom: 0.0,
            task_tokens: 400.0,
            output_tokens: 444.0,
            sigma: 1.0,
            tool_ms: 1_500.0,
            think_ms: 30_000.0,
            think_sigma: 1.0,
            max_context_tokens: 200_000,
            summary_tokens: 8_000.0,
            response_ms_per_token: 12.0,
            response_ms_fixed: 400.0,
        }
    }
}

/// A generator option out of its range, or a trace the model refuses.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// An option is out of range; `flag` is its `tether trace generate` flag.
    #[error("{flag} {why}")]
    Option {
        /// The option's flag.
        flag: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The trace model refused what was generated.
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl GenerateOptions {
    /// Refuses options the generator cannot honour, naming the flag.
    pub fn check(&self) -> Result<(), GenerateError> {
        let bad = |flag, why| Err(GenerateError::Option { flag, why });
        let positive = [
            ("--first-message-tokens", self.first_message_tokens),
            ("--user-message-tokens", self.user_message_tokens),
            ("--tool-result-tokens", self.tool_result_tokens),
            ("--task-tokens", self.task_tokens),
            ("--output-tokens", self.output_tokens),
            ("--summary-tokens", self.summary_tokens),
        ];
        let non_negative = [
            ("--session-gap-ms", self.session_gap_ms),
            ("--span-s", self.session_span_ms.unwrap_or(0.0)),
            ("--session-requests-sigma", self.session_requests_sigma),
            ("--sigma", self.sigma),
            ("--think-sigma", self.think_sigma),
            ("--tool-ms", self.tool_ms),
            ("--think-ms", self.think_ms),
            ("--response-ms-per-token", self.response_ms_per_token),
            ("--response-ms-fixed", self.response_ms_fixed),
            ("--user-turns", self.user_turns_mean),
            ("--calls-per-turn", self.calls_per_turn_mean),
            ("--subagents", self.subagents_mean),
            ("--subagent-calls", self.subagent_calls_mean),
        ];
        let shares = [
            ("--subagent-share", self.subagent_share),
            ("--subagent-request-share", self.subagent_request_share),
            ("--tool-result-headroom", self.tool_result_headroom),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            return bad(flag, "must be a positive number");
        }
        if let Some((flag, _)) = non_negative
            .iter()
            .find(|(_, v)| !(v.is_finite() && *v >= 0.0))
        {
            return bad(flag, "must be a number ≥ 0");
        }
        if let Some((flag, _)) = shares.iter().find(|(_, v)| !(0.0..=1.0).contains(v)) {
            return bad(flag, "must be a share between 0 and 1");
        }
        if self.tool_result_headroom >= 1.0 {
            return bad("--tool-result-headroom", "must be below 1");
        }
        if self
            .session_requests_median
            .is_some_and(|m| !(m.is_finite() && m >= 1.0))
        {
            return bad("--session-requests", "must be a number ≥ 1");
        }
        if self.block_size == 0 {
            return bad("--block-size", "must be at least 1");
        }
        if self.harnesses == 0 {
            return bad("--harnesses", "must be at least 1");
        }
        if self.harnesses > 1 && !self.shared_system_prompt {
            return bad(
                "--harnesses",
                "needs shared system prompts (not --own-system-prompts)",
            );
        }
        let preamble = u64::from(self.system_tokens) + u64::from(self.tool_tokens);
        let sub = u64::from(self.subagent_system_tokens) + u64::from(self.subagent_tool_tokens);
        if u64::from(self.max_context_tokens) <= preamble.max(sub) {
            return bad(
                "--max-context-tokens",
                "must exceed the system prompt and tools it compacts down to",
            );
        }
        Ok(())
    }
}

fn api_name<S: serde::Serializer>(a: &Api, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(a.name())
}

/// SplitMix64: small, seeded, and fixed forever (committed examples depend on it).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
    fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
    /// 1, 2, 3, … with the given mean (geometric).
    fn count(&mut self, mean: f64) -> u32 {
        if mean <= 1.0 {
            return 1;
        }
        let p = 1.0 / mean;
        1 + (self.unit().ln() / (1.0 - p).ln()).floor().min(1e6) as u32
    }
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    /// Tokens from a log-normal, at least 1 and at most `cap`.
    fn tokens(&mut self, median: f64, sigma: f64, cap: u32) -> u32 {
        (self.lognormal(median, sigma).round().max(1.0) as u64).min(u64::from(cap)) as u32
    }
}

/// Content hashes → consecutive block ids, in order of first appearance.
/// Blocks can only be shared across sessions inside a preamble (system
/// prompt and tools), so only those are remembered for the whole trace; the
/// rest are forgotten after each session, which keeps a million-request
/// generation in bounded memory.
#[derive(Default)]
struct Interner {
    shared: HashMap<u64, u64>,
    session: HashMap<u64, u64>,
    next: u64,
}

impl Interner {
    fn id(&mut self, hash: u64, preamble: bool) -> u64 {
        let map = if preamble {
            &mut self.shared
        } else {
            &mut self.session
        };
        *map.entry(hash).or_insert_with(|| {
            self.next += 1;
            self.next - 1
        })
    }
}

/// An agent's context: segments of content and the chained hash of every block.
#[derive(Clone, Debug, Default)]
struct Context {
    /// (content id, tokens), in order.
    segs: Vec<(u64, u32)>,
    /// Start token of each segment.
    starts: Vec<u64>,
    len: u64,
    /// Chained hash of each block (the last one possibly partial).
    hashes: Vec<u64>,
    /// Tokens of the preamble (blocks entirely inside it may be shared across sessions).
    preamble: u64,
}

impl Context {
    fn push(&mut self, content: u64, tokens: u32, bs: u64) {
        if tokens == 0 {
            return;
        }
        let old = self.len;
        self.segs.push((content, tokens));
        self.starts.push(old);
        self.len += u64::from(tokens);
        // Re-hash from the block the old context ended in (it was partial, or is new).
        let from = (old / bs) as usize;
        self.hashes.truncate(from);
        let blocks = self.len.div_ceil(bs) as usize;
        for j in from..blocks {
            let (lo, hi) = (j as u64 * bs, ((j as u64 + 1) * bs).min(self.len));
            let mut h = self.hashes.last().copied().unwrap_or(0x7e7e);
            let mut s = self.starts.partition_point(|&st| st <= lo) - 1;
            let mut pos = lo;
            while pos < hi {
                let (c, n) = self.segs[s];
                let end = (self.starts[s] + u64::from(n)).min(hi);
                let piece = [c, pos - self.starts[s], end - pos];
                let bytes: Vec<u8> = piece.iter().flat_map(|x| x.to_le_bytes()).collect();
                h = xxh3_64_with_seed(&bytes, h);
                pos = end;
                s += 1;
            }
            self.hashes.push(h);
        }
    }

    fn ids(&self, interner: &mut Interner, bs: u64) -> Vec<u64> {
        self.hashes
            .iter()
            .enumerate()
            .map(|(j, &h)| interner.id(h, (j as u64 + 1) * bs <= self.preamble))
            .collect()
    }
}

/// Content ids: shared ones are fixed names, the rest unique per draw.
struct Contents {
    next: u64,
}

impl Contents {
    fn unique(&mut self) -> u64 {
        self.next += 1;
        xxh3_64_with_seed(&self.next.to_le_bytes(), 0xc0)
    }
    fn named(name: &str) -> u64 {
        xxh3_64_with_seed(name.as_bytes(), 0xc1)
    }
}

/// Harness overhead between a response and the subagent it spawns (and back), ms.
const SPAWN_MS: f64 = 200.0;

/// Subagent types and their weights.
const SUBAGENT_TYPES: [(&str, f64); 3] = [
    ("explore", 0.6),
    ("general-purpose", 0.25),
    ("verifier", 0.15),
];

struct Gen<'a> {
    o: &'a GenerateOptions,
    rng: Rng,
    contents: Contents,
    interner: Interner,
    b: TraceBuilder,
}

/// One request as planned before it goes to the builder.
struct Planned {
    spec: RequestSpec,
    ids: Vec<u64>,
}

impl Gen<'_> {
    fn response_ms(&self, output: u32) -> f64 {
        self.o.response_ms_fixed + self.o.response_ms_per_token * f64::from(output)
    }

    /// The preamble of an agent of type `kind`: shared by every session of
    /// the same harness, or the session's own.
    fn preamble(
        &mut self,
        session: u32,
        harness: u32,
        kind: &str,
        system: u32,
        tools: u32,
    ) -> Context {
        let mut c = Context::default();
        let bs = u64::from(self.o.block_size);
        // Harness 0 keeps the names of a single shared preamble.
        let h = if harness == 0 {
            String::new()
        } else {
            format!("/h{harness}")
        };
        let (sys, tl) = if self.o.shared_system_prompt {
            (
                Contents::named(&format!("system/{kind}{h}")),
                Contents::named(&format!("tools/{kind}{h}")),
            )
        } else {
            (
                Contents::named(&format!("system/{kind}/{session}")),
                Contents::named(&format!("tools/{kind}/{session}")),
            )
        };
        // Tool schemas first, then the system prompt: the order of Chat bodies
        // (the synthesizer lays out every API's head from these two counts).
        c.push(tl, tools, bs);
        c.push(sys, system, bs);
        c.preamble = c.len;
        c
    }

    /// The session's harness: `k` with weight 1/(k+1) (nothing is drawn for one).
    fn harness(&mut self) -> u32 {
        let n = self.o.harnesses;
        if n <= 1 {
            return 0;
        }
        let total: f64 = (1..=n).map(|k| 1.0 / f64::from(k)).sum();
        let mut r = self.rng.unit() * total;
        for k in 0..n {
            r -= 1.0 / f64::from(k + 1);
            if r < 0.0 {
                return k;
            }
        }
        n - 1
    }

    fn out_tokens(&mut self) -> u32 {
        self.rng.tokens(self.o.output_tokens, self.o.sigma, 32_000)
    }

    /// Appends the last response (`output` tokens) and the next message
    /// (`message` tokens) to `ctx`; when that would exceed the maximum the
    /// harness compacts first: the context restarts from the preamble plus a
    /// summary (which replaces the response too).
    fn append(&mut self, ctx: &mut Context, preamble: &Context, output: u32, message: u32) {
        let bs = u64::from(self.o.block_size);
        if ctx.len + u64::from(output) + u64::from(message) > u64::from(self.o.max_context_tokens) {
            *ctx = preamble.clone();
            let s = self
                .rng
                .tokens(self.o.summary_tokens, 0.3, self.o.max_context_tokens / 4);
            let id = self.contents.unique();
            ctx.push(id, s, bs);
        } else {
            let id = self.contents.unique();
            ctx.push(id, output, bs);
        }
        let id = self.contents.unique();
        ctx.push(id, message, bs);
    }

    /// A tool result's tokens, for a context of `len` tokens.
    fn result_tokens(&mut self, len: u64) -> u32 {
        let cap = (self.o.max_context_tokens / 4).max(1);
        let room = u64::from(self.o.max_context_tokens).saturating_sub(len) as f64;
        let median = self
            .o
            .tool_result_tokens
            .max(self.o.tool_result_headroom * room);
        self.rng.tokens(median, self.o.sigma, cap)
    }

    fn planned(
        &mut self,
        ctx: &Context,
        at: f64,
        output: u32,
        opened_by: TurnKind,
        gap: Option<f64>,
    ) -> Planned {
        let mut spec = RequestSpec::new(
            at.round() as u64,
            u32::try_from(ctx.len).unwrap_or(u32::MAX),
            output,
            opened_by,
        );
        spec.gap_ms = gap.map(|g| g.round() as u64);
        spec.api = self.o.api;
        spec.model = self.o.model.clone();
        Planned {
            spec,
            ids: ctx.ids(&mut self.interner, u64::from(self.o.block_size)),
        }
    }

    /// A subagent's tool loop of `calls` model calls (drawn here when the
    /// session's shape leaves it open) from `start` (ms after the session
    /// start); returns its requests, its end time and its final output's tokens.
    fn subagent(
        &mut self,
        session: u32,
        harness: u32,
        kind: &str,
        start: f64,
        calls: Option<u32>,
    ) -> (Vec<Planned>, f64, u32) {
        let bs = u64::from(self.o.block_size);
        let preamble = self.preamble(
            session,
            harness,
            kind,
            self.o.subagent_system_tokens,
            self.o.subagent_tool_tokens,
        );
        let mut ctx = preamble.clone();
        let task = self.rng.tokens(self.o.task_tokens, self.o.sigma, 20_000);
        let id = self.contents.unique();
        ctx.push(id, task, bs);
        let calls = match calls {
            Some(n) => n,
            None => self.rng.count(self.o.subagent_calls_mean),
        };
        let mut out = Vec::new();
        let (mut t, mut gap, mut opened) = (start, Some(SPAWN_MS), TurnKind::Handoff);
        let mut last_out = 0;
        for c in 0..calls {
            let output = self.out_tokens();
            let mut p = self.planned(&ctx, t, output, opened, gap);
            let last = c + 1 == calls;
            p.spec.ended_by = Some(if last {
                EndReason::EndTurn
            } else {
                EndReason::ToolCall
            });
            out.push(p);
            t += self.response_ms(output);
            last_out = output;
            if last {
                break;
            }
            let result = self.result_tokens(ctx.len);
            self.append(&mut ctx, &preamble, output, result);
            let tool = self.rng.lognormal(self.o.tool_ms, 1.0);
            t += tool;
            gap = Some(tool);
            opened = TurnKind::Tool;
        }
        (out, t, last_out)
    }

    fn session(&mut self, s: u32, start: f64) -> Result<(), ModelError> {
        self.interner.session.clear();
        let bs = u64::from(self.o.block_size);
        let o = self.o;
        let sid = self.b.session(SessionSpec {
            id: format!("s{s:04}"),
            start_ms: Some(start.round() as u64),
            tenant: (o.tenants > 0).then(|| format!("t{}", s % o.tenants)),
            user: None,
        })?;
        let main = self.b.agent(
            sid,
            AgentSpec {
                id: "main".to_owned(),
                agent_type: "planner".to_owned(),
                system_tokens: Some(o.system_tokens),
                tool_tokens: Some(o.tool_tokens),
                ..AgentSpec::default()
            },
        )?;
        let harness = self.harness();
        let shape = match o.session_requests_median {
            Some(median) => Shape::sized(&mut self.rng, o, median),
            None => Shape::counted(&mut self.rng, o),
        };
        let (calls, spawn) = (&shape.turns, &shape.spawns);

        let preamble = self.preamble(s, harness, "planner", o.system_tokens, o.tool_tokens);
        let mut ctx = preamble.clone();
        let first = self.rng.tokens(o.first_message_tokens, o.sigma, 50_000);
        let id = self.contents.unique();
        ctx.push(id, first, bs);
        let mut t = 0.0;
        let (mut opened, mut gap) = (TurnKind::First, None);
        let mut main_reqs: Vec<Planned> = Vec::new();
        let mut subs: Vec<(String, String, usize, Vec<Planned>)> = Vec::new();
        let mut pending_output = 0;
        for (u, &n) in calls.iter().enumerate() {
            if u > 0 {
                let think = self.rng.lognormal(o.think_ms, o.think_sigma);
                t += think;
                let m = self.rng.tokens(o.user_message_tokens, o.sigma, 20_000);
                self.append(&mut ctx, &preamble, pending_output, m);
                opened = TurnKind::User;
                gap = Some(think);
            }
            for c in 0..n {
                let output = self.out_tokens();
                let mut p = self.planned(&ctx, t, output, opened, gap);
                let last = c + 1 == n;
                let spawned = spawn.iter().find(|(at, _)| *at == (u as u32, c));
                let hands_off = spawned.is_some();
                p.spec.ended_by = Some(if last {
                    EndReason::EndTurn
                } else if hands_off {
                    EndReason::Handoff
                } else {
                    EndReason::ToolCall
                });
                main_reqs.push(p);
                t += self.response_ms(output);
                if last {
                    pending_output = output;
                    break;
                }
                let (result, wait) = if let Some(&(_, sub_calls)) = spawned {
                    let r = self.rng.unit();
                    let mut acc = 0.0;
                    let kind = SUBAGENT_TYPES
                        .iter()
                        .find(|(_, w)| {
                            acc += w;
                            r < acc
                        })
                        .map_or("explore", |(k, _)| k);
                    let spawn_at = t + SPAWN_MS;
                    let (reqs, end, last_out) =
                        self.subagent(s, harness, kind, spawn_at, sub_calls);
                    subs.push((
                        format!("agent-{:03}", subs.len() + 1),
                        kind.to_owned(),
                        main_reqs.len() - 1,
                        reqs,
                    ));
                    (last_out.max(1), end - t + SPAWN_MS)
                } else {
                    (
                        self.result_tokens(ctx.len),
                        self.rng.lognormal(o.tool_ms, 1.0),
                    )
                };
                t += wait;
                self.append(&mut ctx, &preamble, output, result);
                opened = if hands_off {
                    TurnKind::Handoff
                } else {
                    TurnKind::Tool
                };
                gap = Some(wait);
            }
        }
        for p in main_reqs {
            self.b.request(main, p.spec, &p.ids)?;
        }
        for (id, kind, spawned_by, reqs) in subs {
            let a = self.b.agent(
                sid,
                AgentSpec {
                    id,
                    agent_type: kind,
                    parent: Some("main".to_owned()),
                    spawned_by_turn: Some(spawned_by),
                    system_tokens: Some(o.subagent_system_tokens),
                    tool_tokens: Some(o.subagent_tool_tokens),
                },
            )?;
            for p in reqs {
                self.b.request(a, p.spec, &p.ids)?;
            }
        }
        Ok(())
    }
}

/// Seeds the stream session arrivals are drawn from when they span a fixed
/// time, apart from the sessions' own draws.
const ARRIVAL_STREAM: u64 = 0xa77e_55a1;

/// Session start times over `span` ms: sorted uniform draws.
fn spread(o: &GenerateOptions, span: f64) -> Vec<f64> {
    let mut rng = Rng(o.seed ^ ARRIVAL_STREAM);
    let mut starts: Vec<f64> = (0..o.sessions).map(|_| rng.unit() * span).collect();
    starts.sort_by(f64::total_cmp);
    starts
}

/// Generates a trace.
pub fn generate(o: &GenerateOptions) -> Result<Trace, GenerateError> {
    o.check()?;
    let b = TraceBuilder::with_header(Header {
        block_size: o.block_size,
        name: Some(format!("generated seed {} sessions {}", o.seed, o.sessions)),
        source: Some(serde_json::json!({
            "format": "generated",
            "generator": "tether trace generate",
            "options": o,
        })),
    })?;
    let mut g = Gen {
        o,
        rng: Rng(o.seed),
        contents: Contents {
            next: o.seed.rotate_left(17),
        },
        interner: Interner::default(),
        b,
    };
    let spread = o.session_span_ms.map(|span| spread(o, span));
    let mut start = 0.0;
    for s in 0..o.sessions {
        match &spread {
            Some(starts) => start = starts.get(s as usize).copied().unwrap_or(start),
            None if s > 0 => start += g.rng.exponential(o.session_gap_ms),
            None => {}
        }
        g.session(s, start)?;
    }
    Ok(g.b.build()?)
}

#[cfg(test)]
mod tests;
