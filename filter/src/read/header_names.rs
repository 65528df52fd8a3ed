//! Which request headers the decision reads, and which a client may not send.

use crate::config::{Config, Origin};

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
            if let Origin::Header(name) = &src.origin {
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
