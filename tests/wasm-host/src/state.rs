//! Everything the host remembers about one VM: options, streams, shared data,
//! queues, metrics, logs and the records tests assert on. Lives in the
//! `Store<HostState>`; there are no globals.

use crate::abi::{LogLevel, MetricType, Status};
use crate::filter_state::{DEFAULT_ACCEPTED_KEYS, FilterStateEntry};
use crate::header_map::HeaderMap;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// How a VM is set up; everything has a working default.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Bytes returned for `PluginConfiguration` and announced to `proxy_on_configure`.
    pub plugin_config: Vec<u8>,
    /// Bytes returned for `VmConfiguration` and announced to `proxy_on_vm_start`.
    pub vm_config: Vec<u8>,
    pub vm_id: String,
    pub plugin_name: String,
    /// Level reported by `proxy_get_log_level`; lower messages are still recorded.
    pub log_level: LogLevel,
    /// Instruction budget (wasmtime fuel) per callback; `None` = unlimited.
    /// Needs a plugin compiled with metering.
    pub fuel_per_callback: Option<u64>,
    /// Clock start for `proxy_get_current_time_nanoseconds` and WASI clocks.
    pub start_time_ns: u64,
    /// Seed of the deterministic `random_get`.
    pub random_seed: u64,
    /// Keys `set_envoy_filter_state` accepts (Envoy: keys with an object factory).
    pub accepted_filter_state_keys: Vec<String>,
    /// Extra properties (`get_property`), keyed by path segments.
    pub properties: BTreeMap<Vec<String>, Vec<u8>>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            plugin_config: Vec::new(),
            vm_config: Vec::new(),
            vm_id: "vm".into(),
            plugin_name: "plugin".into(),
            log_level: LogLevel::Info,
            fuel_per_callback: None,
            start_time_ns: 1_700_000_000_000_000_000,
            random_seed: 0x7e7e_7e7e,
            accepted_filter_state_keys: DEFAULT_ACCEPTED_KEYS
                .iter()
                .map(|k| k.to_string())
                .collect(),
            properties: BTreeMap::new(),
        }
    }
}

/// A log line, from `proxy_log` or WASI stdout/stderr.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LogRecord {
    pub level: LogLevel,
    /// `proxy_log`, `stdout` or `stderr`.
    pub source: &'static str,
    pub context_id: u32,
    pub message: String,
}

/// A metric as defined by the guest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Metric {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: MetricType,
    /// Counter total, gauge value, or histogram sum.
    pub value: u64,
    /// Histogram: number of recorded values.
    pub count: u64,
}

/// An outgoing `dispatch_http_call`.
#[derive(Clone, Debug, Serialize)]
pub struct HttpCall {
    pub token: u32,
    pub context_id: u32,
    pub upstream: String,
    #[serde(serialize_with = "crate::exchange::ser_headers")]
    pub headers: HeaderMap,
    #[serde(serialize_with = "crate::exchange::ser_bytes")]
    pub body: Vec<u8>,
    pub timeout_ms: u32,
}

/// A response to an HTTP call, scripted by the test.
#[derive(Clone, Debug, Default)]
pub struct HttpCallResponse {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub trailers: HeaderMap,
}

/// A `send_local_response`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LocalResponse {
    pub status: u32,
    pub details: String,
    #[serde(serialize_with = "crate::exchange::ser_headers")]
    pub headers: HeaderMap,
    #[serde(serialize_with = "crate::exchange::ser_bytes")]
    pub body: Vec<u8>,
    pub grpc_status: i32,
}

/// A foreign-function call, whatever its outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ForeignCall {
    pub name: String,
    #[serde(serialize_with = "crate::exchange::ser_bytes")]
    pub args: Vec<u8>,
    pub status: Status,
}

/// Whether the filter may touch a header map or body buffer right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Access {
    /// Not (or no longer) available: Envoy answers `BadArgument` for maps.
    #[default]
    Gone,
    ReadWrite,
}

/// The host side of one HTTP stream (one HTTP context).
#[derive(Debug, Default)]
pub struct StreamState {
    pub request_headers: HeaderMap,
    pub request_headers_access: Access,
    pub request_body: Vec<u8>,
    pub request_body_access: Access,
    pub request_trailers: HeaderMap,
    pub request_trailers_access: Access,
    pub response_headers: HeaderMap,
    pub response_headers_access: Access,
    pub response_body: Vec<u8>,
    pub response_body_access: Access,
    pub response_trailers: HeaderMap,
    pub response_trailers_access: Access,
    /// Properties the guest wrote on this stream (`proxy_set_property`);
    /// Envoy stores them as filter state `wasm.<path joined by '.'>`.
    pub set_properties: BTreeMap<Vec<String>, Vec<u8>>,
    /// Per-request properties (source address, metadata, ...).
    pub properties: BTreeMap<Vec<String>, Vec<u8>>,
    /// `proxy_continue_stream` asked for, applied after the callback returns.
    pub resume_request: bool,
    pub resume_response: bool,
    /// `proxy_close_stream` asked for.
    pub closed: bool,
    pub local_response: Option<LocalResponse>,
    /// `response.code_details`: `via_upstream`, or a local reply's details.
    pub response_code_details: Option<String>,
}

