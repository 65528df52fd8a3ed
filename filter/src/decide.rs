//! The per-request decision, host-free: what the header callback and the body
//! callback conclude from the headers and the body bytes. The proxy-wasm glue
//! only moves bytes in and out.

use crate::api::Api;
use crate::config::{Config, Mode};
use crate::head::head_hash;
use crate::identity::{self, BodyRef, Headers, Identity, KeySource, Resolution};
use crate::kv_params;
use crate::outputs::Output;
use crate::placement::{Pick, Placement};
use crate::rewrite::{self, Edit};
use crate::scan::{self, Doc, ReadLimits, ReadStats, ScanError, View};
use crate::turn::{self, Turn};

/// Why a request got the fallback key (or none); each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Path is not one of the four APIs: passed through untouched.
    UnknownFormat,
    /// `content-type` is present and not JSON.
    NotJson,
    /// `content-encoding` other than `identity`.
    Compressed,
    /// The body is not a JSON object.
    MalformedJson,
    /// The body ends before its object does (or the host could not give the bytes).
    Truncated,
    /// The body is over `max_body_bytes`.
    TooLarge,
    /// No body although the key had to come from it.
    NoBody,
    /// A JSON object with no identity field and no conversation to hash.
    NoConversation,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::UnknownFormat,
        Reason::NotJson,
        Reason::Compressed,
        Reason::MalformedJson,
        Reason::Truncated,
        Reason::TooLarge,
        Reason::NoBody,
        Reason::NoConversation,
    ];

    /// Position in [`Reason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Reason::UnknownFormat => "unknown_format",
            Reason::NotJson => "not_json",
            Reason::Compressed => "compressed",
            Reason::MalformedJson => "malformed_json",
            Reason::Truncated => "truncated",
            Reason::TooLarge => "too_large",
            Reason::NoBody => "no_body",
            Reason::NoConversation => "no_conversation",
        }
    }
}

/// Headers a client may not send: the filter emits them (or the mesh reads them).
/// Checked for every request header, so it compares in place (no lower-cased copy).
pub fn is_internal_header(name: &str) -> bool {
    is_internal_header_bytes(name.as_bytes())
}

/// [`is_internal_header`] on a raw header name.
pub fn is_internal_header_bytes(n: &[u8]) -> bool {
    tether_wire::headers::is_internal(n)
}

/// Every request header the decision reads: `:path`, the content headers,
/// the tenant header and the header sources. The glue copies only these (and
/// internal ones, to strip them) out of Envoy's map, so the decision sees
/// exactly what it would see in the full map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadHeaders {
    /// The names by length (index: byte length, the last one for all longer
    /// names): a request header is compared only with names of its length,
    /// and most are ruled out by the length alone.
    by_len: Vec<Vec<String>>,
}

impl ReadHeaders {
    /// Names at least this long share the last bucket.
    const LONG: usize = 64;

    pub fn new(cfg: &Config) -> Self {
        let mut names: Vec<&str> = vec![":path", "content-type", "content-encoding"];
        names.extend(cfg.tenant_header.as_deref());
        for src in cfg
            .session_sources
            .iter()
            .chain(&cfg.subagent_sources)
            .chain(&cfg.parent_sources)
        {
            if let crate::config::Origin::Header(name) = &src.origin {
                names.push(name);
            }
        }
        let mut by_len = vec![Vec::new(); Self::LONG + 1];
        for n in names {
            if let Some(bucket) = by_len.get_mut(n.len().min(Self::LONG))
                && !bucket.iter().any(|m: &String| m.eq_ignore_ascii_case(n))
            {
                bucket.push(n.to_owned());
            }
        }
        Self { by_len }
    }

    /// Whether the decision reads a header named `name` (ASCII case ignored, as in lookups).
    pub fn contains(&self, name: &[u8]) -> bool {
        self.by_len
            .get(name.len().min(Self::LONG))
            .is_some_and(|bucket| {
                bucket
                    .iter()
                    .any(|r| r.as_bytes().eq_ignore_ascii_case(name))
            })
    }
}

