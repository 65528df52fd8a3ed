//! Plugin configuration, parsed in one place: serde reads the JSON into raw
//! structs (every type error names its field path), and `TryFrom` turns them
//! into the typed, validated [`Config`] (every refusal names its field; see
//! `docs/gateway.md`).

pub mod eject;
pub mod load;
pub mod outputs;
pub mod pd;
pub mod residency;

use eject::EjectConfig;
use load::LoadConfig;
use outputs::{Output, Outputs};
use pd::PdConfig;
use residency::{Migrate, ResidencyConfig};
use serde::Deserialize;
use serde::de::{self, IgnoredAny};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use tether_placement::{OverBound, Unseen};
use tether_wire::{RetentionMs, TurnKind};

/// An invalid plugin configuration: `field` is the JSON path of the culprit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct ConfigError {
    pub field: String,
    pub why: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            why: why.into(),
        }
    }
}

/// Where placement happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Emit the key; Envoy's `hash_policy` (or Istio `consistentHash`) places it.
    Hash,
    /// Pick endpoint and DP rank in the filter (weighted rendezvous hashing).
    Pick,
}

pub use tether_placement::Endpoint;

/// Where an identity value is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A request header (lower-case name).
    Header(String),
    /// A JSON body path: top-level member, then members of nested objects.
    Body(Vec<String>),
}

/// One entry of `session_sources` / `subagent_sources` / `parent_sources`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub origin: Origin,
    /// `+head`: the value names a user, not a run; combine it with the conversation-head hash.
    pub with_head: bool,
    /// The source as written (`header:x-session-id`), used in `x-tether-key-source` and counters.
    pub label: String,
}

impl Source {
    /// Parses `header:<name>`, `body:<dotted.path>`, each with an optional `+head`.
    pub fn parse(text: &str) -> Result<Source, String> {
        let (body, with_head) = match text.strip_suffix("+head") {
            Some(b) => (b, true),
            None => (text, false),
        };
        let origin = if let Some(name) = body.strip_prefix("header:") {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            {
                return Err(format!(
                    "header name in {text:?} must be non-empty lower-case [a-z0-9_-]"
                ));
            }
            if name.starts_with("x-tether-") {
                return Err(format!("{text:?} is an internal header the filter strips"));
            }
            Origin::Header(name.to_owned())
        } else if let Some(path) = body.strip_prefix("body:") {
            let parts: Vec<String> = path.split('.').map(str::to_owned).collect();
            if parts.iter().any(String::is_empty) {
                return Err(format!("body path in {text:?} has an empty segment"));
            }
            Origin::Body(parts)
        } else {
            return Err(format!(
                "unknown source prefix in {text:?} (expected header: or body:)"
            ));
        };
        Ok(Source {
            origin,
            with_head,
            label: text.to_owned(),
        })
    }

    pub fn is_header(&self) -> bool {
        matches!(self.origin, Origin::Header(_))
    }
}

/// The validated plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub mode: Mode,
    pub endpoints: Vec<Endpoint>,
    pub fallbacks: usize,
    pub session_sources: Vec<Source>,
    pub subagent_sources: Vec<Source>,
    pub parent_sources: Vec<Source>,
    pub tenant_header: Option<String>,
    /// Secret of the keyed `cache_salt` hash; `None` = no salting.
    pub cache_salt: Option<Vec<u8>>,
    /// Interval sent per turn kind (`x-tether-retention-ms`); defaults from the wire contract.
    pub retention_ms: RetentionMs,
    pub subagent_tools: Vec<String>,
    /// What the filter writes (`outputs`): a preset or a list; the default is
    /// what the mode itself needs (`docs/gateway.md`, "Outputs").
    pub outputs: Outputs,
    pub max_body_bytes: usize,
    /// Decide in the header callback when a header names the session (no body read, no turn markers).
    pub header_fast_path: bool,
    /// Bodies up to this size are walked whole, so `x-tether-turn` is exact.
    pub turn_count_max_bytes: usize,
    /// Load-aware pick (`load`): polled `/load` reports, spill over a bound.
    pub load: Option<LoadConfig>,
    /// P/D in pick mode (`pd`): a prefill pool and the disaggregation threshold.
    pub pd: Option<PdConfig>,
    /// Residency-aware placement (`residency`): the polled residency
    /// summaries, *d* candidates, the migrate-or-recompute cost.
    pub residency: Option<ResidencyConfig>,
    /// Pick mode: passive outlier detection on the response path (`eject`).
    pub eject: EjectConfig,
    /// Output bound when decoding a compressed request body (`max_decompressed_bytes`).
    pub max_decompressed_bytes: usize,
    /// The Responses chain table (`chains`).
    pub chains: crate::read::chain::ChainConfig,
}

