//! The typed agent-trace model: sessions → agents → requests, and the builder that checks it.

use super::blocks::{BlockRef, BlockStore};
use serde_json::value::RawValue;
use std::collections::HashMap;
use tether_wire::TurnKind;
use thiserror::Error;

/// Index of a session in [`Trace::sessions`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u32);
/// Index of an agent in [`Trace::agents`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(pub u32);
/// Index of a request in [`Trace::requests`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u32);

/// The API a request is sent with: the one type of the wire contract.
pub use tether_wire::Api;

/// How a response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndReason {
    /// The model called a tool; the agent's next request opens with its result.
    ToolCall,
    /// The model ended its turn; the next request (if any) is a user reply.
    EndTurn,
    /// The model handed work to a subagent (a `Task`-style tool call); the
    /// agent's next request opens with the subagent's result.
    Handoff,
}

impl EndReason {
    /// Every reason.
    pub const ALL: [EndReason; 3] = [EndReason::ToolCall, EndReason::EndTurn, EndReason::Handoff];

    /// The trace-file name.
    pub const fn name(self) -> &'static str {
        match self {
            EndReason::ToolCall => "tool_call",
            EndReason::EndTurn => "end_turn",
            EndReason::Handoff => "handoff",
        }
    }

    /// Parses a trace-file name.
    pub fn parse(s: &str) -> Option<EndReason> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// Trace-wide facts.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// Tokens per prefix block (every request's `hash_ids` are at this size).
    pub block_size: u32,
    /// Free-form name.
    pub name: Option<String>,
    /// Where the trace came from (importer, file, derivation report,
    /// generator parameters): recorded, not interpreted.
    pub source: Option<serde_json::Value>,
}

/// One logical agent run: its agents and requests.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    /// Id, unique in the trace.
    pub id: String,
    /// When the session starts on the trace's timeline (ms); `None` when the
    /// trace has no shared timeline (independently recorded sessions).
    pub start_ms: Option<u64>,
    /// Tenant the session belongs to, if known.
    pub tenant: Option<String>,
    /// End user, if known.
    pub user: Option<String>,
    /// Its agents, the main agent first.
    pub agents: Vec<AgentId>,
}

/// One agent: the main agent of a session or a subagent it spawned.
#[derive(Clone, Debug, PartialEq)]
pub struct Agent {
    /// Id, unique in the session.
    pub id: String,
    /// Its session.
    pub session: SessionId,
    /// What it does: `main`, `planner`, `explore`, `verifier`, … (free-form).
    pub agent_type: String,
    /// The agent that spawned it (`None` for the main agent).
    pub parent: Option<AgentId>,
    /// The parent's request whose response spawned it.
    pub spawned_by: Option<RequestId>,
    /// Tokens of its system prompt, if known (the synthesizer's head layout).
    pub system_tokens: Option<u32>,
    /// Tokens of its tool schemas, if known.
    pub tool_tokens: Option<u32>,
    /// Its requests, in order.
    pub requests: Vec<RequestId>,
}

/// One model call.
#[derive(Clone, Debug)]
pub struct Request {
    /// Its session.
    pub session: SessionId,
    /// Its agent.
    pub agent: AgentId,
    /// Arrival, ms after the session's start.
    pub at_ms: u64,
    /// Think/tool time between the previous response of this agent (or the
    /// spawn) and this request, when the source records it.
    pub gap_ms: Option<u64>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// What opened the turn (its last message).
    pub opened_by: TurnKind,
    /// How the response ended, when known.
    pub ended_by: Option<EndReason>,
    /// The API it is sent with.
    pub api: Api,
    /// Index into [`Trace::models`].
    pub model: Option<u32>,
    /// Prefix-block ids (read them with [`Trace::hash_ids`]).
    pub blocks: BlockRef,
    /// The real conversation, when the source has it (carried, not synthesized).
    pub messages: Option<Box<RawValue>>,
}

