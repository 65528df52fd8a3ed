//! The proxy-wasm shell: the root context parses the configuration and defines
//! counters once; the HTTP context moves headers and body bytes between Envoy
//! and [`crate::decide`], and hands the decision back as headers (header path)
//! or filter state (body path). Compiled for wasm only.
//!
//! The header path is kept to the host calls it needs: one read of the whole
//! header map, a remove only for internal headers actually sent, one set per
//! output header and one increment per counter, by ids resolved at configure
//! time. Nothing is kept for the later callbacks unless they use it.

use crate::config::Config;
use crate::decide::{self, Decision, HeaderOutcome, Reason};
use crate::host;
use crate::identity::KeySource;
use crate::load_view::LoadView;
use crate::markers;
use crate::metrics::{self, CounterIds, Fixed};
use crate::outputs::{HASHABLE_KEY, ORIGINAL_DST_KEY, Output};
use crate::placement::Placement;
use crate::poller::Poller;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Configuration and counters shared by all HTTP contexts of a VM.
struct Shared {
    cfg: Config,
    placement: Placement,
    counters: CounterIds,
    /// The only headers copied out of Envoy.
    read_headers: decide::ReadHeaders,
    /// Counts not yet handed to Envoy: (metric id, count).
    pending: std::cell::RefCell<Vec<(u32, i64)>>,
    /// P/D: the prefill pool.
    prefill: Option<Placement>,
    /// Load-aware pick: this VM's copy of the polled view (the root's poller writes it).
    view: Rc<RefCell<LoadView>>,
    /// Pick mode: this VM's ejection table, fed by the response path.
    health: RefCell<crate::eject::Health>,
    #[cfg(feature = "phase-timing")]
    timings: crate::timing::Log,
}

impl Shared {
    /// Counts in the VM: a request makes no counter host call; the root
    /// context's tick hands the sums to Envoy ([`COUNTER_FLUSH`]).
    fn count(&self, id: Option<u32>) {
        if let Some(id) = id {
            let mut pending = self.pending.borrow_mut();
            match pending.iter_mut().find(|(i, _)| *i == id) {
                Some((_, n)) => *n += 1,
                None => pending.push((id, 1)),
            }
        }
    }

    /// Hands the counts gathered since the last flush to Envoy.
    fn flush_counters(&self) {
        let mut pending = self.pending.borrow_mut();
        for (id, n) in pending.iter_mut().filter(|(_, n)| *n > 0) {
            if host::increment(*id, *n).is_ok() {
                *n = 0;
            }
        }
    }

    fn count_fixed(&self, f: Fixed) {
        self.count(self.counters.fixed(f));
    }

    /// Ejections, load view and P/D on top of the rendezvous pick ([`crate::placer`]).
    fn refine(&self, d: &mut Decision) {
        self.skip_ejected(d);
        if self.cfg.load.is_none() && self.cfg.pd.is_none() {
            return;
        }
        let now = if self.cfg.load.is_some() {
            host::now_ms().unwrap_or(0)
        } else {
            0
        };
        let empty = LoadView::default();
        let view = self.view.try_borrow();
        let view = view.as_deref().unwrap_or(&empty);
        crate::placer::refine(
            &self.cfg,
            &self.placement,
            self.prefill.as_ref(),
            view,
            now,
            d,
        );
        if d.spilled {
            self.count_fixed(Fixed::LoadSpilled);
        }
        if self.cfg.pd.is_some() && !d.header_path && d.pick.is_some() {
            self.count_fixed(if d.prefiller.is_some() {
                Fixed::PdDisaggregated
            } else {
                Fixed::PdLocal
            });
        }
    }
}

impl Shared {
    /// An ejected primary: the key's healthy fallbacks first ([`crate::eject`]).
    /// Not when the DP rank is already written into the body and would change.
    fn skip_ejected(&self, d: &mut Decision) {
        let Some(pick) = d.pick.as_mut() else {
            return;
        };
        let health = self.health.borrow();
        // Nothing ever ejected (the normal case): no clock read.
        if !health.ever_ejected() {
            return;
        }
        let now = host::now_ms().unwrap_or(0);
        let Some(&first) = pick.order.first() else {
            return;
        };
        if !health.ejected(first, now) {
            return;
        }
        let mut moved = pick.clone();
        if health.reorder(&self.placement, d.identity.key(), &mut moved, now)
            && !(d.edit.is_some() && moved.rank != pick.rank)
        {
            *pick = moved;
            drop(health);
            self.count_fixed(Fixed::PrimaryEjected);
        }
    }

