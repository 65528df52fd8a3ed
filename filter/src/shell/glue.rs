//! The proxy-wasm shell: the root context parses the configuration and defines
//! counters once; the HTTP context hands headers, body bytes and the load-view
//! snapshot to [`crate::decide`] and applies the plan it returns — as headers
//! (header path) or filter state (body path), a body edit, counters, or a
//! local reply. Compiled for wasm only.
//!
//! The header path is kept to the host calls it needs: one read of the whole
//! header map, a remove only for internal headers actually sent, one set per
//! output header and one increment per counter, by ids resolved at configure
//! time. Nothing is kept for the later callbacks unless they use it.

use super::answer::Answer;
use super::chain_store;
use super::host;
use super::poller::{Poller, ResidencyPoll};
use super::timing::{Log, Probe};
use crate::api::Api;
use crate::config::Config;
use crate::config::outputs::Output;
use crate::decide::{self, BodyCall, HeaderOutcome};
use crate::emit::Plan;
use crate::emit::markers;
use crate::emit::metrics::{self, Counter, CounterIds, Fixed};
use crate::place::eject::Health;
use crate::place::load_view::LoadView;
use crate::place::residency_view::ResidencyView;
use crate::place::{Pools, Snapshot};
use crate::read::Reason;
use crate::read::header_names::{ReadHeaders, is_internal_header, is_internal_header_bytes};
use crate::step::Step;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Configuration and counters shared by all HTTP contexts of a VM.
struct Shared {
    cfg: Config,
    pools: Pools,
    counters: CounterIds,
    /// The only headers copied out of Envoy.
    read_headers: ReadHeaders,
    /// Counts not yet handed to Envoy: (metric id, count).
    pending: RefCell<Vec<(u32, i64)>>,
    /// Load-aware pick: this VM's copy of the polled view (the root's poller writes it).
    view: Rc<RefCell<LoadView>>,
    /// `residency`: this VM's decoded residency view (the root's poller writes it).
    residency: Rc<RefCell<ResidencyView>>,
    /// Pick mode: this VM's ejection table, fed by the response path.
    health: RefCell<Health>,
    timings: Log,
}

impl Shared {
    /// Counts in the VM: a request makes no counter host call; the root
    /// context's tick hands the sums to Envoy ([`COUNTER_FLUSH`]).
    fn count_id(&self, id: Option<u32>) {
        if let Some(id) = id {
            let mut pending = self.pending.borrow_mut();
            match pending.iter_mut().find(|(i, _)| *i == id) {
                Some((_, n)) => *n += 1,
                None => pending.push((id, 1)),
            }
        }
    }

    fn count(&self, c: Counter) {
        self.count_id(self.counters.id(c));
    }