impl Request {
    /// Its prompt tokens and the output tokens a replay asks for (the trace's, at
    /// least 1): what a rank's context window is checked against.
    pub fn asked_tokens(&self) -> (u64, u64) {
        (
            u64::from(self.input_tokens),
            u64::from(self.output_tokens.max(1)),
        )
    }
}

/// A whole trace in memory. Build one with [`TraceBuilder`] or read one with
/// [`crate::trace::read_trace`]; it is valid by construction.
#[derive(Clone, Debug)]
pub struct Trace {
    pub(crate) header: Header,
    pub(crate) sessions: Vec<Session>,
    pub(crate) agents: Vec<Agent>,
    pub(crate) requests: Vec<Request>,
    pub(crate) models: Vec<String>,
    pub(crate) blocks: BlockStore,
}

impl Trace {
    /// Trace-wide facts.
    pub fn header(&self) -> &Header {
        &self.header
    }
    /// Tokens per prefix block.
    pub fn block_size(&self) -> u32 {
        self.header.block_size
    }
    /// All sessions.
    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }
    /// All agents.
    pub fn agents(&self) -> &[Agent] {
        &self.agents
    }
    /// All requests, grouped by session, each session's in arrival order.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }
    /// Model names (indexed by [`Request::model`]).
    pub fn models(&self) -> &[String] {
        &self.models
    }
    /// The shared block store.
    pub fn blocks(&self) -> &BlockStore {
        &self.blocks
    }
    /// A session.
    pub fn session(&self, id: SessionId) -> &Session {
        &self.sessions[id.0 as usize]
    }
    /// An agent.
    pub fn agent(&self, id: AgentId) -> &Agent {
        &self.agents[id.0 as usize]
    }
    /// A request.
    pub fn request(&self, id: RequestId) -> &Request {
        &self.requests[id.0 as usize]
    }
    /// The model name of a request.
    pub fn model_of(&self, id: RequestId) -> Option<&str> {
        self.request(id)
            .model
            .and_then(|m| self.models.get(m as usize))
            .map(String::as_str)
    }
    /// The prefix-block ids of a request.
    pub fn hash_ids(&self, id: RequestId) -> Vec<u64> {
        self.blocks.ids(self.request(id).blocks)
    }
    /// The prefix-block ids of a request, into a reused buffer.
    pub fn hash_ids_into(&self, id: RequestId, out: &mut Vec<u64>) {
        self.blocks.ids_into(self.request(id).blocks, out);
    }
    /// Number of prefix blocks of a request.
    pub fn block_count(&self, id: RequestId) -> usize {
        self.blocks.len(self.request(id).blocks)
    }
    /// Arrival on the trace's timeline (session start + `at_ms`), when the
    /// session has a start.
    pub fn arrival_ms(&self, id: RequestId) -> Option<u64> {
        let r = self.request(id);
        self.session(r.session)
            .start_ms
            .map(|s| s.saturating_add(r.at_ms))
    }
    /// Every request in arrival order on the trace's timeline; sessions
    /// without a start count as starting at 0. Ties keep trace order.
    pub fn by_arrival(&self) -> Vec<RequestId> {
        let mut ids: Vec<RequestId> = (0..self.requests.len() as u32).map(RequestId).collect();
        ids.sort_by_key(|&id| self.arrival_ms(id).unwrap_or(self.request(id).at_ms));
        ids
    }
    /// The request ids of a session, in arrival order (all its agents interleaved).
    pub fn session_requests(&self, id: SessionId) -> Vec<RequestId> {
        let s = self.session(id);
        let mut ids: Vec<RequestId> = s
            .agents
            .iter()
            .flat_map(|a| self.agent(*a).requests.iter().copied())
            .collect();
        ids.sort_by_key(|&r| (self.request(r).at_ms, r));
        ids
    }
    /// Turn number of a request within its agent (0-based).
    pub fn turn_of(&self, id: RequestId) -> usize {
        let a = self.agent(self.request(id).agent);
        a.requests.iter().position(|&r| r == id).unwrap_or(0)
    }
}

