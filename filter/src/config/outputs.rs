//! The outputs a deployment consumes: which headers, filter-state values and
//! body fields the filter writes, chosen in the configuration (`outputs`) by
//! presets that match real deployments or one by one. Every request pays
//! only for what is configured: an output nobody reads is never computed,
//! never handed to Envoy and never copied by `header_mutation`.
//!
//! Adding an output: a variant here (name, where it goes, what it needs), its
//! value in [`crate::emit::markers`], and a row in `docs/gateway.md`.

use tether_wire::headers as h;

/// One thing the filter can write for a routed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Output {
    /// `x-tether-key`: the routing key (hash mode: what Envoy's hash policy reads).
    Key,
    /// `x-tether-key-source`.
    KeySource,
    /// `x-tether-tenant` / `-session` / `-subagent` / `-parent`: id hashes.
    Tenant,
    Session,
    Subagent,
    Parent,
    /// `x-tether-prompt-end` / `-turn-kind` / `-turn` / `-retention-ms`: turn markers.
    PromptEnd,
    TurnKind,
    /// The exact turn count: walks the whole conversation (bodies up to
    /// `turn_count_max_bytes`).
    Turn,
    RetentionMs,
    /// `x-gateway-destination-endpoint` (pick mode, Envoy `override_host`).
    Destination,
    /// `x-data-parallel-rank` (pick mode, vLLM data parallel).
    DpRank,
    /// `x-prefiller-host-port` (pick mode with `pd`, llm-d P/D): only on
    /// disaggregated requests; added whenever `pd` is configured.
    Prefiller,
    /// `x-tether-pull-from` (pick mode with `residency`, `migrate: "pull"`):
    /// only on a migrated key's turn, naming its old holder; added whenever
    /// residency pulls.
    PullFrom,
    /// Filter state `envoy.network.transport_socket.original_dst_address` =
    /// the primary endpoint (pick mode, an `ORIGINAL_DST` cluster).
    OriginalDst,
    /// Filter state `envoy.hashable_string` = the key (a route `hash_policy`
    /// on filter state).
    HashableString,
    /// `x-session-id` = the key (vLLM/SGLang `request.session_id`).
    SessionId,
    /// Body `session_id` = the key (body rewrite).
    BodySessionId,
    /// Body `routed_dp_rank` = the DP rank (SGLang; pick mode; body rewrite).
    RoutedDpRank,
    /// Body `kv_transfer_params.tether` = the turn markers (vLLM KV connector;
    /// body rewrite).
    KvTransferParams,
    /// Response header `x-tether-debug`.
    Debug,
}