    fn count_fixed(&self, f: Fixed) {
        self.count(Counter::Fixed(f));
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

    /// Hands the VM's load view, ejection table and the clock to `f` as a
    /// snapshot; the clock is read only when `load` is configured or an
    /// endpoint was ever ejected.
    fn with_snapshot<T>(&self, f: impl FnOnce(Snapshot<'_>) -> T) -> T {
        let health = self.health.try_borrow().ok();
        let health = health.as_deref().filter(|h| h.ever_ejected());
        if self.cfg.load.is_none() && health.is_none() {
            return f(Snapshot::NONE);
        }
        let now_ms = host::now_ms().unwrap_or(0);
        let empty = LoadView::EMPTY;
        let view = self.view.try_borrow().ok();
        let no_residency = ResidencyView::EMPTY;
        let residency = self.residency.try_borrow().ok();
        f(Snapshot {
            view: view.as_deref().unwrap_or(&empty),
            residency: residency.as_deref().unwrap_or(&no_residency),
            health,
            now_ms,
        })
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
            .and_then(|a| Health::index_of(&self.pools.decode, &a));
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

    /// The plan's filter-state objects (both paths).
    fn apply_filter_state(&self, plan: &Plan) {
        plan.for_each_filter_state(&self.cfg, &self.pools, |key, value| {
            if host::set_envoy_filter_state(key, value).is_err() {
                self.count_fixed(Fixed::HostError);
            }
        });
    }

    fn note(&self, plan: &Plan) {
        plan.for_each_counter(&self.cfg, |c| self.count(c));
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
        let counters = define_counters(&cfg);
        let pools = Pools::new(&cfg);
        let targets: Vec<String> = cfg
            .endpoints
            .iter()
            .chain(cfg.pd.iter().flat_map(|pd| &pd.prefill))
            .map(|e| e.address.clone())
            .collect();
        let view = Rc::new(RefCell::new(LoadView::new(targets.len())));
        // One tick drives both the counter flush and, with `load`, the polls.
        let mut tick = COUNTER_FLUSH;
        let residency = Rc::new(RefCell::new(ResidencyView::new(cfg.endpoints.len())));
        self.poller = cfg.load.as_ref().map(|lc| {
            tick = tick.min(std::time::Duration::from_millis(lc.poll_ms));
            let rp = cfg.residency.as_ref().map(|_| ResidencyPoll {
                view: Rc::clone(&residency),
                decode: cfg.endpoints.len(),
            });
            Poller::new(lc.clone(), targets, Rc::clone(&view), rp)
        });
        if host::set_tick_period(u32::try_from(tick.as_millis()).unwrap_or(u32::MAX)).is_err() {
            host::log(LogLevel::Error, "tether: cannot start the tick");
            return false;
        }
        self.shared = Some(Rc::new(Shared {
            read_headers: ReadHeaders::new(&cfg),
            view,
            residency,
            health: RefCell::new(Health::new(cfg.endpoints.len())),
            pending: RefCell::new(Vec::new()),
            cfg,
            pools,
            counters,
            timings: Log::new(),
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
            plan: None,
            first: None,
            chain: None,
            answer: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Defines every counter of `cfg` with the host and resolves their ids.
fn define_counters(cfg: &Config) -> CounterIds {
    let mut defined = HashMap::new();
    for name in metrics::all_names(cfg) {
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
    CounterIds::new(cfg, |name| defined.get(name).copied())
}

enum State {
    Idle,
    /// Waiting for the whole body; `size` = bytes buffered so far.
    ReadBody {
        api: Api,
        reason: Option<Reason>,
        size: usize,
    },
    Done,
}

struct Http {
    shared: Rc<Shared>,
    state: State,
    headers: Vec<(String, Vec<u8>)>,
    plan: Option<Plan>,
    /// Pick mode: the endpoint listed first, for the response path.
    first: Option<usize>,
    /// A Responses request keyed by its head or chain: (tenant, session)
    /// its answer's id carries on.
    chain: Option<(Vec<u8>, Vec<u8>)>,
    /// That answer, from its headers on.
    answer: Option<Answer>,
}

impl Context for Http {}

impl Http {
    /// Header path: the request headers are still open for writes. Internal
    /// headers were stripped, so they are appended; `x-session-id` may be a
    /// client input and is replaced.
    fn apply_headers(&self, plan: &Plan) {
        let s = &self.shared;
        plan.for_each_header(&s.cfg, &s.pools, |name, value| {
            let set = if name == markers::names::SESSION_ID {
                host::replace_header
            } else {
                host::add_header
            };
            if set(MapType::HttpRequestHeaders, name, value).is_err() {
                s.count_fixed(Fixed::HostError);
            }
        });
        s.apply_filter_state(plan);
    }

    /// Body path: headers are gone upstream-side; hand values over as filter
    /// state, and the body edit.
    fn apply_state(&self, plan: &Plan) {
        let s = &self.shared;
        plan.for_each_header(&s.cfg, &s.pools, |name, value| {
            if host::set_property(&markers::state_key(name), value).is_err() {
                s.count_fixed(Fixed::HostError);
            }
        });
        s.apply_filter_state(plan);
        if let Some(edit) = &plan.edit {
            match host::set_buffer(BufferType::HttpRequestBody, 0, edit.len, &edit.data) {
                Ok(()) => {
                    s.count_fixed(Fixed::BodyRewritten);
                    if plan.read.chain.unwrap.is_some() {
                        s.count_fixed(Fixed::ChainUnwrapped);
                    }
                    if plan.spoofed_markers {
                        s.count_fixed(Fixed::SpoofedBodyMarkerRemoved);
                    }
                }
                Err(_) => s.count_fixed(Fixed::HostError),
            }
        }
    }

    fn body_fallback(&mut self, api: Api, reason: Reason) -> Action {
        let prefix = host::get_buffer(
            BufferType::HttpRequestBody,
            0,
            crate::read::identity::FALLBACK_PREFIX,
        )
        .unwrap_or_default();
        let s = Rc::clone(&self.shared);
        let plan = s.with_snapshot(|snap| {
            decide::fallback(&s.cfg, &s.pools, snap, api, &self.headers, &prefix, reason)
        });
        self.finish_body(plan, Probe::start())
    }

    /// Applies a body-path plan: a refusal, or filter state and the edit.
    fn finish_body(&mut self, plan: Plan, probe: Probe) -> Action {
        self.state = State::Done;
        let s = Rc::clone(&self.shared);
        if let Some((status, text)) = plan.reject {
            s.note(&plan);
            if host::send_local_response(status, "tether_body_not_rewritten", text).is_err() {
                s.count_fixed(Fixed::HostError);
            }
            self.plan = Some(plan);
            return Action::Pause;
        }
        self.first = plan.placed.primary();
        self.chain = plan
            .read
            .chain_session(&s.cfg)
            .map(|session| (plan.read.identity.tenant.clone(), session.to_vec()));
        self.apply_state(&plan);
        probe.mark(Step::Apply);
        s.note(&plan);
        probe.mark(Step::Count);
        probe.record(&s.timings, true);
        self.plan = Some(plan);
        Action::Continue
    }

    /// The body decision once the whole body is buffered (end of stream or trailers).
    fn decide_body(&mut self, api: Api, reason: Option<Reason>, size: usize) -> Action {
        let s = Rc::clone(&self.shared);
        let probe = Probe::start();
        let mut fetch = |start: usize, len: usize| {
            probe.fetching(|| host::get_buffer(BufferType::HttpRequestBody, start, len).ok())
        };
        let chains = chain_store::table_for(s.cfg.chains, api);
        let call = BodyCall {
            reason,
            chains: &chains,
            ..BodyCall::new(api, &self.headers, size)
        };
        let plan = s.with_snapshot(|snap| {
            decide::on_body(&s.cfg, &s.pools, snap, call, &mut fetch, &mut |step| {
                probe.mark(step)
            })
        });
        self.finish_body(plan, probe)
    }
}

impl HttpContext for Http {
    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(answer) = self.answer.as_mut() else {
            return Action::Continue;
        };
        let s = &self.shared;
        let (action, done) = answer.chunk(s.cfg.chains, body_size, end_of_stream, &|f| {
            s.count_fixed(f)
        });
        if done {
            self.answer = None;
        }
        action
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if let Some(mut answer) = self.answer.take() {
            let s = &self.shared;
            answer.trailers(&|f| s.count_fixed(f));
        }
        Action::Continue
    }

    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let s = Rc::clone(&self.shared);
        let probe = Probe::start();
        // One host call for the whole map; stripping and identity work on this copy.
        // Only the headers the decision reads are copied, plus internal ones to strip.
        let keep = |name: &[u8]| s.read_headers.contains(name) || is_internal_header_bytes(name);
        let mut headers = host::header_pairs(MapType::HttpRequestHeaders, keep).unwrap_or_default();
        probe.lap();
        // Anti-spoofing: nothing a client sends may pass for our own outputs.
        // Normally none is present, so this costs no host call.
        headers.retain(|(name, _)| {
            if is_internal_header(name) {
                if host::remove_header(MapType::HttpRequestHeaders, name).is_err() {
                    s.count_fixed(Fixed::HostError);
                }
                s.count_fixed(Fixed::SpoofedHeaderRemoved);
                false
            } else {
                true
            }
        });
        let outcome = s.with_snapshot(|snap| {
            decide::on_headers(&s.cfg, &s.pools, snap, &headers, end_of_stream)
        });
        match outcome {
            HeaderOutcome::Untouched => {
                s.count_fixed(Fixed::Untouched);
                s.count(Counter::Fallback(Reason::UnknownFormat));
                self.state = State::Done;
            }
            HeaderOutcome::Decided(plan) => {
                self.first = plan.placed.primary();
                probe.lap();
                self.apply_headers(&plan);
                probe.lap();
                s.note(&plan);
                probe.lap();
                probe.record(&s.timings, false);
                // Only the debug response header looks at it again.
                if s.cfg.outputs.has(Output::Debug) {
                    self.plan = Some(*plan);
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

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if let Some(first) = self.first {
            self.shared.observe(first);
        }
        // Only a successful answer has a response id to continue from.
        if let Some((tenant, session)) = self.chain.take() {
            let s = &self.shared;
            self.answer = Answer::start(s.cfg.chains, tenant, session, end_of_stream, &|f| {
                s.count_fixed(f)
            });
        }
        if self.shared.cfg.outputs.has(Output::Debug)
            && let Some(plan) = &self.plan
        {
            let v = plan.debug_value(&self.shared.pools);
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
