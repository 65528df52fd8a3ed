//! Plugin configuration: parsed once from JSON into a typed, validated struct;
//! every error names the offending field (see `docs/gateway.md`).

use crate::outputs::Outputs;
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
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
    pub load: Option<crate::load_view::LoadConfig>,
    /// P/D in pick mode (`pd`): a prefill pool and the disaggregation threshold.
    pub pd: Option<crate::pd::PdConfig>,
    /// Pick mode: passive outlier detection on the response path (`eject`).
    pub eject: crate::eject::EjectConfig,
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
            outputs: Outputs::default_for(Mode::Hash),
            max_body_bytes: 16 * 1024 * 1024,
            header_fast_path: true,
            turn_count_max_bytes: 32 * 1024,
            load: None,
            pd: None,
            eject: crate::eject::EjectConfig::default(),
        }
    }
}

fn field<T: DeserializeOwned>(name: &str, v: &serde_json::Value) -> Result<T, ConfigError> {
    serde_json::from_value(v.clone()).map_err(|e| ConfigError::new(name, e.to_string()))
}

fn source_list(name: &str, v: &serde_json::Value) -> Result<Vec<Source>, ConfigError> {
    let raw: Vec<String> = field(name, v)?;
    raw.iter()
        .enumerate()
        .map(|(i, s)| Source::parse(s).map_err(|why| ConfigError::new(format!("{name}[{i}]"), why)))
        .collect()
}

impl Config {
    /// Parses and validates the plugin configuration; empty input = all defaults.
    pub fn parse(raw: &[u8]) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        if raw.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(cfg);
        }
        let mut outputs = None;
        let value: serde_json::Value = serde_json::from_slice(raw)
            .map_err(|e| ConfigError::new("(configuration)", format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| ConfigError::new("(configuration)", "must be a JSON object"))?;
        let mut pd = None;
        for (name, v) in obj {
            match name.as_str() {
                "mode" => {
                    cfg.mode = match field::<String>(name, v)?.as_str() {
                        "hash" => Mode::Hash,
                        "pick" => Mode::Pick,
                        other => {
                            return Err(ConfigError::new(
                                name,
                                format!("unknown mode {other:?} (expected \"hash\" or \"pick\")"),
                            ));
                        }
                    }
                }
                "endpoints" => {
                    let list = v
                        .as_array()
                        .ok_or_else(|| ConfigError::new(name, "must be a list"))?;
                    cfg.endpoints = list
                        .iter()
                        .enumerate()
                        .map(|(i, e)| endpoint("endpoints", i, e))
                        .collect::<Result<_, _>>()?;
                    // Two endpoints with one name would share every key.
                    for (i, e) in cfg.endpoints.iter().enumerate() {
                        if e.name.is_some()
                            && cfg
                                .endpoints
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
                }
                "fallbacks" => cfg.fallbacks = field(name, v)?,
                "session_sources" => cfg.session_sources = source_list(name, v)?,
                "subagent_sources" => cfg.subagent_sources = source_list(name, v)?,
                "parent_sources" => cfg.parent_sources = source_list(name, v)?,
                "tenant_header" => {
                    let h: String = field(name, v)?;
                    if h.is_empty() || h.bytes().any(|b| b.is_ascii_uppercase() || b == b':') {
                        return Err(ConfigError::new(
                            name,
                            "must be a non-empty lower-case header name",
                        ));
                    }
                    cfg.tenant_header = Some(h);
                }
                "cache_salt" => {
                    let mut secret = None;
                    for (k, v) in object(name, v)? {
                        match k.as_str() {
                            "secret" => secret = Some(field::<String>("cache_salt.secret", v)?),
                            other => {
                                return Err(ConfigError::new(
                                    format!("cache_salt.{other}"),
                                    "unknown field",
                                ));
                            }
                        }
                    }
                    let secret =
                        secret.ok_or_else(|| ConfigError::new("cache_salt.secret", "missing"))?;
                    if secret.is_empty() {
                        return Err(ConfigError::new("cache_salt.secret", "must not be empty"));
                    }
                    cfg.cache_salt = Some(secret.into_bytes());
                }
                "retention_ms" => {
                    for (k, v) in object(name, v)? {
                        let path = format!("retention_ms.{k}");
                        let kind = TurnKind::ALL
                            .into_iter()
                            .find(|kind| kind.name() == k)
                            .ok_or_else(|| ConfigError::new(path.clone(), "unknown field"))?;
                        *cfg.retention_ms.get_mut(kind) = field(&path, v)?;
                    }
                }
                "subagent_tools" => cfg.subagent_tools = field(name, v)?,
                "outputs" => outputs = Some(v),
                "engine" | "debug_header" => {
                    return Err(ConfigError::new(
                        name,
                        "replaced by `outputs` (docs/gateway.md, \"Outputs\")",
                    ));
                }
                "max_body_bytes" => cfg.max_body_bytes = field(name, v)?,
                "header_fast_path" => cfg.header_fast_path = field(name, v)?,
                "turn_count_max_bytes" => cfg.turn_count_max_bytes = field(name, v)?,
                "load" => cfg.load = Some(crate::load_view::LoadConfig::parse(v)?),
                "eject" => cfg.eject = crate::eject::EjectConfig::parse(v)?,
                "pd" => pd = Some(v),
                other => return Err(ConfigError::new(other, "unknown field")),
            }
        }
        if cfg.mode == Mode::Pick && cfg.endpoints.is_empty() {
            return Err(ConfigError::new(
                "endpoints",
                "must not be empty in pick mode",
            ));
        }
        cfg.outputs = match outputs {
            Some(v) => Outputs::parse(v, cfg.mode).map_err(|(f, why)| ConfigError::new(f, why))?,
            None => Outputs::default_for(cfg.mode),
        };
        if cfg.max_body_bytes == 0 {
            return Err(ConfigError::new("max_body_bytes", "must be positive"));
        }
        if cfg.load.is_some() && cfg.mode != Mode::Pick {
            return Err(ConfigError::new(
                "load",
                "needs mode \"pick\" (the filter must choose the endpoint)",
            ));
        }
        if let Some(v) = pd {
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
            cfg.pd = Some(crate::pd::PdConfig::parse(v, &cfg.endpoints)?);
            // The prefiller header is what `pd` is for.
            cfg.outputs = cfg.outputs.with(crate::outputs::Output::Prefiller);
        } else if cfg.outputs.has(crate::outputs::Output::Prefiller) {
            return Err(ConfigError::new(
                "outputs",
                "\"prefiller\" needs a pd configuration (the prefill pool)",
            ));
        }
        Ok(cfg)
    }

    /// True when a body that cannot be rewritten must be refused: what the
    /// filter writes there guards the engine (the tenant's `cache_salt`, the
    /// turn markers in `kv_transfer_params.tether`), so a client's own copy
    /// must never get through.
    pub fn must_rewrite(&self) -> bool {
        self.cache_salt.is_some() || self.outputs.has(crate::outputs::Output::KvTransferParams)
    }

    /// True when the body is rewritten at end of stream (salt or body outputs).
    pub fn rewrites_body(&self) -> bool {
        self.cache_salt.is_some() || self.outputs.body_fields().next().is_some()
    }
}