/// Everything decided for one routed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub api: Api,
    pub identity: Identity,
    /// `x-tether-key-source`: `header:<name>`, `body:<path>`, `head`, `fallback:<reason>`.
    pub source: String,
    pub turn: Option<Turn>,
    pub pick: Option<Pick>,
    /// Body edit at end of stream (salting / engine body fields).
    pub edit: Option<Edit>,
    pub stats: ReadStats,
    /// Present-but-unusable identity headers skipped.
    pub bad_headers: u32,
    /// Decided in the header callback (no body read).
    pub header_path: bool,
    /// Refuse the request with this local reply (status, body): salting is on
    /// and the body could not be rewritten, so a client `cache_salt` could
    /// otherwise reach the engine.
    pub reject: Option<(u32, &'static str)>,
    /// The client's `kv_transfer_params` held its own `tether` member, which
    /// the rewrite removed (counter `tether_spoofed_body_marker_removed`).
    pub spoofed_markers: bool,
    /// Body path: the body's size, and the bytes after its last assistant
    /// entry (the P/D estimate, [`crate::pd`]).
    pub body_bytes: usize,
    pub new_bytes: Option<usize>,
    /// Load-aware pick moved the key off its rendezvous primary ([`crate::placer`]).
    pub spilled: bool,
    /// P/D: the prefill endpoint (`x-prefiller-host-port`), when disaggregated.
    pub prefiller: Option<String>,
}

/// What the header callback does.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderOutcome {
    /// Unknown path: no routing headers.
    Untouched,
    /// Decided now: set the output headers, never buffer.
    Decided(Box<Decision>),
    /// Read the body; `reason` is already known to force the fallback key.
    ReadBody { api: Api, reason: Option<Reason> },
}

/// The header-callback decision. `end_of_stream` = the request has no body.
pub fn on_headers(
    cfg: &Config,
    placement: &Placement,
    headers: &Headers,
    end_of_stream: bool,
) -> HeaderOutcome {
    let path = headers
        .iter()
        .find(|(k, _)| k == ":path")
        .map(|(_, v)| v.as_slice())
        .unwrap_or_default();
    let Some(api) = Api::from_path(path) else {
        return HeaderOutcome::Untouched;
    };
    let (res, bad) = identity::resolve(cfg, headers, None);
    let header_ok = cfg.header_fast_path && !cfg.rewrites_body();
    let id = match res {
        Resolution::Known(id) if header_ok || end_of_stream => id,
        _ if end_of_stream => identity::fallback(tenant_of(cfg, headers), &[], Reason::NoBody),
        _ => {
            return HeaderOutcome::ReadBody {
                api,
                reason: content_reason(headers),
            };
        }
    };
    HeaderOutcome::Decided(Box::new(finish_unread(cfg, placement, api, id, bad, true)))
}

