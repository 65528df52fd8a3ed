//! Stage 1 of the decision, read: what one request says — its format, whose
//! it is (tenant, session, subagent: the routing key), what ended its turn and
//! how big its prompt is — from the request headers and the body's two ends.
//! Host-free; nothing here places the request or writes an output.

pub mod chain;
pub mod chain_id;
pub mod encoding;
pub mod head;
pub mod header_names;
pub mod identity;
pub mod preamble;
pub mod reason;

pub use reason::Reason;
pub mod scan;
pub mod turn;

use crate::api::Api;
use crate::config::Config;
use crate::config::outputs::Output;
use crate::step::Step;
use head::head_hash;
use identity::{BodyRef, Headers, Identity, KeySource, Resolution};

use scan::{Doc, ReadLimits, ReadStats, ScanError, View};
use turn::Turn;

/// A refusal: the local reply's status and body.
pub type Reject = (u32, &'static str);

/// What one routed request says, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub api: Api,
    pub identity: Identity,
    /// The routing key, `identity.key()`: hashed once, read by placement
    /// and by every output that carries it.
    pub key: u64,
    /// `x-tether-key-source`: `header:<name>`, `body:<path>`, `head`, `fallback:<reason>`.
    pub source: String,
    pub turn: Option<Turn>,
    pub stats: ReadStats,
    /// Present-but-unusable identity headers skipped.
    pub bad_headers: u32,
    /// Read in the header callback (no body read).
    pub header_path: bool,
    /// Body path: the body's size, and the bytes after its last assistant
    /// entry (the P/D estimate, [`crate::place::pd`]).
    pub body_bytes: usize,
    pub new_bytes: Option<usize>,
    /// Refuse the request with this local reply: salting or body markers are
    /// on and the body cannot be parsed, so a client `cache_salt` or
    /// `kv_transfer_params.tether` could otherwise reach the engine.
    pub reject: Option<Reject>,
    /// Read from a decoded compressed body (counter `tether_body_decompressed`).
    pub decoded: bool,
    /// What its `previous_response_id` asks for (a Responses body).
    pub chain: chain::ChainRead,
}

impl Reading {
    /// The session to learn the answer's response id under: a Responses
    /// request keyed by its head or its chain ([`chain`]).
    pub fn chain_session(&self, cfg: &Config) -> Option<&[u8]> {
        let by_head = chain::keyed_by_head(cfg, &self.identity.source);
        (self.api == Api::Responses && by_head && self.reject.is_none())
            .then_some(self.identity.session.as_slice())
    }
}

impl Reading {
    /// A reading of the headers alone: no turn, nothing fetched.
    fn unread(cfg: &Config, api: Api, identity: Identity, header_path: bool) -> Self {
        Self {
            api,
            source: source_label(cfg, &identity),
            key: identity.key(),
            identity,
            turn: None,
            stats: ReadStats::default(),
            bad_headers: 0,
            header_path,
            body_bytes: 0,
            new_bytes: None,
            reject: None,
            decoded: false,
            chain: chain::ChainRead::default(),
        }
    }
}

/// The body as scanned: what a rewrite of it starts from.
#[derive(Debug, Clone)]
pub struct Body {
    pub doc: Doc,
    pub view: View,
}

/// What the header callback reads.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "short-lived: the reading moves straight into the plan, unboxed"
)]
pub enum HeaderRead {
    /// Unknown path: no routing headers.
    Untouched,
    /// Read in full from the headers: decide now, never buffer.
    Read(Reading),
    /// Read the body; `reason` is already known to force the fallback key.
    ReadBody { api: Api, reason: Option<Reason> },
}

/// The header callback's reading. `end_of_stream` = the request has no body.
pub fn headers(cfg: &Config, headers: &Headers, end_of_stream: bool) -> HeaderRead {
    let path = headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map(|(_, v)| v.as_slice())
        .unwrap_or_default();
    let Some(api) = Api::from_path(path) else {
        return HeaderRead::Untouched;
    };
    let (res, bad) = identity::resolve(cfg, headers, None);
    let header_ok = cfg.header_fast_path && !cfg.rewrites_body();
    let id = match res {
        Resolution::Known(id) if header_ok || end_of_stream => id,
        _ if end_of_stream => identity::fallback(tenant_of(cfg, headers), &[], Reason::NoBody),
        _ => {
            return HeaderRead::ReadBody {
                api,
                reason: content_reason(headers),
            };
        }
    };
    HeaderRead::Read(Reading {
        bad_headers: bad,
        ..Reading::unread(cfg, api, id, true)
    })
}

