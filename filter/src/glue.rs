//! The proxy-wasm shell: the root context parses the configuration and defines
//! counters once; the HTTP context moves headers and body bytes between Envoy
//! and [`crate::decide`], and hands the decision back as headers (header path)
//! or filter state (body path). Compiled for wasm only.
//!
//! The header path is kept to the host calls it needs: one read of the whole
//! header map, a remove only for internal headers actually sent, one set per
//! output header and one increment per counter, by ids resolved at configure
//! time. Nothing is kept for the later callbacks unless they use it.

use crate::config::{Config, Mode};
use crate::decide::{self, Decision, HeaderOutcome, Reason};
use crate::host;
use crate::identity::KeySource;
use crate::markers;
use crate::metrics::{self, CounterIds, Fixed};
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
    counters: CounterIds,
    /// The only headers copied out of Envoy.
    read_headers: decide::ReadHeaders,
}

impl Shared {
    fn count(&self, id: Option<u32>) {
        if let Some(id) = id {
            let _ = host::increment(id, 1);
        }
    }

    fn count_fixed(&self, f: Fixed) {
        self.count(self.counters.fixed(f));
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
        let mut defined = HashMap::new();
        for name in metrics::all_names(&cfg) {
            match host::define_counter(&name) {
                Ok(id) => {
                    defined.insert(name, id);
                }
                Err(s) => host::log(
                    LogLevel::Warn,
                    &format!("tether: cannot define counter {name}: status {}", s.0),
                ),
            }
        }
        let counters = CounterIds::new(&cfg, |name| defined.get(name).copied());
        let placement = Placement::new(&cfg.endpoints);
        let read_headers = decide::ReadHeaders::new(&cfg);
        self.shared = Some(Rc::new(Shared {
            read_headers,
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
        let c = &s.counters;
        s.count_fixed(if d.header_path {
            Fixed::HeaderPath
        } else {
            Fixed::BodyPath
        });
        match &d.identity.source {
            KeySource::Fallback(r) => {
                s.count(c.fallback_source);
                s.count(c.fallback(*r));
            }
            KeySource::Head => s.count(c.head),
            KeySource::Source(i) => s.count(c.source.get(*i).copied().flatten()),
        }
        for _ in 0..d.bad_headers {
            s.count_fixed(Fixed::BadHeader);
        }
        if !d.header_path && d.turn.is_some() && !d.stats.full {
            s.count_fixed(Fixed::TurnNotCounted);
        }
        if d.stats.middle {
            s.count_fixed(Fixed::BodyMiddleRead);
        }
        if let Some(i) = d.pick.as_ref().and_then(|p| p.order.first()) {
            s.count(c.pick.get(*i).copied().flatten());
        }
    }

    /// Header path: the request headers are still open for writes. Internal
    /// headers were stripped, so they are appended; `x-session-id` may be a
    /// client input and is replaced.
    fn emit_headers(&self, d: &Decision) {
        let s = &self.shared;
        markers::for_each_request_header(&s.cfg, &s.placement, d, |name, value| {
            let set = if name == markers::names::SESSION_ID {
                host::replace_header
            } else {
                host::add_header
            };
            if set(MapType::HttpRequestHeaders, name, value).is_err() {
                s.count_fixed(Fixed::HostError);
            }
        });
    }

    /// Body path: headers are gone upstream-side; hand values over as filter state.
    fn emit_state(&self, d: &Decision) {
        let s = &self.shared;
        let outputs = markers::request_headers(&s.cfg, &s.placement, d);
        for (name, value) in &outputs {
            if host::set_property(&markers::state_key(name), value.as_bytes()).is_err() {
                s.count_fixed(Fixed::HostError);
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
            s.count_fixed(Fixed::HostError);
        }
        if let Some(edit) = &d.edit {
            match host::set_buffer(BufferType::HttpRequestBody, 0, edit.len, &edit.data) {
                Ok(()) => s.count_fixed(Fixed::BodyRewritten),
                Err(_) => s.count_fixed(Fixed::HostError),
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
            self.shared.count_fixed(Fixed::Rejected);
            if host::send_local_response(status, "tether_body_not_salted", text).is_err() {
                self.shared.count_fixed(Fixed::HostError);
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
        // One host call for the whole map; stripping and identity work on this copy.
        // Only the headers the decision reads are copied, plus internal ones to strip.
        let keep =
            |name: &[u8]| s.read_headers.contains(name) || decide::is_internal_header_bytes(name);
        let mut headers = host::header_pairs(MapType::HttpRequestHeaders, keep).unwrap_or_default();
        // Anti-spoofing: nothing a client sends may pass for our own outputs.
        // Normally none is present, so this costs no host call.
        headers.retain(|(name, _)| {
            if decide::is_internal_header(name) {
                if host::remove_header(MapType::HttpRequestHeaders, name).is_err() {
                    s.count_fixed(Fixed::HostError);
                }
                s.count_fixed(Fixed::SpoofedHeaderRemoved);
                false
            } else {
                true
            }
        });
        match decide::on_headers(&s.cfg, &s.placement, &headers, end_of_stream) {
            HeaderOutcome::Untouched => {
                s.count_fixed(Fixed::Untouched);
                s.count(s.counters.fallback(Reason::UnknownFormat));
                self.state = State::Done;
            }
            HeaderOutcome::Decided(d) => {
                self.emit_headers(&d);
                self.note(&d);
                // Only the debug response header looks at it again.
                if s.cfg.debug_header {
                    self.decision = Some(*d);
                }
                self.state = State::Done;
            }
            HeaderOutcome::ReadBody { api, reason } => {
                // The body decision still needs the (stripped) request headers.
                self.headers = headers;
                if s.cfg.rewrites_body()
                    && host::remove_header(MapType::HttpRequestHeaders, "content-length").is_err()
                {
                    s.count_fixed(Fixed::HostError);
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
                self.shared.count_fixed(Fixed::HostError);
            }
        }
        Action::Continue
    }
}