/// `compressed` / `not_json` from the content headers.
fn content_reason(headers: &Headers) -> Option<Reason> {
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.as_slice())
    };
    if let Some(enc) = get("content-encoding") {
        let enc = enc.trim_ascii();
        if !enc.is_empty() && !enc.eq_ignore_ascii_case(b"identity") {
            return Some(Reason::Compressed);
        }
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

/// The fallback decision for a body we will not parse (`prefix` = its first bytes).
pub fn fallback(
    cfg: &Config,
    placement: &Placement,
    api: Api,
    headers: &Headers,
    prefix: &[u8],
    reason: Reason,
) -> Decision {
    let id = identity::fallback(
        tenant_of(cfg, headers),
        prefix
            .get(..prefix.len().min(identity::FALLBACK_PREFIX))
            .unwrap_or_default(),
        reason,
    );
    let mut d = finish_unread(cfg, placement, api, id, 0, false);
    // Salting or marker fields are on but this body is not rewritten: refuse
    // it rather than let a client `cache_salt` or `kv_transfer_params.tether`
    // through.
    if cfg.must_rewrite() {
        d.reject = match reason {
            Reason::NoBody | Reason::UnknownFormat => None,
            Reason::TooLarge => Some((413, "tether: request body too large to rewrite\n")),
            Reason::Compressed | Reason::NotJson => {
                Some((415, "tether: request body must be uncompressed JSON\n"))
            }
            Reason::MalformedJson | Reason::Truncated | Reason::NoConversation => {
                Some((400, "tether: request body is not a JSON object\n"))
            }
        };
    }
    d
}

/// The body-callback decision at end of stream; `fetch(start, len)` reads body bytes.
pub fn on_body(
    cfg: &Config,
    placement: &Placement,
    api: Api,
    headers: &Headers,
    size: usize,
    reason: Option<Reason>,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Decision {
    on_body_marked(
        cfg,
        placement,
        api,
        headers,
        size,
        reason,
        fetch,
        &mut |_| {},
    )
}

/// A step of the body decision, for timing where its cost goes ([`on_body_marked`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Reading the body's ends (or all of it) and scanning them.
    Scan,
    /// The conversation-head hash.
    Head,
    /// Identity sources and the key.
    Identity,
    /// Turn markers.
    Turn,
    /// The decision assembled (placement included).
    Place,
    /// The body rewrite planned.
    Rewrite,
}

/// [`on_body`], calling `mark` after each [`Step`] that ran.
#[allow(
    clippy::too_many_arguments,
    reason = "on_body's arguments plus the step marker"
)]
pub fn on_body_marked(
    cfg: &Config,
    placement: &Placement,
    api: Api,
    headers: &Headers,
    size: usize,
    reason: Option<Reason>,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    mark: &mut dyn FnMut(Step),
) -> Decision {
    let prefix = |fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>| {
        fetch(0, size.min(identity::FALLBACK_PREFIX)).unwrap_or_default()
    };
    let forced = reason
        .or(if size == 0 {
            Some(Reason::NoBody)
        } else {
            None
        })
        .or(if size > cfg.max_body_bytes {
            Some(Reason::TooLarge)
        } else {
            None
        });
    if let Some(r) = forced {
        let p = if size == 0 { Vec::new() } else { prefix(fetch) };
        return fallback(cfg, placement, api, headers, &p, r);
    }
    let limits = ReadLimits {
        // Only an exact turn count needs the whole conversation of a body
        // the two ends would not cover.
        full_max: if cfg.outputs.has(Output::Turn) {
            cfg.turn_count_max_bytes
        } else {
            0
        },
        ..ReadLimits::default()
    };
    let (view, doc, stats) = match scan::read_doc(api, size, limits, fetch) {
        Ok(x) => x,
        Err(e) => {
            let r = match e {
                ScanError::Malformed => Reason::MalformedJson,
                ScanError::Truncated | ScanError::Unavailable => Reason::Truncated,
            };
            let p = prefix(fetch);
            return fallback(cfg, placement, api, headers, &p, r);
        }
    };
    mark(Step::Scan);
    let head = head_hash(api, &doc, &view);
    mark(Step::Head);
    let (res, bad) = identity::resolve(
        cfg,
        headers,
        Some(BodyRef {
            doc: &doc,
            view: &view,
            head,
        }),
    );
    mark(Step::Identity);
    let mut d = match res {
        Resolution::Known(id) => {
            let turn = cfg
                .outputs
                .needs_turn()
                .then(|| {
                    turn::classify_counting(
                        api,
                        &doc,
                        &view,
                        &cfg.subagent_tools,
                        id.parent.is_some(),
                        cfg.outputs.has(Output::Turn),
                    )
                })
                .flatten();
            mark(Step::Turn);
            let mut d = finish(cfg, placement, api, id, turn, None, stats, bad, false);
            if cfg.pd.is_some() {
                d.new_bytes = turn::new_turn_bytes(api, &doc, &view);
            }
            d
        }
        Resolution::NeedBody | Resolution::Nothing => {
            let p = view.prefix(identity::FALLBACK_PREFIX).to_vec();
            let mut d = fallback(cfg, placement, api, headers, &p, Reason::NoConversation);
            d.stats = stats;
            // The body is a JSON object: it is salted below like any other.
            d.reject = None;
            d
        }
    };
    mark(Step::Place);
    d.body_bytes = size;
    if cfg.rewrites_body() {
        let mut spoofed = false;
        d.edit = match rewrite::plan(
            &doc,
            &view,
            &owned_fields(cfg, &d, &doc, &view, &mut spoofed),
        ) {
            Some(e) => Some(e),
            None => {
                // A client copy sits after the conversation: read it all and rewrite the whole prefix.
                fetch(0, size).and_then(|body| {
                    let full = scan::scan_full(&body, api).ok()?;
                    let fv = scan::View {
                        head: body,
                        tail: Vec::new(),
                        tail_base: size,
                        size,
                    };
                    rewrite::plan(&full, &fv, &owned_fields(cfg, &d, &full, &fv, &mut spoofed))
                })
            }
        };
        d.spoofed_markers = spoofed && d.edit.is_some();
        if cfg.must_rewrite() && d.edit.is_none() {
            d.reject = Some((400, "tether: request body cannot be rewritten\n"));
        }
        mark(Step::Rewrite);
    }
    d
}