/// A model that is not well formed; the reader adds file and line.
#[derive(Debug, Error, PartialEq)]
pub enum ModelError {
    /// `block_size` 0.
    #[error("block_size must be at least 1")]
    BlockSize,
    /// Two sessions with one id.
    #[error("session `{0}` is defined twice")]
    DuplicateSession(String),
    /// Two agents with one id in a session.
    #[error("agent `{agent}` is defined twice in session `{session}`")]
    DuplicateAgent { session: String, agent: String },
    /// A reference to a session that does not exist (yet).
    #[error("unknown session `{0}` (a session line must come before its agents and requests)")]
    UnknownSession(String),
    /// A reference to an agent that does not exist (yet).
    #[error(
        "unknown agent `{agent}` in session `{session}` (an agent line must come before its requests and subagents)"
    )]
    UnknownAgent { session: String, agent: String },
    /// A subagent's spawning turn is outside its parent's requests.
    #[error("agent `{agent}` is spawned by turn {turn} of `{parent}`, which has {count} requests")]
    SpawnTurn {
        agent: String,
        parent: String,
        turn: usize,
        count: usize,
    },
    /// `spawned_by_turn` without a parent.
    #[error("agent `{0}` names a spawning turn but no parent")]
    SpawnWithoutParent(String),
    /// A second agent without a parent.
    #[error(
        "session `{0}` has more than one agent without a parent (only the main agent has none)"
    )]
    TwoMains(String),
    /// A session with no main agent.
    #[error("session `{0}` has no main agent (an agent without a parent)")]
    NoMain(String),
    /// Requests of one agent going back in time.
    #[error(
        "agent `{agent}` of session `{session}`: request at {at_ms} ms comes after one at {prev_ms} ms"
    )]
    OutOfOrder {
        session: String,
        agent: String,
        at_ms: u64,
        prev_ms: u64,
    },
    /// An agent without requests.
    #[error("agent `{agent}` of session `{session}` has no requests")]
    EmptyAgent { session: String, agent: String },
    /// No requests at all.
    #[error("the trace has no requests")]
    NoRequests,
    /// More than `u32::MAX` of something.
    #[error("too many {0} for one trace")]
    TooMany(&'static str),
    /// An empty id.
    #[error("{0} id must not be empty")]
    EmptyId(&'static str),
}

/// What a session line says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionSpec {
    /// Id, unique in the trace.
    pub id: String,
    /// Start on the trace's timeline.
    pub start_ms: Option<u64>,
    /// Tenant.
    pub tenant: Option<String>,
    /// End user.
    pub user: Option<String>,
}

/// What an agent line says (parent by id, spawning turn by index).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentSpec {
    /// Id, unique in the session.
    pub id: String,
    /// What it does.
    pub agent_type: String,
    /// Parent agent's id.
    pub parent: Option<String>,
    /// Index of the parent's request that spawned it.
    pub spawned_by_turn: Option<usize>,
    /// System prompt tokens.
    pub system_tokens: Option<u32>,
    /// Tool schema tokens.
    pub tool_tokens: Option<u32>,
}

/// What a request line says, besides its blocks.
#[derive(Clone, Debug)]
pub struct RequestSpec {
    /// Arrival after the session start, ms.
    pub at_ms: u64,
    /// Think/tool gap, ms.
    pub gap_ms: Option<u64>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// What opened the turn.
    pub opened_by: TurnKind,
    /// How the response ended.
    pub ended_by: Option<EndReason>,
    /// API.
    pub api: Api,
    /// Model name.
    pub model: Option<String>,
    /// Real conversation.
    pub messages: Option<Box<RawValue>>,
}

impl RequestSpec {
    /// A plain Chat request with only token counts.
    pub fn new(at_ms: u64, input_tokens: u32, output_tokens: u32, opened_by: TurnKind) -> Self {
        Self {
            at_ms,
            gap_ms: None,
            input_tokens,
            output_tokens,
            opened_by,
            ended_by: None,
            api: Api::Chat,
            model: None,
            messages: None,
        }
    }
}