/// Default `session_sources`.
pub const DEFAULT_SESSION_SOURCES: &[&str] = &[
    "header:x-session-id",
    "header:x-claude-code-session-id",
    "header:session-id",
    // Codex's older spelling.
    "header:session_id",
    "header:x-session-affinity",
    // OpenCode Zen.
    "header:x-opencode-session",
    "header:x-dynamo-session-id",
    "body:session_id",
    "body:vllm_xargs.agentic_context.session_id",
    "body:nvext.agent_context.session_id",
    "body:prompt_cache_key",
    "body:metadata.session_id",
    "body:metadata.user_id",
    "body:user+head",
];

/// Default `subagent_sources`.
pub const DEFAULT_SUBAGENT_SOURCES: &[&str] = &[
    "header:x-claude-code-agent-id",
    "header:thread-id",
    "body:vllm_xargs.agentic_context.agent_id",
    "body:nvext.agent_context.agent_id",
    "body:metadata.agent_id",
];

/// Default `parent_sources`.
pub const DEFAULT_PARENT_SOURCES: &[&str] = &[
    "header:x-parent-session-id",
    "header:x-claude-code-parent-agent-id",
    "header:x-codex-parent-thread-id",
    "header:x-dynamo-parent-session-id",
    "body:vllm_xargs.agentic_context.parent_id",
    "body:nvext.agent_context.parent_id",
];

/// Default `subagent_tools`.
pub const DEFAULT_SUBAGENT_TOOLS: &[&str] = &["Task", "Agent", "spawn_agent", "delegate"];

fn sources(list: &[&str]) -> Vec<Source> {
    list.iter().filter_map(|s| Source::parse(s).ok()).collect()
}

impl Default for Config {
    fn default() -> Self {
        Self {
            mode: Mode::Hash,
            endpoints: Vec::new(),
            fallbacks: 2,
            session_sources: sources(DEFAULT_SESSION_SOURCES),
            subagent_sources: sources(DEFAULT_SUBAGENT_SOURCES),
            parent_sources: sources(DEFAULT_PARENT_SOURCES),
            tenant_header: None,
            cache_salt: None,
            retention_ms: RetentionMs::DEFAULT,
            subagent_tools: DEFAULT_SUBAGENT_TOOLS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            outputs: Outputs::default_for(false),
            max_body_bytes: 16 * 1024 * 1024,
            header_fast_path: true,
            turn_count_max_bytes: 32 * 1024,
            load: None,
            pd: None,
            residency: None,
            eject: EjectConfig::default(),
            max_decompressed_bytes: 16 * 1024 * 1024,
            chains: crate::read::chain::ChainConfig::default(),
        }
    }
}

impl Config {
    /// Parses and validates the plugin configuration; empty input = all defaults.
    pub fn parse(raw: &[u8]) -> Result<Config, ConfigError> {
        if raw.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(Config::default());
        }
        let mut de = serde_json::Deserializer::from_slice(raw);
        let Obj::<RawConfig>(raw) = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                ConfigError::new("(configuration)", format!("not JSON: {inner}"))
            } else if field == "." {
                ConfigError::new("(configuration)", "must be a JSON object")
            } else {
                ConfigError::new(field, inner.to_string())
            }
        })?;
        de.end()
            .map_err(|e| ConfigError::new("(configuration)", format!("not JSON: {e}")))?;
        Config::try_from(raw)
    }

    /// True when a body that cannot be rewritten must be refused: what the
    /// filter writes there guards the engine (the tenant's `cache_salt`, the
    /// turn markers in `kv_transfer_params.tether`), so a client's own copy
    /// must never get through.
    pub fn must_rewrite(&self) -> bool {
        self.cache_salt.is_some() || self.outputs.has(Output::KvTransferParams)
    }

    /// True when the body is rewritten at end of stream (salt or body outputs).
    pub fn rewrites_body(&self) -> bool {
        self.cache_salt.is_some() || self.outputs.body_fields().next().is_some()
    }
}