/// The body-path decision on a whole body held in memory, for a request that
/// names no identity in its headers: what the filter concludes at end of
/// stream (tests, tools and benchmarks compare against it).
pub fn on_whole_body(cfg: &Config, placement: &Placement, api: Api, body: &[u8]) -> Decision {
    let mut fetch = |s: usize, l: usize| body.get(s..s.checked_add(l)?).map(<[u8]>::to_vec);
    on_body(
        cfg,
        placement,
        api,
        &Vec::new(),
        body.len(),
        None,
        &mut fetch,
    )
}

/// Body fields the filter owns and their JSON values for this request (the
/// client's `kv_transfer_params`, from `doc`, is merged into ours; `spoofed`
/// tells whether it held markers of its own).
fn owned_fields(
    cfg: &Config,
    d: &Decision,
    doc: &Doc,
    view: &View,
    spoofed: &mut bool,
) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    if let Some(secret) = &cfg.cache_salt {
        out.push((
            "cache_salt",
            format!("\"{}\"", cache_salt(secret, &d.identity.tenant)).into_bytes(),
        ));
    }
    if cfg.outputs.has(Output::BodySessionId) {
        out.push((
            "session_id",
            format!("\"{}\"", identity::hex16(d.identity.key())).into_bytes(),
        ));
    }
    if let (true, Some(p)) = (cfg.outputs.has(Output::RoutedDpRank), &d.pick) {
        out.push(("routed_dp_rank", p.rank.to_string().into_bytes()));
    }
    if cfg.outputs.has(Output::KvTransferParams) {
        let ours = kv_params::tether_object(cfg, d);
        let client = doc.member(view, kv_params::FIELD);
        *spoofed = kv_params::has_markers(client);
        out.push((kv_params::FIELD, kv_params::merged(&ours, client)));
    }
    out
}

/// `cache_salt` for a tenant: 128-bit xxh3 of (secret, tenant), 32 hex digits.
/// Clients never see it (it only goes to the engine), so it needs to be
/// unguessable, not a cryptographic MAC.
pub fn cache_salt(secret: &[u8], tenant: &[u8]) -> String {
    let mut buf = Vec::with_capacity(secret.len() + tenant.len() + 16);
    for p in [b"cache_salt".as_slice(), secret, tenant] {
        buf.extend_from_slice(&u32::try_from(p.len()).unwrap_or(u32::MAX).to_le_bytes());
        buf.extend_from_slice(p);
    }
    format!(
        "{:032x}",
        xxhash_rust::xxh3::xxh3_128_with_seed(&buf, identity::SEED)
    )
}

/// A decision made without reading the conversation: no turn markers, no
/// body edit, nothing fetched.
fn finish_unread(
    cfg: &Config,
    placement: &Placement,
    api: Api,
    identity: Identity,
    bad_headers: u32,
    header_path: bool,
) -> Decision {
    let stats = ReadStats::default();
    finish(
        cfg,
        placement,
        api,
        identity,
        None,
        None,
        stats,
        bad_headers,
        header_path,
    )
}

#[allow(
    clippy::too_many_arguments,
    reason = "internal assembly of one decision"
)]
fn finish(
    cfg: &Config,
    placement: &Placement,
    api: Api,
    identity: Identity,
    turn: Option<Turn>,
    edit: Option<Edit>,
    stats: ReadStats,
    bad_headers: u32,
    header_path: bool,
) -> Decision {
    let source = match &identity.source {
        KeySource::Source(i) => cfg
            .session_sources
            .get(*i)
            .map_or_else(|| "unknown".to_owned(), |s| s.label.clone()),
        KeySource::Head => "head".to_owned(),
        KeySource::Fallback(r) => format!("fallback:{}", r.name()),
    };
    let pick = (cfg.mode == Mode::Pick)
        .then(|| placement.pick(identity.key(), cfg.fallbacks))
        .flatten();
    Decision {
        api,
        identity,
        source,
        turn,
        pick,
        edit,
        stats,
        bad_headers,
        header_path,
        reject: None,
        spoofed_markers: false,
        body_bytes: 0,
        new_bytes: None,
        spilled: false,
        prefiller: None,
    }
}

#[cfg(test)]
mod tests;
