//! Stage 3 of the decision, emit: from what was read and where it was placed,
//! the [`Plan`] the shell applies — request headers (or filter state), the
//! body edit, counters, or a refusal. Host-free: the body bytes a rewrite
//! may still need come through the caller's `fetch`.

pub mod answer_id;
pub mod kv_params;
pub mod markers;
pub mod metrics;
pub mod plan;
pub mod rewrite;
pub mod unwrap;

use crate::config::Config;
use crate::config::outputs::Output;
use crate::place::{Placed, Prefill};
use crate::read::identity;
use crate::read::scan::{self, Doc, View};
use crate::read::{Body, Reading};
pub use plan::Plan;
use rewrite::Edit;

/// The plan for one request; `body` is the scanned body when it is a JSON
/// object as sent (rewritten when the configuration rewrites bodies, or in
/// place to unwrap a chain id), `fetch(start, len)` reads body bytes when
/// its ends are not enough.
pub fn emit(
    cfg: &Config,
    read: Reading,
    placed: Placed,
    body: Option<&Body>,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Plan {
    let mut spoofed = false;
    let rewritten = body.filter(|_| cfg.rewrites_body());
    let edit = match rewritten {
        Some(b) if read.reject.is_none() => edit(cfg, &read, &placed, b, fetch, &mut spoofed),
        _ => None,
    };
    let reject = read.reject.or_else(|| {
        (rewritten.is_some() && cfg.must_rewrite() && edit.is_none())
            .then_some((400, "tether: request body cannot be rewritten\n"))
    });
    // No rewrite took the chain id out: unwrap it in place.
    let edit = match (edit, body, &read.chain.unwrap) {
        (None, Some(b), Some(engine)) if reject.is_none() => unwrap::edit(b, engine, fetch),
        (edit, ..) => edit,
    };
    Plan {
        spoofed_markers: spoofed && edit.is_some(),
        read,
        placed,
        edit,
        reject,
    }
}

/// The body edit: on the scanned ends, or — when a client copy of an owned
/// field sits after the conversation — on the whole body, read again.
fn edit(
    cfg: &Config,
    read: &Reading,
    placed: &Placed,
    body: &Body,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    spoofed: &mut bool,
) -> Option<Edit> {
    let owned = |doc: &Doc, view: &View, spoofed: &mut bool| {
        owned_fields(cfg, read, placed, doc, view, spoofed)
    };
    if let Some(e) = rewrite::plan(
        &body.doc,
        &body.view,
        &owned(&body.doc, &body.view, spoofed),
    ) {
        return Some(e);
    }
    let size = body.view.size;
    let whole = fetch(0, size)?;
    let full = scan::scan_full(&whole, read.api).ok()?;
    let fv = View {
        head: whole,
        tail: Vec::new(),
        tail_base: size,
        size,
    };
    rewrite::plan(&full, &fv, &owned(&full, &fv, spoofed))
}

/// Body fields the filter owns and their JSON values for this request (the
/// client's `kv_transfer_params`, from `doc`, is merged into ours; `spoofed`
/// tells whether it held markers of its own).
fn owned_fields(
    cfg: &Config,
    read: &Reading,
    placed: &Placed,
    doc: &Doc,
    view: &View,
    spoofed: &mut bool,
) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    if let Some(engine) = &read.chain.unwrap {
        out.push((unwrap::FIELD, unwrap::quoted(engine)));
    }
    if let Some(secret) = &cfg.cache_salt {
        out.push((
            "cache_salt",
            format!("\"{}\"", cache_salt(secret, &read.identity.tenant)).into_bytes(),
        ));
    }
    if cfg.outputs.has(Output::BodySessionId) {
        out.push((
            "session_id",
            format!("\"{}\"", identity::hex16(read.key)).into_bytes(),
        ));
    }
    if let (true, Some(p)) = (cfg.outputs.has(Output::RoutedDpRank), &placed.pick) {
        out.push(("routed_dp_rank", p.rank.to_string().into_bytes()));
    }
    if cfg.outputs.has(Output::KvTransferParams) {
        let pull_from = match placed.prefill {
            // Decode endpoint `i` is `endpoints[i]` (the pools are built from it).
            Prefill::Pull(i) => cfg.endpoints.get(i).map(|e| e.address.as_str()),
            _ => None,
        };
        let ours = kv_params::tether_object(cfg, read, pull_from);
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
