//! Where each message of a synthesized prompt sits in its token stream, and
//! which request's block ids give it its words.
//!
//! A layout is the preamble (tool schemas and system prompt) and the
//! conversation's messages, each a token range of the prompt (its words and
//! its structural tokens: role names, tool-call ids, …). Messages are frozen
//! when they first appear: a later turn that keeps a message resends it
//! byte for byte, which is what makes the next turn's text extend the last
//! one's — including the tail of the last, partial block that the trace's ids
//! re-hash. A turn keeps its base's messages up to the first block it does not
//! share (a message ending inside that block is kept: the divergence is
//! somewhere after it), then adds the previous response and the message that
//! opened the turn, or — when it rolls back (a fork, a regeneration, a
//! compaction) — one user message with the rest.

use super::render::{self, Shape};
use crate::trace::{Api, RequestId, TurnKind};

/// A tool a call invokes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tool {
    /// An ordinary tool (`bash`).
    Bash,
    /// The subagent tool (`Task`, which the gateway reads as a handoff).
    Task,
}

impl Tool {
    /// Its name in bodies.
    pub const fn name(self) -> &'static str {
        match self {
            Tool::Bash => "bash",
            Tool::Task => "Task",
        }
    }
}

/// A call: its tool and its number within the agent (ids are `call_<n>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Call {
    /// The tool.
    pub tool: Tool,
    /// Number within the agent.
    pub n: u32,
}

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A user message (also a subagent's task, a compaction summary).
    User,
    /// A model response, possibly with a tool call.
    Assistant(Option<Call>),
    /// A tool's result.
    ToolResult(Call),
}

/// One message: tokens `start..start + len`, words from `src`'s block ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Msg {
    /// What it is.
    pub kind: Kind,
    /// First token.
    pub start: u64,
    /// Tokens, structural ones included.
    pub len: u64,
    /// The request whose block ids give its words.
    pub src: RequestId,
}

impl Msg {
    /// One past its last token.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// Tool schemas and system prompt: tokens `0..tools + system` (in the API's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preamble {
    /// Tool-schema tokens (0 = no tools member).
    pub tools: u64,
    /// System-prompt tokens (0 = no system prompt).
    pub system: u64,
    /// The request whose block ids give its words.
    pub src: RequestId,
}

/// A prompt's layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The API whose shapes it uses.
    pub api: Api,
    /// The preamble.
    pub preamble: Preamble,
    /// The conversation.
    pub msgs: Vec<Msg>,
    /// Calls made so far in this conversation (numbers the next one).
    pub calls: u32,
}

impl Layout {
    /// Its total tokens.
    pub fn end(&self) -> u64 {
        self.msgs
            .last()
            .map_or(self.preamble.tools + self.preamble.system, Msg::end)
    }
}

/// The preamble for `want_system` + `want_tools` tokens in a prompt of `total`
/// tokens: it leaves room for a first user message of at least one word, and
/// drops tools that cannot hold their structure.
pub fn preamble(
    api: Api,
    want_system: u64,
    want_tools: u64,
    total: u64,
    src: RequestId,
) -> Preamble {
    let room = total.saturating_sub(render::overhead(api, Kind::User) + 1);
    let mut tools = want_tools.min(room);
    if tools < render::tools_min(api) {
        tools = 0;
    }
    let mut system = (want_system + want_tools - tools).min(room - tools);
    if system < render::system_min(api) {
        system = 0;
    }
    Preamble { tools, system, src }
}

/// A new conversation: preamble, then one user message to `total`.
pub fn fresh(api: Api, want_system: u64, want_tools: u64, total: u64, src: RequestId) -> Layout {
    let p = preamble(api, want_system, want_tools, total, src);
    let mut l = Layout {
        api,
        preamble: p,
        msgs: Vec::new(),
        calls: 0,
    };
    push_user(&mut l, total, src);
    l
}

/// Appends a user message filling the prompt to `total` (if there is room for its structure).
fn push_user(l: &mut Layout, total: u64, src: RequestId) {
    let start = l.end();
    if total > start && total - start >= render::overhead(l.api, Kind::User) {
        l.msgs.push(Msg {
            kind: Kind::User,
            start,
            len: total - start,
            src,
        });
    }
}