/// The configuration as written: every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    mode: Option<String>,
    endpoints: Option<Vec<Obj<RawEndpoint>>>,
    fallbacks: Option<usize>,
    session_sources: Option<Vec<String>>,
    subagent_sources: Option<Vec<String>>,
    parent_sources: Option<Vec<String>>,
    tenant_header: Option<String>,
    cache_salt: Option<Obj<RawSalt>>,
    retention_ms: Option<BTreeMap<String, u64>>,
    subagent_tools: Option<Vec<String>>,
    outputs: Option<RawOutputs>,
    /// Replaced by `outputs`: named in the refusal.
    engine: Option<IgnoredAny>,
    debug_header: Option<IgnoredAny>,
    max_body_bytes: Option<usize>,
    header_fast_path: Option<bool>,
    turn_count_max_bytes: Option<usize>,
    load: Option<Obj<RawLoad>>,
    pd: Option<Obj<RawPd>>,
    residency: Option<Obj<RawResidency>>,
    eject: Option<Obj<RawEject>>,
    max_decompressed_bytes: Option<usize>,
    chains: Option<Obj<RawChains>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawChains {
    slots: Option<u32>,
    ttl_s: Option<u64>,
    wrap: Option<bool>,
    secret: Option<String>,
}

/// One element of `endpoints` / `pd.prefill_endpoints`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEndpoint {
    address: Option<String>,
    weight: Option<f64>,
    dp_size: Option<u32>,
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEject {
    failures: Option<u64>,
    ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSalt {
    secret: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLoad {
    cluster: Option<String>,
    poll_ms: Option<u64>,
    timeout_ms: Option<u64>,
    max_age_ms: Option<u64>,
    factor: Option<f64>,
    floor: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResidency {
    candidates: Option<usize>,
    kv_bytes_per_token: Option<f64>,
    link_gbps: Option<f64>,
    transfer_setup_ms: Option<f64>,
    prefill_tokens_per_s: Option<f64>,
    factor: Option<f64>,
    floor: Option<f64>,
    unseen: Option<String>,
    migrate: Option<String>,
    over_bound: Option<String>,
    busy_weight: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPd {
    prefill_endpoints: Option<Vec<Obj<RawEndpoint>>>,
    threshold_tokens: Option<u64>,
    bytes_per_token: Option<f64>,
}

/// A raw struct that must be written as a JSON object (serde would also
/// read a struct from an array of its fields in order).
#[derive(Debug)]
pub struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> de::Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData)).map(Obj)
    }
}

/// `outputs`: a preset name, or a list of preset and output names.
#[derive(Debug)]
pub enum RawOutputs {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for RawOutputs {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = RawOutputs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a preset name or a list of preset and output names")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawOutputs, E> {
                Ok(RawOutputs::One(s.to_owned()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<RawOutputs, A::Error> {
                let mut names = Vec::new();
                while let Some(n) = seq.next_element::<String>()? {
                    names.push(n);
                }
                Ok(RawOutputs::Many(names))
            }
        }
        d.deserialize_any(V)
    }
}

impl TryFrom<RawConfig> for Config {
    type Error = ConfigError;