/// Where an output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// A request header: set in the header callback on the header path; on the
    /// body path handed over as filter state `wasm.tether.<name>` for a
    /// `header_mutation` entry to copy.
    Header(&'static str),
    /// An Envoy filter-state object (`set_envoy_filter_state`), on both paths.
    FilterState(&'static str),
    /// A top-level member of the JSON request body (body path only: rewrites).
    BodyField(&'static str),
    /// A response header.
    ResponseHeader(&'static str),
}

/// Filter-state key read by an `ORIGINAL_DST` cluster.
pub const ORIGINAL_DST_KEY: &str = "envoy.network.transport_socket.original_dst_address";
/// Filter-state key usable by `hash_policy.filter_state`.
pub const HASHABLE_KEY: &str = "envoy.hashable_string";

impl Output {
    pub const ALL: [Output; 21] = [
        Output::Key,
        Output::KeySource,
        Output::Tenant,
        Output::Session,
        Output::Subagent,
        Output::Parent,
        Output::PromptEnd,
        Output::TurnKind,
        Output::Turn,
        Output::RetentionMs,
        Output::Destination,
        Output::DpRank,
        Output::Prefiller,
        Output::PullFrom,
        Output::OriginalDst,
        Output::HashableString,
        Output::SessionId,
        Output::BodySessionId,
        Output::RoutedDpRank,
        Output::KvTransferParams,
        Output::Debug,
    ];

    /// The name used in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Output::Key => "key",
            Output::KeySource => "key_source",
            Output::Tenant => "tenant",
            Output::Session => "session",
            Output::Subagent => "subagent",
            Output::Parent => "parent",
            Output::PromptEnd => "prompt_end",
            Output::TurnKind => "turn_kind",
            Output::Turn => "turn",
            Output::RetentionMs => "retention_ms",
            Output::Destination => "destination",
            Output::DpRank => "dp_rank",
            Output::Prefiller => "prefiller",
            Output::PullFrom => "pull_from",
            Output::OriginalDst => "original_dst",
            Output::HashableString => "hashable_string",
            Output::SessionId => "session_id",
            Output::BodySessionId => "body_session_id",
            Output::RoutedDpRank => "routed_dp_rank",
            Output::KvTransferParams => "kv_transfer_params",
            Output::Debug => "debug",
        }
    }

    pub fn sink(self) -> Sink {
        match self {
            Output::Key => Sink::Header(h::KEY),
            Output::KeySource => Sink::Header(h::KEY_SOURCE),
            Output::Tenant => Sink::Header(h::TENANT),
            Output::Session => Sink::Header(h::SESSION),
            Output::Subagent => Sink::Header(h::SUBAGENT),
            Output::Parent => Sink::Header(h::PARENT),
            Output::PromptEnd => Sink::Header(h::PROMPT_END),
            Output::TurnKind => Sink::Header(h::TURN_KIND),
            Output::Turn => Sink::Header(h::TURN),
            Output::RetentionMs => Sink::Header(h::RETENTION_MS),
            Output::Destination => Sink::Header(h::DESTINATION),
            Output::DpRank => Sink::Header(h::DP_RANK),
            Output::Prefiller => Sink::Header(h::PREFILLER),
            Output::PullFrom => Sink::Header(h::PULL_FROM),
            Output::OriginalDst => Sink::FilterState(ORIGINAL_DST_KEY),
            Output::HashableString => Sink::FilterState(HASHABLE_KEY),
            Output::SessionId => Sink::Header(h::SESSION_ID),
            Output::BodySessionId => Sink::BodyField("session_id"),
            Output::RoutedDpRank => Sink::BodyField("routed_dp_rank"),
            Output::KvTransferParams => Sink::BodyField("kv_transfer_params"),
            Output::Debug => Sink::ResponseHeader(h::DEBUG),
        }
    }

    /// Outputs that only exist when the filter picks the endpoint.
    pub fn needs_pick(self) -> bool {
        matches!(
            self,
            Output::Destination
                | Output::DpRank
                | Output::Prefiller
                | Output::PullFrom
                | Output::OriginalDst
                | Output::RoutedDpRank
        )
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A named set of outputs matching one kind of deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    pub outputs: &'static [Output],
    /// What it is for (docs and error messages).
    pub purpose: &'static str,
}

/// The presets, in the order `docs/gateway.md` lists them.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "hash",
        outputs: &[Output::Key],
        purpose: "Envoy hashes x-tether-key (MAGLEV/RING_HASH, Istio consistentHash)",
    },
    Preset {
        name: "pick",
        outputs: &[Output::Destination, Output::DpRank],
        purpose: "Envoy override_host follows the filter's endpoint; vLLM reads the DP rank",
    },
    Preset {
        name: "retain",
        outputs: &[
            Output::Tenant,
            Output::Session,
            Output::Subagent,
            Output::PromptEnd,
            Output::TurnKind,
            Output::RetentionMs,
        ],
        purpose: "an engine that retains turn-end KV reads the x-tether-* markers",
    },
    Preset {
        name: "vllm",
        outputs: &[Output::SessionId, Output::KvTransferParams],
        purpose: "the vLLM KV connector: markers in kv_transfer_params.tether, session in x-session-id",
    },
    Preset {
        name: "all",
        outputs: &[
            Output::Key,
            Output::KeySource,
            Output::Tenant,
            Output::Session,
            Output::Subagent,
            Output::Parent,
            Output::PromptEnd,
            Output::TurnKind,
            Output::Turn,
            Output::RetentionMs,
            Output::Destination,
            Output::DpRank,
            Output::SessionId,
            Output::Debug,
        ],
        purpose: "debugging: every header the mode has, and x-tether-debug on the response (filter-state objects and body rewrites are chosen one by one: each needs its reader)",
    },
];

/// A set of outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outputs(u32);

impl Outputs {
    pub const NONE: Outputs = Outputs(0);

    /// The default: what the mode itself needs to place a request (preset
    /// `pick` when the filter picks the endpoint, else `hash`).
    pub fn default_for(pick: bool) -> Outputs {
        let name = if pick { "pick" } else { "hash" };
        PRESETS
            .iter()
            .find(|p| p.name == name)
            .map(|p| Outputs::of(p.outputs))
            .unwrap_or_default()
    }

