//! The proxy-wasm shell: the root context parses the configuration and defines
//! counters once; the HTTP context moves headers and body bytes between Envoy
//! and [`crate::decide`], and hands the decision back as headers (header path)
//! or filter state (body path). Compiled for wasm only.

use crate::config::{Config, Mode};
use crate::decide::{self, Decision, HeaderOutcome, Reason};
use crate::host;
use crate::markers;
use crate::metrics;
use crate::placement::Placement;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::collections::HashMap;
use std::rc::Rc;

/// Filter-state key read by an `ORIGINAL_DST` cluster.
const ORIGINAL_DST_KEY: &str = "envoy.network.transport_socket.original_dst_address";
/// Filter-state key usable by `hash_policy.filter_state`.
const HASHABLE_KEY: &str = "envoy.hashable_string";

/// Configuration and counters shared by all HTTP contexts of a VM.
struct Shared {
    cfg: Config,
    placement: Placement,
    counters: HashMap<String, u32>,
}

impl Shared {
    fn count(&self, name: &str) {
        if let Some(id) = self.counters.get(name) {
            let _ = host::increment(*id, 1);
        }
    }
}

pub struct Root {
    shared: Option<Rc<Shared>>,
}

impl Root {
    pub fn new() -> Self {
        Self { shared: None }
    }
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let raw = host::get_buffer(BufferType::PluginConfiguration, 0, size).unwrap_or_default();
        let cfg = match Config::parse(&raw) {
            Ok(c) => c,
            Err(e) => {
                host::log(
                    LogLevel::Error,
                    &format!("tether: invalid configuration: {e}"),
                );
                return false;
            }
        };
        let mut counters = HashMap::new();
        for name in metrics::all_names(&cfg) {
            match host::define_counter(&name) {
                Ok(id) => {
                    counters.insert(name, id);
                }
                Err(s) => host::log(
                    LogLevel::Warn,
                    &format!("tether: cannot define counter {name}: status {}", s.0),
                ),
            }
        }
        let placement = Placement::new(&cfg.endpoints);
        self.shared = Some(Rc::new(Shared {
            cfg,
            placement,
            counters,
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = self.shared.clone()?;
        Some(Box::new(Http {
            shared,
            state: State::Idle,
            headers: Vec::new(),
            decision: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

enum State {
    Idle,
    /// Waiting for the whole body; `size` = bytes buffered so far.
    ReadBody {
        api: crate::api::Api,
        reason: Option<Reason>,
        size: usize,
    },
    Done,
}

struct Http {
    shared: Rc<Shared>,
    state: State,
    headers: Vec<(String, Vec<u8>)>,
    decision: Option<Decision>,
}

impl Context for Http {}

impl Http {
    fn note(&self, d: &Decision) {
        let s = &self.shared;
        s.count(if d.header_path {
            "tether_requests_header_path"
        } else {
            "tether_requests_body_path"
        });
        match &d.identity.source {
            crate::identity::KeySource::Fallback(r) => {
                s.count(&metrics::key_source("fallback"));
                s.count(&metrics::fallback(*r));
            }
            _ => s.count(&metrics::key_source(&d.source)),
        }
        for _ in 0..d.bad_headers {
            s.count("tether_bad_header");
        }
        if !d.header_path && d.turn.is_some() && !d.stats.full {
            s.count("tether_turn_not_counted");
        }
        if d.stats.middle {
            s.count("tether_body_middle_read");
        }
        if let Some(e) = d
            .pick
            .as_ref()
            .and_then(|p| p.order.first())
            .and_then(|i| s.placement.endpoints().get(*i))
        {
            s.count(&metrics::pick(&e.address));
        }
    }

    /// Header path: the request headers are still open for writes. Internal
    /// headers were stripped, so they are appended; `x-session-id` may be a
    /// client input and is replaced.
    fn emit_headers(&self, d: &Decision) {
        for (name, value) in markers::request_headers(&self.shared.cfg, &self.shared.placement, d) {
            let set = if name == markers::names::SESSION_ID {
                host::replace_header
            } else {
                host::add_header
            };
            if set(MapType::HttpRequestHeaders, name, value.as_bytes()).is_err() {
                self.shared.count("tether_host_error");
            }
        }
    }

    /// Body path: headers are gone upstream-side; hand values over as filter state.
    fn emit_state(&self, d: &Decision) {
        let s = &self.shared;
        let outputs = markers::request_headers(&s.cfg, &s.placement, d);
        for (name, value) in &outputs {
            if host::set_property(&markers::state_key(name), value.as_bytes()).is_err() {
                s.count("tether_host_error");
            }
        }
        let fs = match s.cfg.mode {
            Mode::Hash => Some((HASHABLE_KEY, crate::identity::hex16(d.identity.key()))),
            Mode::Pick => d
                .pick
                .as_ref()
                .and_then(|p| p.order.first())
                .and_then(|i| s.placement.endpoints().get(*i))
                .map(|e| (ORIGINAL_DST_KEY, e.address.clone())),
        };
        if let Some((k, v)) = fs
            && host::set_envoy_filter_state(k, &v).is_err()
        {
            s.count("tether_host_error");
        }
        if let Some(edit) = &d.edit {
            match host::set_buffer(BufferType::HttpRequestBody, 0, edit.len, &edit.data) {
                Ok(()) => s.count("tether_body_rewritten"),
                Err(_) => s.count("tether_host_error"),
            }
        }
    }

    fn body_fallback(&mut self, api: crate::api::Api, reason: Reason) -> Action {
        let prefix = host::get_buffer(
            BufferType::HttpRequestBody,
            0,
            crate::identity::FALLBACK_PREFIX,
        )
        .unwrap_or_default();
        let s = Rc::clone(&self.shared);
        let d = decide::fallback(&s.cfg, &s.placement, api, &self.headers, &prefix, reason);
        if self.finish_body(d) {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    /// Hands a body-path decision to Envoy; false when the request was refused.
    fn finish_body(&mut self, d: Decision) -> bool {
        self.state = State::Done;
        if let Some((status, text)) = d.reject {
            self.shared.count("tether_rejected");
            if host::send_local_response(status, "tether_body_not_salted", text).is_err() {
                self.shared.count("tether_host_error");
            }
            self.decision = Some(d);
            return false;
        }
        self.emit_state(&d);
        self.note(&d);
        self.decision = Some(d);
        true
    }

    /// The body decision once the whole body is buffered (end of stream or trailers).
    fn decide_body(
        &mut self,
        api: crate::api::Api,
        reason: Option<Reason>,
        body_size: usize,
    ) -> Action {
        let s = Rc::clone(&self.shared);
        let mut fetch = |start: usize, len: usize| {
            host::get_buffer(BufferType::HttpRequestBody, start, len).ok()
        };
        let d = decide::on_body(
            &s.cfg,
            &s.placement,
            api,
            &self.headers,
            body_size,
            reason,
            &mut fetch,
        );
        if self.finish_body(d) {
            Action::Continue
        } else {
            Action::Pause
        }
    }
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let s = Rc::clone(&self.shared);
        self.headers = host::header_pairs(MapType::HttpRequestHeaders).unwrap_or_default();
        // Anti-spoofing: nothing a client sends may pass for our own outputs.
        self.headers.retain(|(name, _)| {
            if decide::is_internal_header(name) {
                if host::remove_header(MapType::HttpRequestHeaders, name).is_err() {
                    s.count("tether_host_error");
                }
                s.count("tether_spoofed_header_removed");
                false
            } else {
                true
            }
        });
        match decide::on_headers(&s.cfg, &s.placement, &self.headers, end_of_stream) {
            HeaderOutcome::Untouched => {
                s.count("tether_requests_untouched");
                s.count(&metrics::fallback(Reason::UnknownFormat));
                self.state = State::Done;
            }
            HeaderOutcome::Decided(d) => {
                self.emit_headers(&d);
                self.note(&d);
                self.decision = Some(*d);
                self.state = State::Done;
            }
            HeaderOutcome::ReadBody { api, reason } => {
                if s.cfg.rewrites_body()
                    && host::remove_header(MapType::HttpRequestHeaders, "content-length").is_err()
                {
                    s.count("tether_host_error");
                }
                self.state = State::ReadBody {
                    api,
                    reason,
                    size: 0,
                };
            }
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let State::ReadBody { api, reason, .. } = self.state else {
            return Action::Continue;
        };
        if body_size > self.shared.cfg.max_body_bytes {
            return self.body_fallback(api, Reason::TooLarge);
        }
        if !end_of_stream {
            self.state = State::ReadBody {
                api,
                reason,
                size: body_size,
            };
            return Action::Pause;
        }
        self.decide_body(api, reason, body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // Trailers end the stream without a body callback marked end of stream.
        let State::ReadBody { api, reason, size } = self.state else {
            return Action::Continue;
        };
        self.decide_body(api, reason, size)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if self.shared.cfg.debug_header
            && let Some(d) = &self.decision
        {
            let v = markers::debug_value(&self.shared.placement, d);
            if host::replace_header(
                MapType::HttpResponseHeaders,
                markers::names::DEBUG,
                v.as_bytes(),
            )
            .is_err()
            {
                self.shared.count("tether_host_error");
            }
        }
        Action::Continue
    }
}