fn object<'v>(
    name: &str,
    v: &'v serde_json::Value,
) -> Result<&'v serde_json::Map<String, serde_json::Value>, ConfigError> {
    v.as_object()
        .ok_or_else(|| ConfigError::new(name, "must be an object"))
}

/// Element `i` of an endpoint list named `list` (`endpoints`, `pd.prefill_endpoints`).
pub(crate) fn endpoint(
    list: &str,
    i: usize,
    v: &serde_json::Value,
) -> Result<Endpoint, ConfigError> {
    let at = |f: &str| format!("{list}[{i}].{f}");
    let (mut address, mut weight, mut dp_size, mut name) = (None, 1.0_f64, 1_u32, None);
    for (k, v) in object(&format!("{list}[{i}]"), v)? {
        match k.as_str() {
            "address" => address = Some(field::<String>(&at("address"), v)?),
            "weight" => weight = field(&at("weight"), v)?,
            "dp_size" => dp_size = field(&at("dp_size"), v)?,
            "name" => {
                let n: String = field(&at("name"), v)?;
                if n.is_empty() || n.contains(|c: char| c.is_whitespace() || c == ',') {
                    return Err(ConfigError::new(
                        at("name"),
                        "must be non-empty, without spaces or commas",
                    ));
                }
                name = Some(n);
            }
            other => return Err(ConfigError::new(at(other), "unknown field")),
        }
    }
    let address = address.ok_or_else(|| ConfigError::new(at("address"), "missing"))?;
    let addr: SocketAddr = address
        .parse()
        .map_err(|_| ConfigError::new(at("address"), format!("{address:?} is not ip:port")))?;
    if !(weight.is_finite() && weight > 0.0) {
        return Err(ConfigError::new(at("weight"), "must be a positive number"));
    }
    if dp_size == 0 {
        return Err(ConfigError::new(at("dp_size"), "must be at least 1"));
    }
    Ok(Endpoint {
        address: addr.to_string(),
        weight,
        dp_size,
        name,
    })
}

#[cfg(test)]
mod tests;