/// Work queued by host calls, run after the current callback returns (as Envoy
/// does: a host call never re-enters the guest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deferred {
    QueueReady { queue_id: u32 },
    HttpCallResponse { token: u32 },
}

/// Per-callback cost accounting for the cost benchmark: fuel (metered
/// plugins only) and wall time spent inside the guest, host calls included.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FuelLedger {
    pub by_callback: BTreeMap<String, u64>,
    pub total: u64,
    /// Nanoseconds inside guest calls, per callback.
    pub nanos_by_callback: BTreeMap<String, u64>,
}

#[derive(Debug)]
pub(crate) struct Queue {
    pub vm_id: String,
    pub name: String,
    pub items: VecDeque<Vec<u8>>,
}

/// All state of one VM.
#[derive(Debug)]
pub struct HostState {
    pub options: HostOptions,
    pub root_context_id: u32,
    /// Context whose callback is running (or set by `proxy_set_effective_context`).
    pub current_context: u32,
    pub streams: HashMap<u32, StreamState>,
    pub shared_data: BTreeMap<String, (Vec<u8>, u32)>,
    pub(crate) queues: Vec<Queue>,
    pub metrics: Vec<Metric>,
    pub logs: Vec<LogRecord>,
    pub tick_period_ms: u32,
    pub now_ns: u64,
    pub http_calls: Vec<HttpCall>,
    /// Responses scripted per upstream name; consumed in order.
    pub scripted_http_responses: HashMap<String, VecDeque<HttpCallResponse>>,
    /// The response being delivered to `proxy_on_http_call_response`.
    pub current_http_response: Option<HttpCallResponse>,
    pub(crate) ready_http_responses: HashMap<u32, HttpCallResponse>,
    /// Tokens of the HTTP calls whose response was delivered.
    pub answered_http_calls: BTreeSet<u32>,
    pub foreign_calls: Vec<ForeignCall>,
    pub filter_state: Vec<FilterStateEntry>,
    pub route_cache_clears: u32,
    /// Properties written by the guest from the root context (`proxy_set_property`).
    pub set_properties: BTreeMap<Vec<String>, Vec<u8>>,
    pub deferred: VecDeque<Deferred>,
    pub done_called: bool,
    pub fuel: FuelLedger,
    /// `env.proxy_*` calls made by the guest, by import name.
    pub host_calls: BTreeMap<&'static str, u64>,
    /// Bytes the host copied into guest memory (`copy_out`: buffers, maps,
    /// properties).
    pub bytes_to_guest: u64,
    pub(crate) rng: u64,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
}

impl HostState {
    pub fn new(options: HostOptions) -> Self {
        Self {
            now_ns: options.start_time_ns,
            rng: options.random_seed | 1,
            options,
            root_context_id: 1,
            current_context: 1,
            streams: HashMap::new(),
            shared_data: BTreeMap::new(),
            queues: Vec::new(),
            metrics: Vec::new(),
            logs: Vec::new(),
            tick_period_ms: 0,
            http_calls: Vec::new(),
            scripted_http_responses: HashMap::new(),
            current_http_response: None,
            ready_http_responses: HashMap::new(),
            answered_http_calls: BTreeSet::new(),
            foreign_calls: Vec::new(),
            filter_state: Vec::new(),
            route_cache_clears: 0,
            set_properties: BTreeMap::new(),
            deferred: VecDeque::new(),
            done_called: false,
            fuel: FuelLedger::default(),
            host_calls: BTreeMap::new(),
            bytes_to_guest: 0,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    /// The stream of the current context, if it is an HTTP context.
    pub fn stream(&mut self) -> Option<&mut StreamState> {
        self.streams.get_mut(&self.current_context)
    }

    /// Value of a metric by name.
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.metrics
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.value)
    }

    pub(crate) fn log(&mut self, level: LogLevel, source: &'static str, message: String) {
        let context_id = self.current_context;
        self.logs.push(LogRecord {
            level,
            source,
            context_id,
            message,
        });
    }

    /// xorshift64*: deterministic per seed, good enough for hash seeds in guests.
    pub(crate) fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Moves complete lines written to WASI stdout/stderr into the log.
    pub(crate) fn flush_stdio(&mut self, final_flush: bool) {
        for source in ["stdout", "stderr"] {
            let buf = if source == "stdout" {
                &mut self.stdout
            } else {
                &mut self.stderr
            };
            let cut = if final_flush {
                buf.len()
            } else {
                buf.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1)
            };
            if cut == 0 {
                continue;
            }
            let text: Vec<u8> = buf.drain(..cut).collect();
            let level = if source == "stdout" {
                LogLevel::Info
            } else {
                LogLevel::Error
            };
            for line in String::from_utf8_lossy(&text)
                .lines()
                .filter(|l| !l.is_empty())
            {
                self.log(level, source, line.to_owned());
            }
        }
    }
}