/// What the base of a turn is: the layout it builds on and how much it shares.
#[derive(Clone, Copy, Debug)]
pub struct Base<'a> {
    /// The base's layout.
    pub layout: &'a Layout,
    /// Blocks the turn shares with the base.
    pub shared_blocks: u64,
    /// The base's output tokens (the response the turn may carry).
    pub output_tokens: u64,
    /// The base is the agent's previous request and the turn keeps all its
    /// blocks but the last: the turn extends it.
    pub extends: bool,
}

/// The layout of a turn of `total` tokens opened by `opened_by`, built on `base`.
/// `None` when it shares too little with the base to keep its preamble.
pub fn turn(
    base: Base<'_>,
    block_size: u64,
    total: u64,
    opened_by: TurnKind,
    src: RequestId,
) -> Option<Layout> {
    let b = base.layout;
    let limit = ((base.shared_blocks + 1) * block_size).min(total);
    let shared_tokens = base.shared_blocks * block_size;
    // Keep what ends before the first unshared block's end (strictly inside
    // it, or on a shared block boundary).
    let keeps = |end: u64| end <= total && (end <= shared_tokens || end < limit);
    let pre_end = b.preamble.tools + b.preamble.system;
    if !(keeps(pre_end) || (base.extends && pre_end <= total)) {
        return None;
    }
    let mut l = Layout {
        api: b.api,
        preamble: b.preamble,
        msgs: Vec::new(),
        calls: b.calls,
    };
    let all = base.extends && b.end() <= total;
    for m in &b.msgs {
        if all || keeps(m.end()) {
            l.msgs.push(*m);
        } else {
            break;
        }
    }
    let kept_all = l.msgs.len() == b.msgs.len();
    let room = total - l.end();
    if kept_all && base.extends && room > 0 {
        extend(&mut l, base.output_tokens, total, opened_by, src);
    } else {
        // A rollback: a tool call must be answered by its result in every
        // API, so a call whose result is not kept goes too.
        if let Some(Kind::Assistant(Some(_))) = l.msgs.last().map(|m| m.kind) {
            l.msgs.pop();
        }
        push_user(&mut l, total, src);
    }
    Some(l)
}

/// Adds the base's response and the message that opened the turn.
fn extend(l: &mut Layout, output: u64, total: u64, opened_by: TurnKind, src: RequestId) {
    let api = l.api;
    let call = match opened_by {
        TurnKind::Tool => Some(Tool::Bash),
        TurnKind::Handoff => Some(Tool::Task),
        TurnKind::First | TurnKind::User => None,
    };
    let room = total - l.end();
    if let Some(tool) = call {
        let c = Call { tool, n: l.calls };
        let oh_a = render::overhead(api, Kind::Assistant(Some(c)));
        let oh_t = render::overhead(api, Kind::ToolResult(c));
        if room > oh_a + oh_t {
            // The response gets what the prompt has room for (`<think>` may
            // have been stripped), the tool result the rest (at least a word).
            let a = output.min(room - oh_a - oh_t - 1);
            let start = l.end();
            l.calls += 1;
            l.msgs.push(Msg {
                kind: Kind::Assistant(Some(c)),
                start,
                len: oh_a + a,
                src,
            });
            l.msgs.push(Msg {
                kind: Kind::ToolResult(c),
                start: start + oh_a + a,
                len: total - start - oh_a - a,
                src,
            });
            return;
        }
    }
    let oh_a = render::overhead(api, Kind::Assistant(None));
    let oh_u = render::overhead(api, Kind::User);
    if room >= oh_a + oh_u {
        let a = output.min(room - oh_a - oh_u);
        let start = l.end();
        l.msgs.push(Msg {
            kind: Kind::Assistant(None),
            start,
            len: oh_a + a,
            src,
        });
    }
    push_user(l, total, src);
}

/// The structural shape of every message, for tests and the renderer.
pub fn shape(api: Api, kind: Kind) -> Shape {
    render::shape(api, kind)
}