/// Builds a [`Trace`], checking each step.
#[derive(Debug)]
pub struct TraceBuilder {
    trace: Trace,
    session_ix: HashMap<String, SessionId>,
    agent_ix: HashMap<(SessionId, String), AgentId>,
    model_ix: HashMap<String, u32>,
    /// Spawn turns to resolve at the end: (agent, turn).
    spawns: Vec<(AgentId, usize)>,
}

fn id32(n: usize, what: &'static str) -> Result<u32, ModelError> {
    u32::try_from(n).map_err(|_| ModelError::TooMany(what))
}

impl TraceBuilder {
    /// A builder for a trace at `block_size` tokens per block.
    pub fn new(block_size: u32) -> Result<Self, ModelError> {
        Self::with_header(Header {
            block_size,
            name: None,
            source: None,
        })
    }

    /// A builder with a full header.
    pub fn with_header(header: Header) -> Result<Self, ModelError> {
        if header.block_size == 0 {
            return Err(ModelError::BlockSize);
        }
        Ok(Self {
            trace: Trace {
                header,
                sessions: Vec::new(),
                agents: Vec::new(),
                requests: Vec::new(),
                models: Vec::new(),
                blocks: BlockStore::new(),
            },
            session_ix: HashMap::new(),
            agent_ix: HashMap::new(),
            model_ix: HashMap::new(),
            spawns: Vec::new(),
        })
    }

    /// The header being built (importers fill `source` at the end).
    pub fn header_mut(&mut self) -> &mut Header {
        &mut self.trace.header
    }

    /// Looks a session up by id.
    pub fn session_id(&self, id: &str) -> Option<SessionId> {
        self.session_ix.get(id).copied()
    }

    /// Looks an agent up by session and id.
    pub fn agent_id(&self, session: SessionId, id: &str) -> Option<AgentId> {
        self.agent_ix.get(&(session, id.to_owned())).copied()
    }

    /// Requests added so far to an agent.
    pub fn request_count(&self, agent: AgentId) -> usize {
        self.trace.agents[agent.0 as usize].requests.len()
    }

    /// Adds a session.
    pub fn session(&mut self, spec: SessionSpec) -> Result<SessionId, ModelError> {
        if spec.id.is_empty() {
            return Err(ModelError::EmptyId("session"));
        }
        if self.session_ix.contains_key(&spec.id) {
            return Err(ModelError::DuplicateSession(spec.id));
        }
        let sid = SessionId(id32(self.trace.sessions.len(), "sessions")?);
        self.session_ix.insert(spec.id.clone(), sid);
        self.trace.sessions.push(Session {
            id: spec.id,
            start_ms: spec.start_ms,
            tenant: spec.tenant,
            user: spec.user,
            agents: Vec::new(),
        });
        Ok(sid)
    }

    /// Adds a session with one agent, `main` (importers of chat traces).
    pub fn chat_session(
        &mut self,
        id: String,
        start_ms: Option<u64>,
    ) -> Result<AgentId, ModelError> {
        let sid = self.session(SessionSpec {
            id,
            start_ms,
            ..SessionSpec::default()
        })?;
        self.agent(
            sid,
            AgentSpec {
                id: "main".to_owned(),
                agent_type: "main".to_owned(),
                ..AgentSpec::default()
            },
        )
    }