    /// The response path: which endpoint answered, after how many attempts,
    /// with what status — fed to the ejection table.
    fn observe(&self, first: usize) {
        let wanted = |n: &[u8]| n == b":status" || n == b"x-envoy-attempt-count";
        let headers = host::header_pairs(MapType::HttpResponseHeaders, wanted).unwrap_or_default();
        let number = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        let status = number(":status").unwrap_or(0);
        let attempts = number("x-envoy-attempt-count").unwrap_or(1);
        let served = host::get_property(&["upstream", "address"])
            .ok()
            .flatten()
            .and_then(|a| crate::eject::Health::index_of(&self.placement, &a));
        let now = host::now_ms().unwrap_or(0);
        let outcome =
            self.health
                .borrow_mut()
                .record(&self.cfg.eject, first, served, attempts, status, now);
        if outcome.served_by_fallback {
            self.count_fixed(Fixed::ServedByFallback);
        }
        if outcome.ejected {
            self.count_fixed(Fixed::EndpointEjected);
        }
    }
}

/// How often counts kept in the VM reach Envoy's stats.
const COUNTER_FLUSH: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Root {
    shared: Option<Rc<Shared>>,
    poller: Option<Poller>,
}

impl Root {
    pub fn new() -> Self {
        Self {
            shared: None,
            poller: None,
        }
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let (Some(p), Some(s)) = (self.poller.as_mut(), self.shared.as_ref()) else {
            return;
        };
        p.response(token_id, body_size, &|f| s.count_fixed(f));
    }
}

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
        let prefill = cfg.pd.as_ref().map(|pd| Placement::new(&pd.prefill));
        let targets: Vec<String> = cfg
            .endpoints
            .iter()
            .chain(cfg.pd.iter().flat_map(|pd| &pd.prefill))
            .map(|e| e.address.clone())
            .collect();
        let view = Rc::new(RefCell::new(LoadView::new(targets.len())));
        // One tick drives both the counter flush and, with `load`, the polls.
        let mut tick = COUNTER_FLUSH;
        self.poller = cfg.load.as_ref().map(|lc| {
            tick = tick.min(std::time::Duration::from_millis(lc.poll_ms));
            Poller::new(lc.clone(), targets, Rc::clone(&view))
        });
        if host::set_tick_period(u32::try_from(tick.as_millis()).unwrap_or(u32::MAX)).is_err() {
            host::log(LogLevel::Error, "tether: cannot start the tick");
            return false;
        }
        self.shared = Some(Rc::new(Shared {
            read_headers,
            prefill,
            view,
            pending: std::cell::RefCell::new(Vec::new()),
            health: RefCell::new(crate::eject::Health::new(cfg.endpoints.len())),
            cfg,
            placement,
            counters,
            #[cfg(feature = "phase-timing")]
            timings: crate::timing::Log::default(),
        }));
        true
    }

    fn on_tick(&mut self) {
        if let Some(s) = &self.shared {
            if let Some(p) = self.poller.as_mut() {
                p.tick(&|f| s.count_fixed(f));
            }
            s.flush_counters();
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = self.shared.clone()?;
        Some(Box::new(Http {
            shared,
            state: State::Idle,
            headers: Vec::new(),
            decision: None,
            first: None,
            #[cfg(feature = "phase-timing")]
            clock: None,
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
    /// Pick mode: the endpoint listed first, for the response path.
    first: Option<usize>,
    /// Diagnostic builds: the clock of the body decision being timed, and
    /// which lap closed each step (scan … rewrite, emit, count).
    #[cfg(feature = "phase-timing")]
    clock: Option<(std::cell::RefCell<crate::timing::Clock>, [Option<usize>; 8])>,
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
        if !d.header_path && d.turn.is_some() && !d.stats.full && s.cfg.outputs.has(Output::Turn) {
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
        self.emit_filter_state(d);
    }

    /// The filter-state outputs (both paths): the routing key for a
    /// `hash_policy` on filter state, the primary endpoint for `ORIGINAL_DST`.
    fn emit_filter_state(&self, d: &Decision) {
        let s = &self.shared;
        if s.cfg.outputs.has(Output::HashableString)
            && host::set_envoy_filter_state(HASHABLE_KEY, &crate::identity::hex16(d.identity.key()))
                .is_err()
        {
            s.count_fixed(Fixed::HostError);
        }
        if s.cfg.outputs.has(Output::OriginalDst)
            && let Some(e) = d
                .pick
                .as_ref()
                .and_then(|p| p.order.first())
                .and_then(|i| s.placement.endpoints().get(*i))
            && host::set_envoy_filter_state(ORIGINAL_DST_KEY, &e.address).is_err()
        {
            s.count_fixed(Fixed::HostError);
        }
    }

    /// Body path: headers are gone upstream-side; hand values over as filter state.
    fn emit_state(&self, d: &Decision) {
        let s = &self.shared;
        markers::for_each_request_header(&s.cfg, &s.placement, d, |name, value| {
            if host::set_property(&markers::state_key(name), value).is_err() {
                s.count_fixed(Fixed::HostError);
            }
        });
        self.emit_filter_state(d);
        if let Some(edit) = &d.edit {
            match host::set_buffer(BufferType::HttpRequestBody, 0, edit.len, &edit.data) {
                Ok(()) => {
                    s.count_fixed(Fixed::BodyRewritten);
                    if d.spoofed_markers {
                        s.count_fixed(Fixed::SpoofedBodyMarkerRemoved);
                    }
                }
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
    fn finish_body(&mut self, mut d: Decision) -> bool {
        self.state = State::Done;
        if d.reject.is_none() {
            self.shared.refine(&mut d);
            self.first = d.pick.as_ref().and_then(|p| p.order.first().copied());
        }
        if let Some((status, text)) = d.reject {
            self.shared.count_fixed(Fixed::Rejected);
            if host::send_local_response(status, "tether_body_not_rewritten", text).is_err() {
                self.shared.count_fixed(Fixed::HostError);
            }
            self.decision = Some(d);
            return false;
        }
        self.emit_state(&d);
        #[cfg(feature = "phase-timing")]
        self.lap(6);
        self.note(&d);
        #[cfg(feature = "phase-timing")]
        if let Some((clock, mut laps)) = self.clock.take() {
            self.lap_into(&clock, &mut laps, 7);
            let row = clock.into_inner().body_row(&laps);
            self.shared.timings.record(true, row);
        }
        self.decision = Some(d);
        true
    }

    /// Closes step `i` of the body decision being timed.
    #[cfg(feature = "phase-timing")]
    fn lap(&mut self, i: usize) {
        if let Some((clock, mut laps)) = self.clock.take() {
            self.lap_into(&clock, &mut laps, i);
            self.clock = Some((clock, laps));
        }
    }

    #[cfg(feature = "phase-timing")]
    fn lap_into(
        &self,
        clock: &std::cell::RefCell<crate::timing::Clock>,
        laps: &mut [Option<usize>; 8],
        i: usize,
    ) {
        let n = laps.iter().flatten().count();
        clock.borrow_mut().lap();
        if let Some(l) = laps.get_mut(i) {
            *l = Some(n);
        }
    }

    /// The body decision once the whole body is buffered (end of stream or trailers).
    fn decide_body(
        &mut self,
        api: crate::api::Api,
        reason: Option<Reason>,
        body_size: usize,
    ) -> Action {
        let s = Rc::clone(&self.shared);
        #[cfg(not(feature = "phase-timing"))]
        let d = {
            let mut fetch = |start: usize, len: usize| {
                host::get_buffer(BufferType::HttpRequestBody, start, len).ok()
            };
            decide::on_body(
                &s.cfg,
                &s.placement,
                api,
                &self.headers,
                body_size,
                reason,
                &mut fetch,
            )
        };
        #[cfg(feature = "phase-timing")]
        let d = {
            let clock = std::cell::RefCell::new(crate::timing::Clock::start());
            let mut laps = [None; 8];
            let mut n = 0;
            let mut fetch = |start: usize, len: usize| {
                clock
                    .borrow_mut()
                    .fetching(|| host::get_buffer(BufferType::HttpRequestBody, start, len).ok())
            };
            let mut mark = |step: decide::Step| {
                clock.borrow_mut().lap();
                if let Some(l) = laps.get_mut(step as usize) {
                    *l = Some(n);
                }
                n += 1;
            };
            let d = decide::on_body_marked(
                &s.cfg,
                &s.placement,
                api,
                &self.headers,
                body_size,
                reason,
                &mut fetch,
                &mut mark,
            );
            self.clock = Some((clock, laps));
            d
        };
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
        #[cfg(feature = "phase-timing")]
        let mut clock = crate::timing::Clock::start();
        let keep =
            |name: &[u8]| s.read_headers.contains(name) || decide::is_internal_header_bytes(name);
        let mut headers = host::header_pairs(MapType::HttpRequestHeaders, keep).unwrap_or_default();
        #[cfg(feature = "phase-timing")]
        clock.lap();
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
            HeaderOutcome::Decided(mut d) => {
                s.refine(&mut d);
                self.first = d.pick.as_ref().and_then(|p| p.order.first().copied());
                #[cfg(feature = "phase-timing")]
                clock.lap();
                self.emit_headers(&d);
                #[cfg(feature = "phase-timing")]
                clock.lap();
                self.note(&d);
                #[cfg(feature = "phase-timing")]
                {
                    clock.lap();
                    s.timings.record(false, clock.header_row());
                }
                // Only the debug response header looks at it again.
                if s.cfg.outputs.has(Output::Debug) {
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
        if let Some(first) = self.first {
            self.shared.observe(first);
        }
        if self.shared.cfg.outputs.has(Output::Debug)
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