/// `compressed` (a coding the filter does not decode) / `not_json` from the
/// content headers.
fn content_reason(headers: &Headers) -> Option<Reason> {
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.as_slice())
    };
    if encoding::of(headers) == encoding::ContentEncoding::Other {
        return Some(Reason::Compressed);
    }
    if let Some(ct) = get("content-type") {
        let ct = ct.to_ascii_lowercase();
        if memchr::memmem::find(&ct, b"json").is_none() {
            return Some(Reason::NotJson);
        }
    }
    None
}

fn tenant_of(cfg: &Config, headers: &Headers) -> Vec<u8> {
    match cfg
        .tenant_header
        .as_deref()
        .map(|n| identity::header(headers, n))
    {
        Some(identity::Lookup::Found(v)) => v,
        _ => Vec::new(),
    }
}

/// `x-tether-key-source` for an identity.
fn source_label(cfg: &Config, identity: &Identity) -> String {
    match &identity.source {
        KeySource::Source(i) => cfg
            .session_sources
            .get(*i)
            .map_or_else(|| "unknown".to_owned(), |s| s.label.clone()),
        KeySource::Head => "head".to_owned(),
        KeySource::Chain(from) => match from {
            chain::ChainFrom::Id => "chain",
            chain::ChainFrom::Table => "chain:table",
            chain::ChainFrom::Unseen => "chain:unseen",
            chain::ChainFrom::Forged => "chain:forged",
        }
        .to_owned(),
        KeySource::Fallback(r) => format!("fallback:{}", r.name()),
    }
}

/// The fallback reading of a body we will not parse (`prefix` = its first bytes).
pub fn fallback(
    cfg: &Config,
    api: Api,
    headers: &Headers,
    prefix: &[u8],
    reason: Reason,
) -> Reading {
    let id = identity::fallback(
        tenant_of(cfg, headers),
        prefix
            .get(..prefix.len().min(identity::FALLBACK_PREFIX))
            .unwrap_or_default(),
        reason,
    );
    // Salting or marker fields are on but this body is not rewritten: refuse
    // it rather than let a client `cache_salt` or `kv_transfer_params.tether`
    // through.
    let reject = if cfg.must_rewrite() {
        match reason {
            Reason::NoBody | Reason::UnknownFormat => None,
            Reason::TooLarge => Some((413, "tether: request body too large to rewrite\n")),
            Reason::Compressed
            | Reason::DecompressedTooLarge
            | Reason::CompressedCorrupt
            | Reason::NotJson => Some((415, "tether: request body must be uncompressed JSON\n")),
            Reason::MalformedJson | Reason::Truncated | Reason::NoConversation => {
                Some((400, "tether: request body is not a JSON object\n"))
            }
        }
    } else {
        None
    };
    Reading {
        reject,
        ..Reading::unread(cfg, api, id, false)
    }
}

/// The body callback's inputs at end of stream.
#[derive(Debug, Clone, Copy)]
pub struct BodyIn<'a> {
    pub api: Api,
    /// The (stripped) request headers.
    pub headers: &'a Headers,
    /// Bytes buffered.
    pub size: usize,
    /// A reason already known to force the fallback key.
    pub reason: Option<Reason>,
    /// The Responses chain table ([`chain::NoChains`] without a host).
    pub chains: &'a dyn chain::Chains,
}

impl<'a> BodyIn<'a> {
    /// A body of `size` bytes with no reason known beforehand and no chain table.
    pub fn new(api: Api, headers: &'a Headers, size: usize) -> Self {
        Self {
            api,
            headers,
            size,
            reason: None,
            chains: &chain::NoChains,
        }
    }
}

/// The body callback's reading at end of stream; `fetch(start, len)` reads
/// body bytes, `mark` is called after each [`Step`] that ran. The scanned
/// body comes back when it is a JSON object the emit stage may rewrite (not
/// a decoded one: what goes upstream is the body as sent).
pub fn body(
    cfg: &Config,
    input: BodyIn<'_>,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    mark: &mut impl FnMut(Step),
) -> (Reading, Option<Body>) {
    let BodyIn {
        api,
        headers,
        size,
        reason,
        ..
    } = input;
    let prefix = |fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>| {
        fetch(0, size.min(identity::FALLBACK_PREFIX)).unwrap_or_default()
    };
    let forced = reason
        .or((size == 0).then_some(Reason::NoBody))
        .or((size > cfg.max_body_bytes).then_some(Reason::TooLarge))
        // A body that must be rewritten cannot be, compressed.
        .or(
            (cfg.must_rewrite() && encoding::of(headers) != encoding::ContentEncoding::Identity)
                .then_some(Reason::Compressed),
        );
    if let Some(r) = forced {
        let p = if size == 0 { Vec::new() } else { prefix(fetch) };
        return (fallback(cfg, api, headers, &p, r), None);
    }
    if let encoding::ContentEncoding::Decodable(enc) = encoding::of(headers) {
        return (decoded(cfg, input, enc, fetch, mark), None);
    }
    let (view, doc, stats) = match scan::read_doc(api, size, read_limits(cfg), fetch) {
        Ok(x) => x,
        Err(e) => {
            let p = prefix(fetch);
            return (fallback(cfg, api, headers, &p, scan_reason(e)), None);
        }
    };
    mark(Step::Scan);
    let reading = conversation(cfg, input, &doc, &view, stats, mark);
    (reading, Some(Body { doc, view }))
}