    /// Adds an agent to a session; its parent must exist already.
    pub fn agent(&mut self, session: SessionId, spec: AgentSpec) -> Result<AgentId, ModelError> {
        let sname = self.trace.sessions[session.0 as usize].id.clone();
        if spec.id.is_empty() {
            return Err(ModelError::EmptyId("agent"));
        }
        let key = (session, spec.id.clone());
        if self.agent_ix.contains_key(&key) {
            return Err(ModelError::DuplicateAgent {
                session: sname,
                agent: spec.id,
            });
        }
        let parent = match &spec.parent {
            Some(p) => Some(
                self.agent_id(session, p)
                    .ok_or_else(|| ModelError::UnknownAgent {
                        session: sname.clone(),
                        agent: p.clone(),
                    })?,
            ),
            None => {
                if self.trace.sessions[session.0 as usize]
                    .agents
                    .iter()
                    .any(|a| self.trace.agents[a.0 as usize].parent.is_none())
                {
                    return Err(ModelError::TwoMains(sname));
                }
                if spec.spawned_by_turn.is_some() {
                    return Err(ModelError::SpawnWithoutParent(spec.id));
                }
                None
            }
        };
        let aid = AgentId(id32(self.trace.agents.len(), "agents")?);
        if let Some(turn) = spec.spawned_by_turn {
            self.spawns.push((aid, turn));
        }
        self.agent_ix.insert(key, aid);
        self.trace.sessions[session.0 as usize].agents.push(aid);
        self.trace.agents.push(Agent {
            id: spec.id,
            session,
            agent_type: spec.agent_type,
            parent,
            spawned_by: None,
            system_tokens: spec.system_tokens,
            tool_tokens: spec.tool_tokens,
            requests: Vec::new(),
        });
        Ok(aid)
    }

    /// Adds a request to an agent, after its earlier ones.
    pub fn request(
        &mut self,
        agent: AgentId,
        spec: RequestSpec,
        hash_ids: &[u64],
    ) -> Result<RequestId, ModelError> {
        let blocks = self.trace.blocks.insert(hash_ids);
        self.request_at(agent, spec, blocks)
    }

    /// Adds a request whose blocks are given as runs `(first id, count)`.
    pub fn request_runs(
        &mut self,
        agent: AgentId,
        spec: RequestSpec,
        runs: &[(u64, u32)],
    ) -> Result<RequestId, ModelError> {
        let mut ids = Vec::new();
        for &(first, n) in runs {
            ids.extend((0..u64::from(n)).map_while(|t| first.checked_add(t)));
        }
        self.request(agent, spec, &ids)
    }

    /// Stores a block sequence now (importers that analyse all blocks before
    /// building requests); pass the result to [`TraceBuilder::request_at`].
    pub fn insert_blocks(&mut self, hash_ids: &[u64]) -> BlockRef {
        self.trace.blocks.insert(hash_ids)
    }

    /// The block store so far.
    pub fn blocks(&self) -> &BlockStore {
        &self.trace.blocks
    }

    /// Adds a request whose blocks were stored with [`TraceBuilder::insert_blocks`].
    pub fn request_at(
        &mut self,
        agent: AgentId,
        spec: RequestSpec,
        blocks: BlockRef,
    ) -> Result<RequestId, ModelError> {
        let a = &self.trace.agents[agent.0 as usize];
        if let Some(prev) = a.requests.last() {
            let prev_ms = self.trace.requests[prev.0 as usize].at_ms;
            if spec.at_ms < prev_ms {
                return Err(ModelError::OutOfOrder {
                    session: self.trace.sessions[a.session.0 as usize].id.clone(),
                    agent: a.id.clone(),
                    at_ms: spec.at_ms,
                    prev_ms,
                });
            }
        }
        let model = match spec.model {
            Some(m) => Some(match self.model_ix.get(&m) {
                Some(&i) => i,
                None => {
                    let i = id32(self.trace.models.len(), "models")?;
                    self.model_ix.insert(m.clone(), i);
                    self.trace.models.push(m);
                    i
                }
            }),
            None => None,
        };
        let rid = RequestId(id32(self.trace.requests.len(), "requests")?);
        let session = a.session;
        self.trace.agents[agent.0 as usize].requests.push(rid);
        self.trace.requests.push(Request {
            session,
            agent,
            at_ms: spec.at_ms,
            gap_ms: spec.gap_ms,
            input_tokens: spec.input_tokens,
            output_tokens: spec.output_tokens,
            opened_by: spec.opened_by,
            ended_by: spec.ended_by,
            api: spec.api,
            model,
            blocks,
            messages: spec.messages,
        });
        Ok(rid)
    }