    fn try_from(raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.engine.is_some() || raw.debug_header.is_some() {
            let name = if raw.engine.is_some() {
                "engine"
            } else {
                "debug_header"
            };
            return Err(ConfigError::new(
                name,
                "replaced by `outputs` (docs/gateway.md, \"Outputs\")",
            ));
        }
        let d = Config::default();
        let mode = match raw.mode.as_deref() {
            None | Some("hash") => Mode::Hash,
            Some("pick") => Mode::Pick,
            Some(other) => {
                return Err(ConfigError::new(
                    "mode",
                    format!("unknown mode {other:?} (expected \"hash\" or \"pick\")"),
                ));
            }
        };
        let endpoints = endpoint_list("endpoints", raw.endpoints.unwrap_or_default())?;
        // Two endpoints with one name would share every key.
        for (i, e) in endpoints.iter().enumerate() {
            if e.name.is_some()
                && endpoints
                    .iter()
                    .take(i)
                    .any(|o| o.identity() == e.identity())
            {
                return Err(ConfigError::new(
                    format!("endpoints[{i}].name"),
                    format!("{:?} is used twice", e.identity()),
                ));
            }
        }
        if mode == Mode::Pick && endpoints.is_empty() {
            return Err(ConfigError::new(
                "endpoints",
                "must not be empty in pick mode",
            ));
        }
        let sources = |name: &str, list: Option<Vec<String>>, default: Vec<Source>| match list {
            None => Ok(default),
            Some(l) => source_list(name, &l),
        };
        let cache_salt = raw.cache_salt.map(|Obj(s)| salt(s)).transpose()?;
        let chains = chain_config(raw.chains.map(|Obj(c)| c), cache_salt.as_deref())?;
        let cfg = Config {
            mode,
            fallbacks: raw.fallbacks.unwrap_or(d.fallbacks),
            session_sources: sources("session_sources", raw.session_sources, d.session_sources)?,
            subagent_sources: sources(
                "subagent_sources",
                raw.subagent_sources,
                d.subagent_sources,
            )?,
            parent_sources: sources("parent_sources", raw.parent_sources, d.parent_sources)?,
            tenant_header: raw.tenant_header.map(tenant_header).transpose()?,
            cache_salt,
            retention_ms: retention(raw.retention_ms.unwrap_or_default())?,
            subagent_tools: raw.subagent_tools.unwrap_or(d.subagent_tools),
            outputs: match raw.outputs {
                None => Outputs::default_for(mode == Mode::Pick),
                Some(o) => outputs(o, mode)?,
            },
            max_body_bytes: raw.max_body_bytes.unwrap_or(d.max_body_bytes),
            header_fast_path: raw.header_fast_path.unwrap_or(d.header_fast_path),
            turn_count_max_bytes: raw.turn_count_max_bytes.unwrap_or(d.turn_count_max_bytes),
            load: raw.load.map(|Obj(l)| LoadConfig::try_from(l)).transpose()?,
            pd: None,
            residency: None,
            eject: raw
                .eject
                .map(|Obj(e)| eject_config(e))
                .transpose()?
                .unwrap_or_default(),
            max_decompressed_bytes: match raw.max_decompressed_bytes {
                None => d.max_decompressed_bytes,
                Some(n) if (1..=MAX_DECOMPRESSED).contains(&n) => n,
                Some(_) => {
                    return Err(ConfigError::new(
                        "max_decompressed_bytes",
                        "must be between 1 and 268435456 (256 MiB)",
                    ));
                }
            },
            chains,
            endpoints,
        };
        let cfg = match raw.residency {
            Some(Obj(r)) => residency_config(cfg, r)?,
            None => cfg,
        };
        pick_features(cfg, raw.pd.map(|Obj(p)| p))
    }
}

/// What only pick mode has — load-aware pick, P/D — checked against the rest
/// of the configuration, and the body limit.
fn pick_features(mut cfg: Config, pd: Option<RawPd>) -> Result<Config, ConfigError> {
    if cfg.max_body_bytes == 0 {
        return Err(ConfigError::new("max_body_bytes", "must be positive"));
    }
    if cfg.load.is_some() && cfg.mode != Mode::Pick {
        return Err(ConfigError::new(
            "load",
            "needs mode \"pick\" (the filter must choose the endpoint)",
        ));
    }
    if let Some(raw_pd) = pd {
        if cfg.mode != Mode::Pick {
            return Err(ConfigError::new(
                "pd",
                "needs mode \"pick\" (the decode endpoint is the filter's pick)",
            ));
        }
        if cfg.header_fast_path {
            return Err(ConfigError::new(
                "pd",
                "needs header_fast_path: false (the decision reads the conversation to estimate its uncached prompt)",
            ));
        }
        cfg.pd = Some(prefill_config(raw_pd, &cfg.endpoints)?);
        // The prefiller header is what `pd` is for.
        cfg.outputs = cfg.outputs.with(Output::Prefiller);
    } else if cfg.outputs.has(Output::Prefiller) && cfg.residency.is_none() {
        return Err(ConfigError::new(
            "outputs",
            "\"prefiller\" needs a pd or residency configuration",
        ));
    }
    if cfg.outputs.has(Output::PullFrom) && cfg.residency.is_none() {
        return Err(ConfigError::new(
            "outputs",
            "\"pull_from\" needs a residency configuration",
        ));
    }
    Ok(cfg)
}

/// The `eject` object.
/// Largest `max_decompressed_bytes` accepted.
const MAX_DECOMPRESSED: usize = 256 << 20;

/// The `chains` object; the chain ids' MAC key is `chains.secret`, else the
/// `cache_salt` secret, else the public key.
fn chain_config(
    raw: Option<RawChains>,
    salt: Option<&[u8]>,
) -> Result<crate::read::chain::ChainConfig, ConfigError> {
    let d = crate::read::chain::ChainConfig::default();
    let Some(raw) = raw else {
        return Ok(crate::read::chain::ChainConfig {
            key: crate::read::chain_id::mac_key(salt),
            ..d
        });
    };
    let secret = match raw.secret {
        Some(s) if s.is_empty() => {
            return Err(ConfigError::new("chains.secret", "must not be empty"));
        }
        Some(s) => Some(s.into_bytes()),
        None => salt.map(<[u8]>::to_vec),
    };
    let slots = match raw.slots {
        None => d.slots,
        Some(n) if (1..=1_048_576).contains(&n) => n,
        Some(_) => {
            return Err(ConfigError::new(
                "chains.slots",
                "must be between 1 and 1048576",
            ));
        }
    };
    let ttl_ms = match raw.ttl_s {
        None => d.ttl_ms,
        Some(t) if (1..=604_800).contains(&t) => t * 1000,
        Some(_) => {
            return Err(ConfigError::new(
                "chains.ttl_s",
                "must be between 1 and 604800 (a week)",
            ));
        }
    };
    Ok(crate::read::chain::ChainConfig {
        slots,
        ttl_ms,
        wrap: raw.wrap.unwrap_or(d.wrap),
        key: crate::read::chain_id::mac_key(secret.as_deref()),
    })
}

fn eject_config(raw: RawEject) -> Result<EjectConfig, ConfigError> {
    let d = EjectConfig::default();
    let failures = match raw.failures {
        None => d.failures,
        Some(f) => u32::try_from(f)
            .ok()
            .filter(|f| (1..=1000).contains(f))
            .ok_or_else(|| ConfigError::new("eject.failures", "must be between 1 and 1000"))?,
    };
    let ms = match raw.ms {
        None => d.ms,
        Some(m) if (100..=3_600_000).contains(&m) => m,
        Some(_) => {
            return Err(ConfigError::new(
                "eject.ms",
                "must be between 100 and 3600000",
            ));
        }
    };
    Ok(EjectConfig { failures, ms })
}

fn source_list(name: &str, raw: &[String]) -> Result<Vec<Source>, ConfigError> {
    raw.iter()
        .enumerate()
        .map(|(i, s)| Source::parse(s).map_err(|why| ConfigError::new(format!("{name}[{i}]"), why)))
        .collect()
}

fn tenant_header(h: String) -> Result<String, ConfigError> {
    if h.is_empty() || h.bytes().any(|b| b.is_ascii_uppercase() || b == b':') {
        return Err(ConfigError::new(
            "tenant_header",
            "must be a non-empty lower-case header name",
        ));
    }
    Ok(h)
}

fn salt(raw: RawSalt) -> Result<Vec<u8>, ConfigError> {
    let secret = raw
        .secret
        .ok_or_else(|| ConfigError::new("cache_salt.secret", "missing"))?;
    if secret.is_empty() {
        return Err(ConfigError::new("cache_salt.secret", "must not be empty"));
    }
    Ok(secret.into_bytes())
}

fn retention(raw: BTreeMap<String, u64>) -> Result<RetentionMs, ConfigError> {
    let mut r = RetentionMs::DEFAULT;
    for (k, ms) in raw {
        let kind = TurnKind::ALL
            .into_iter()
            .find(|kind| kind.name() == k)
            .ok_or_else(|| ConfigError::new(format!("retention_ms.{k}"), "unknown field"))?;
        *r.get_mut(kind) = ms;
    }
    Ok(r)
}

fn outputs(raw: RawOutputs, mode: Mode) -> Result<Outputs, ConfigError> {
    let names: Vec<(String, String)> = match raw {
        RawOutputs::One(s) => vec![("outputs".to_owned(), s)],
        RawOutputs::Many(list) => list
            .into_iter()
            .enumerate()
            .map(|(i, s)| (format!("outputs[{i}]"), s))
            .collect(),
    };
    Outputs::from_names(&names, mode == Mode::Pick).map_err(|(f, why)| ConfigError::new(f, why))
}

/// An endpoint list named `list` (`endpoints`, `pd.prefill_endpoints`).
fn endpoint_list(list: &str, raw: Vec<Obj<RawEndpoint>>) -> Result<Vec<Endpoint>, ConfigError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, Obj(e))| endpoint(&format!("{list}[{i}]"), e))
        .collect()
}