    pub fn of(list: &[Output]) -> Outputs {
        Outputs(list.iter().fold(0, |bits, o| bits | o.bit()))
    }

    pub fn has(self, o: Output) -> bool {
        self.0 & o.bit() != 0
    }

    pub fn with(self, o: Output) -> Outputs {
        Outputs(self.0 | o.bit())
    }

    pub fn without(self, o: Output) -> Outputs {
        Outputs(self.0 & !o.bit())
    }

    pub fn union(self, other: Outputs) -> Outputs {
        Outputs(self.0 | other.0)
    }

    /// The outputs in [`Output::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Output> {
        Output::ALL.into_iter().filter(move |o| self.has(*o))
    }

    /// Any of the turn markers (then the conversation's end is classified).
    pub fn needs_turn(self) -> bool {
        [
            Output::PromptEnd,
            Output::TurnKind,
            Output::Turn,
            Output::RetentionMs,
            Output::KvTransferParams,
            Output::Debug,
        ]
        .into_iter()
        .any(|o| self.has(o))
    }

    /// Request headers set (header path) or handed over as filter state for
    /// `header_mutation` (body path), in output order.
    pub fn request_headers(self) -> impl Iterator<Item = &'static str> {
        self.iter().filter_map(|o| match o.sink() {
            Sink::Header(name) => Some(name),
            _ => None,
        })
    }

    /// The body fields this set rewrites.
    pub fn body_fields(self) -> impl Iterator<Item = &'static str> {
        self.iter().filter_map(|o| match o.sink() {
            Sink::BodyField(name) => Some(name),
            _ => None,
        })
    }

    /// Request headers a `header_mutation` filter must copy from filter state on
    /// the body path: every request-header output the body path can produce.
    pub fn copied_headers(self) -> impl Iterator<Item = &'static str> {
        self.request_headers()
    }

    /// Internal headers the header path sets on every request it decides: a
    /// route may match one of them to disable buffering (a client cannot send
    /// them, the filter strips them). Turn kind, count and interval need the
    /// body, so the header path never sets them.
    pub fn header_path_markers(self) -> impl Iterator<Item = &'static str> {
        self.iter().filter_map(|o| match (o, o.sink()) {
            (
                Output::TurnKind
                | Output::Turn
                | Output::RetentionMs
                | Output::Parent
                | Output::Prefiller
                | Output::PullFrom,
                _,
            ) => None,
            (_, Sink::Header(name)) if tether_wire::headers::is_internal(name.as_bytes()) => {
                Some(name)
            }
            _ => None,
        })
    }

    /// The set named by `outputs` — (field, name) per entry: preset and
    /// output names, their union. Unknown names and pick-only outputs when the
    /// filter does not pick (`pick` false) are errors naming the entry;
    /// preset `all` takes only what the mode has.
    pub fn from_names(names: &[(String, String)], pick: bool) -> Result<Outputs, (String, String)> {
        let mut set = Outputs::NONE;
        for (field, name) in names {
            let (field, name) = (field.clone(), name.as_str());
            if let Some(p) = PRESETS.iter().find(|p| p.name == name) {
                let mut add = Outputs::of(p.outputs);
                if !pick {
                    if p.name != "all" && add.iter().any(Output::needs_pick) {
                        return Err((
                            field,
                            format!(
                                "preset {name:?} needs mode \"pick\" (the filter must choose the endpoint)"
                            ),
                        ));
                    }
                    add = Output::ALL
                        .into_iter()
                        .filter(|o| o.needs_pick())
                        .fold(add, Outputs::without);
                }
                set = set.union(add);
            } else if let Some(o) = Output::ALL.into_iter().find(|o| o.name() == name) {
                if o.needs_pick() && !pick {
                    return Err((
                        field,
                        format!(
                            "{name:?} needs mode \"pick\" (the filter must choose the endpoint)"
                        ),
                    ));
                }
                set = set.with(o);
            } else {
                let known: Vec<&str> = PRESETS
                    .iter()
                    .map(|p| p.name)
                    .chain(Output::ALL.iter().map(|o| o.name()))
                    .collect();
                return Err((
                    field,
                    format!(
                        "unknown output or preset {name:?} (known: {})",
                        known.join(", ")
                    ),
                ));
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests;