    /// Checks what only the whole trace can show and returns it: at least one
    /// request, every agent with requests, every session with a main agent,
    /// spawning turns inside their parents. Requests are regrouped by session
    /// (each session's in arrival order).
    pub fn build(mut self) -> Result<Trace, ModelError> {
        if self.trace.requests.is_empty() {
            return Err(ModelError::NoRequests);
        }
        let t = &mut self.trace;
        for s in &t.sessions {
            if !s
                .agents
                .iter()
                .any(|a| t.agents[a.0 as usize].parent.is_none())
            {
                return Err(ModelError::NoMain(s.id.clone()));
            }
        }
        for a in &t.agents {
            if a.requests.is_empty() {
                return Err(ModelError::EmptyAgent {
                    session: t.sessions[a.session.0 as usize].id.clone(),
                    agent: a.id.clone(),
                });
            }
        }
        for &(aid, turn) in &self.spawns {
            let a = &t.agents[aid.0 as usize];
            let Some(pid) = a.parent else {
                return Err(ModelError::SpawnWithoutParent(a.id.clone()));
            };
            let p = &t.agents[pid.0 as usize];
            let Some(&req) = p.requests.get(turn) else {
                return Err(ModelError::SpawnTurn {
                    agent: a.id.clone(),
                    parent: p.id.clone(),
                    turn,
                    count: p.requests.len(),
                });
            };
            t.agents[aid.0 as usize].spawned_by = Some(req);
        }
        regroup(t);
        Ok(self.trace)
    }
}

/// Renumbers requests so each session's are contiguous and in arrival order
/// (sessions in order of their first arrival), fixing every reference.
fn regroup(t: &mut Trace) {
    let mut order: Vec<u32> = Vec::with_capacity(t.requests.len());
    let mut sessions: Vec<usize> = (0..t.sessions.len()).collect();
    let first_at = |s: usize| {
        t.sessions[s]
            .agents
            .iter()
            .filter_map(|a| t.agents[a.0 as usize].requests.first())
            .map(|r| t.requests[r.0 as usize].at_ms)
            .min()
            .unwrap_or(0)
    };
    sessions.sort_by_key(|&s| {
        (
            t.sessions[s]
                .start_ms
                .unwrap_or(0)
                .saturating_add(first_at(s)),
            s,
        )
    });
    let mut session_renumber = vec![0u32; t.sessions.len()];
    for (new, &old) in sessions.iter().enumerate() {
        session_renumber[old] = new as u32;
    }
    for &s in &sessions {
        let mut ids: Vec<u32> = t.sessions[s]
            .agents
            .iter()
            .flat_map(|a| t.agents[a.0 as usize].requests.iter().map(|r| r.0))
            .collect();
        ids.sort_by_key(|&r| (t.requests[r as usize].at_ms, r));
        order.extend(ids);
    }
    let mut renumber = vec![0u32; t.requests.len()];
    for (new, &old) in order.iter().enumerate() {
        renumber[old as usize] = new as u32;
    }
    let mut old: Vec<Option<Request>> = std::mem::take(&mut t.requests)
        .into_iter()
        .map(Some)
        .collect();
    t.requests = order
        .iter()
        .filter_map(|&o| old[o as usize].take())
        .map(|mut r| {
            r.session = SessionId(session_renumber[r.session.0 as usize]);
            r
        })
        .collect();
    for a in &mut t.agents {
        for r in &mut a.requests {
            *r = RequestId(renumber[r.0 as usize]);
        }
        if let Some(s) = &mut a.spawned_by {
            *s = RequestId(renumber[s.0 as usize]);
        }
        a.session = SessionId(session_renumber[a.session.0 as usize]);
    }
    let mut old_sessions: Vec<Option<Session>> = std::mem::take(&mut t.sessions)
        .into_iter()
        .map(Some)
        .collect();
    t.sessions = sessions
        .iter()
        .filter_map(|&s| old_sessions[s].take())
        .collect();
}

#[cfg(test)]
mod tests;