fn endpoint(at: &str, raw: RawEndpoint) -> Result<Endpoint, ConfigError> {
    let field = |f: &str| format!("{at}.{f}");
    let address = raw
        .address
        .ok_or_else(|| ConfigError::new(field("address"), "missing"))?;
    let addr: SocketAddr = address
        .parse()
        .map_err(|_| ConfigError::new(field("address"), format!("{address:?} is not ip:port")))?;
    let weight = raw.weight.unwrap_or(1.0);
    if !(weight.is_finite() && weight > 0.0) {
        return Err(ConfigError::new(
            field("weight"),
            "must be a positive number",
        ));
    }
    let dp_size = raw.dp_size.unwrap_or(1);
    if dp_size == 0 {
        return Err(ConfigError::new(field("dp_size"), "must be at least 1"));
    }
    if let Some(n) = &raw.name
        && (n.is_empty() || n.contains(|c: char| c.is_whitespace() || c == ','))
    {
        return Err(ConfigError::new(
            field("name"),
            "must be non-empty, without spaces or commas",
        ));
    }
    Ok(Endpoint {
        address: addr.to_string(),
        weight,
        dp_size,
        name: raw.name,
    })
}

impl TryFrom<RawLoad> for LoadConfig {
    type Error = ConfigError;

    fn try_from(raw: RawLoad) -> Result<LoadConfig, ConfigError> {
        let err = |f: &str, why: &str| ConfigError::new(format!("load.{f}"), why);
        let d = LoadConfig::default();
        let poll_ms = raw.poll_ms.unwrap_or(d.poll_ms);
        let c = LoadConfig {
            cluster: match raw.cluster {
                Some(c) if c.is_empty() => {
                    return Err(err("cluster", "must be a non-empty cluster name"));
                }
                Some(c) => c,
                None => d.cluster,
            },
            poll_ms,
            timeout_ms: raw.timeout_ms.unwrap_or(d.timeout_ms),
            max_age_ms: raw
                .max_age_ms
                .unwrap_or(d.max_age_ms.max(poll_ms.saturating_mul(5))),
            factor: raw.factor.unwrap_or(d.factor),
            floor: raw.floor.unwrap_or(d.floor),
        };
        if !(10..=60_000).contains(&c.poll_ms) {
            return Err(err("poll_ms", "must be between 10 and 60000"));
        }
        if !(1..=60_000).contains(&c.timeout_ms) {
            return Err(err("timeout_ms", "must be between 1 and 60000"));
        }
        if c.max_age_ms < c.poll_ms {
            return Err(err("max_age_ms", "must be at least poll_ms"));
        }
        if !(c.factor.is_finite() && c.factor > 1.0) {
            return Err(err("factor", "must be a number above 1"));
        }
        if !(c.floor.is_finite() && c.floor >= 1.0) {
            return Err(err("floor", "must be a number of at least 1"));
        }
        Ok(c)
    }
}