/// How much of a body the scanner may read.
fn read_limits(cfg: &Config) -> ReadLimits {
    ReadLimits {
        // Only an exact turn count needs the whole conversation of a body
        // the two ends would not cover.
        full_max: if cfg.outputs.has(Output::Turn) {
            cfg.turn_count_max_bytes
        } else {
            0
        },
        ..ReadLimits::default()
    }
}

/// The fallback reason of a body that does not scan.
fn scan_reason(e: ScanError) -> Reason {
    match e {
        ScanError::Malformed => Reason::MalformedJson,
        ScanError::Truncated | ScanError::Unavailable => Reason::Truncated,
    }
}

/// The reading of a compressed body: decoded within `max_decompressed_bytes`
/// and read as any other. A body that does not decode gets the fallback key
/// of what did decode (the conversation head, unchanged between turns), or
/// of its compressed bytes when nothing did.
fn decoded(
    cfg: &Config,
    input: BodyIn<'_>,
    enc: encoding::Encoding,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    mark: &mut impl FnMut(Step),
) -> Reading {
    let BodyIn {
        api, headers, size, ..
    } = input;
    let raw = fetch(0, size).unwrap_or_default();
    let (plain, failed) = match encoding::decode(enc, &raw, cfg.max_decompressed_bytes) {
        Ok(plain) => (plain, None),
        Err(encoding::DecodeError::TooLarge { prefix }) => {
            (prefix, Some(Reason::DecompressedTooLarge))
        }
        Err(encoding::DecodeError::Corrupt { prefix }) => (prefix, Some(Reason::CompressedCorrupt)),
    };
    if let Some(r) = failed {
        let p = if plain.is_empty() { &raw } else { &plain };
        return fallback(cfg, api, headers, p, r);
    }
    let mut over = |s: usize, l: usize| plain.get(s..s.checked_add(l)?).map(<[u8]>::to_vec);
    let input = BodyIn {
        size: plain.len(),
        ..input
    };
    let mut reading = match scan::read_doc(api, plain.len(), read_limits(cfg), &mut over) {
        Ok((view, doc, stats)) => {
            mark(Step::Scan);
            conversation(cfg, input, &doc, &view, stats, mark)
        }
        Err(e) => fallback(cfg, api, headers, &plain, scan_reason(e)),
    };
    reading.decoded = true;
    reading
}

/// The reading of a scanned JSON object: identity, turn, prompt size.
fn conversation(
    cfg: &Config,
    input: BodyIn<'_>,
    doc: &Doc,
    view: &View,
    stats: ReadStats,
    mark: &mut impl FnMut(Step),
) -> Reading {
    let BodyIn {
        api, headers, size, ..
    } = input;
    let head = head_hash(api, doc, view);
    mark(Step::Head);
    let (res, bad) = identity::resolve(cfg, headers, Some(BodyRef { doc, view, head }));
    mark(Step::Identity);
    match res {
        Resolution::Known(mut id) => {
            let chain = chain::continue_chain(cfg, api, input.chains, doc, view, &mut id);
            let turn = cfg
                .outputs
                .needs_turn()
                .then(|| {
                    turn::classify_counting(
                        api,
                        doc,
                        view,
                        &cfg.subagent_tools,
                        id.parent.is_some(),
                        cfg.outputs.has(Output::Turn),
                    )
                })
                .flatten();
            mark(Step::Turn);
            Reading {
                turn,
                stats,
                bad_headers: bad,
                body_bytes: size,
                new_bytes: cfg
                    .pd
                    .is_some()
                    .then(|| turn::new_turn_bytes(api, doc, view))
                    .flatten(),
                chain,
                ..Reading::unread(cfg, api, id, false)
            }
        }
        Resolution::NeedBody | Resolution::Nothing => {
            let p = view.prefix(identity::FALLBACK_PREFIX);
            Reading {
                stats,
                body_bytes: size,
                // The body is a JSON object: it is rewritten like any other.
                reject: None,
                ..fallback(cfg, api, headers, p, Reason::NoConversation)
            }
        }
    }
}