/// The `residency` object, checked against the rest: it places pick-mode
/// keys on the load view's samples, and a migration names the old home in
/// `x-tether-pull-from` (`migrate: "pull"`) or `x-prefiller-host-port` (`"leg"`).
fn residency_config(mut cfg: Config, raw: RawResidency) -> Result<Config, ConfigError> {
    let err = |f: &str, why: &str| ConfigError::new(format!("residency.{f}"), why);
    if cfg.mode != Mode::Pick {
        return Err(ConfigError::new(
            "residency",
            "needs mode \"pick\" (the filter must choose the endpoint)",
        ));
    }
    if cfg.load.is_none() {
        return Err(ConfigError::new(
            "residency",
            "needs a load configuration (residency is polled with the load view)",
        ));
    }
    let d = ResidencyConfig::default();
    let r = ResidencyConfig {
        // The default never asks for more candidates than there are endpoints.
        candidates: raw
            .candidates
            .unwrap_or(d.candidates.min(cfg.endpoints.len().max(1))),
        kv_bytes_per_token: raw.kv_bytes_per_token.unwrap_or(d.kv_bytes_per_token),
        link_gbps: raw.link_gbps.unwrap_or(d.link_gbps),
        transfer_setup_ms: raw.transfer_setup_ms.unwrap_or(d.transfer_setup_ms),
        prefill_tokens_per_s: raw.prefill_tokens_per_s.or(d.prefill_tokens_per_s),
        factor: raw.factor.unwrap_or(d.factor),
        floor: raw.floor.unwrap_or(d.floor),
        unseen: match raw.unseen.as_deref() {
            None => d.unseen,
            Some(s) => Unseen::from_name(s)
                .ok_or_else(|| err("unseen", "must be \"least-loaded\" or \"rendezvous\""))?,
        },
        migrate: match raw.migrate.as_deref() {
            None => d.migrate,
            Some(s) => Migrate::from_name(s)
                .ok_or_else(|| err("migrate", "must be \"pull\" or \"leg\""))?,
        },
        over_bound: match raw.over_bound.as_deref() {
            None => d.over_bound,
            Some(s) => OverBound::from_name(s)
                .ok_or_else(|| err("over_bound", "must be \"move\" or \"keep-up\""))?,
        },
        busy_weight: raw.busy_weight.unwrap_or(d.busy_weight),
    };
    let n = cfg.endpoints.len();
    if r.candidates == 0 || r.candidates > n {
        return Err(err(
            "candidates",
            &format!("must be between 1 and the number of endpoints ({n})"),
        ));
    }
    let positive = |v: f64| v.is_finite() && v > 0.0;
    let non_negative = |v: f64| v.is_finite() && v >= 0.0;
    if !positive(r.kv_bytes_per_token) {
        return Err(err("kv_bytes_per_token", "must be a positive number"));
    }
    if !non_negative(r.link_gbps) {
        return Err(err(
            "link_gbps",
            "must be a number of at least 0 (0: never migrate)",
        ));
    }
    if !non_negative(r.transfer_setup_ms) {
        return Err(err("transfer_setup_ms", "must be a number of at least 0"));
    }
    if r.prefill_tokens_per_s.is_some_and(|v| !positive(v)) {
        return Err(err("prefill_tokens_per_s", "must be a positive number"));
    }
    if !(r.factor.is_finite() && r.factor > 1.0) {
        return Err(err("factor", "must be a number above 1"));
    }
    if !(r.floor.is_finite() && r.floor >= 1.0) {
        return Err(err("floor", "must be a number of at least 1"));
    }
    if !(0.0..=1.0).contains(&r.busy_weight) {
        return Err(err(
            "busy_weight",
            "must be a number from 0 to 1 (0: ties by rendezvous order)",
        ));
    }
    // A migration names the old home: the engine pulls from it, or sends
    // it the prefill leg.
    cfg.outputs = cfg.outputs.with(match r.migrate {
        Migrate::Pull => Output::PullFrom,
        Migrate::Leg => Output::Prefiller,
    });
    cfg.residency = Some(r);
    Ok(cfg)
}

/// The `pd` object; `decode` are the pick-mode `endpoints`: a prefill
/// endpoint must have every DP rank a decode endpoint may name (both legs
/// keep the rank).
fn prefill_config(raw: RawPd, decode: &[Endpoint]) -> Result<PdConfig, ConfigError> {
    let err = |f: &str, why: String| ConfigError::new(format!("pd.{f}"), why);
    let prefill = endpoint_list(
        "pd.prefill_endpoints",
        raw.prefill_endpoints.unwrap_or_default(),
    )?;
    let bytes_per_token = match raw.bytes_per_token {
        None => pd::DEFAULT_BYTES_PER_TOKEN,
        Some(b) if b.is_finite() && (0.5..=64.0).contains(&b) => b,
        Some(_) => {
            return Err(err(
                "bytes_per_token",
                "must be a number between 0.5 and 64".into(),
            ));
        }
    };
    if prefill.is_empty() {
        return Err(err("prefill_endpoints", "must not be empty".into()));
    }
    let need = decode.iter().map(|e| e.dp_size).max().unwrap_or(1);
    if let Some(i) = prefill.iter().position(|e| e.dp_size < need) {
        return Err(err(
            &format!("prefill_endpoints[{i}].dp_size"),
            format!(
                "must be at least {need}, the largest decode dp_size (both legs keep the DP rank)"
            ),
        ));
    }
    Ok(PdConfig {
        prefill,
        threshold_tokens: raw.threshold_tokens.unwrap_or(pd::DEFAULT_THRESHOLD_TOKENS),
        bytes_per_token,
    })
}

#[cfg(test)]
mod tests;
