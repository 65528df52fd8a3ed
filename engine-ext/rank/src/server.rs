//! The HTTP shell: hyper over tokio around the pure engines. One driver task
//! per DP rank advances its [`Engine`] to the simulated clock and hands events
//! to the waiting handlers; handlers parse, submit, and render replies.
//!
//! Causality at any `--speedup`: a request is stamped with the simulated time
//! at which it reaches its engine (under the engine's lock), an engine step
//! begun at `t` only sees requests stamped by `t`, and the driver never runs
//! the engine past the current simulated time. OS scheduling delays therefore
//! only delay delivery in wall time; the simulated latencies reported in the
//! `usage.tether` extension and the `x-tether-sim-*` headers are the model's.

use crate::clock::SimClock;
use crate::config::{RankConfig, Role};
use crate::engine::{ContextLimit, Engine, Event, Outcome, SimRequest};
use crate::latency::LatencyModel;
use crate::load::{LoadReport, RankLoad, rank_load};
use crate::metrics::{self, EngineMetrics, RankView};
use crate::pd;
use crate::reply::{self, Meta, headers as rh};
use crate::request::{self, BadReason, Refusal};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tether_engine::{BlockHasher, RequestKeys};
use tether_placement::{Held, Resident, resident_key};
use tether_wire::Api;
use tether_wire::TurnMarker;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

mod rebalance;
mod state_pull;

struct Core {
    engine: Engine,
    subs: HashMap<u64, mpsc::UnboundedSender<Event>>,
    events: Vec<Event>,
}

struct Slot {
    core: Mutex<Core>,
    wake: Notify,
}

/// A running rank process: configuration, clock and one engine per DP rank.
pub struct Rank {
    cfg: RankConfig,
    clock: SimClock,
    slots: Vec<Slot>,
    hasher: BlockHasher,
    next_id: AtomicU64,
    nonce: u64,
    bad: [AtomicU64; BadReason::ALL.len()],
    config_json: Bytes,
    /// `x-tether-rank` on every generation response (`--rank-id`).
    id_header: Option<HeaderValue>,
    /// Decode role: the client of prefill legs, and their outcomes.
    legs: pd::LegClient,
    legs_sent: AtomicU64,
    legs_failed: AtomicU64,
    /// State pull: the leases this rank grants as a holder, and the outcomes
    /// of the pulls it makes as a new home (`crate::pull::Outcome::ALL` order).
    leases: crate::pull::Leases,
    pulls: [AtomicU64; crate::pull::Outcome::ALL.len()],
    /// Rebalancing in tool gaps (`--rebalance`), and its counters.
    rebalance: Option<crate::rebalance::Rebalancer>,
    rebalanced: crate::rebalance::Counters,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rank")
            .field("dp_size", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Rank {
    /// Whether `id` is a Responses id this process answered: ids are
    /// `resp_` + 16 hex of (number ^ this process's nonce), so another rank's
    /// id (another nonce) or a made-up one decodes to no number issued here.
    fn answered(&self, id: &str) -> bool {
        id.strip_prefix("resp_")
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .is_some_and(|v| (1..self.next_id.load(Ordering::Relaxed)).contains(&(v ^ self.nonce)))
    }
}

fn lock(slot: &Slot) -> MutexGuard<'_, Core> {
    // A panic while holding the lock is a bug; keep serving with the state as left.
    slot.core.lock().unwrap_or_else(|p| p.into_inner())
}

impl Rank {
    /// Builds the engines; the simulated clock starts now.
    pub fn new(cfg: RankConfig) -> anyhow::Result<Arc<Self>> {
        let mut slots = Vec::with_capacity(cfg.args.dp_size);
        for _ in 0..cfg.args.dp_size {
            let engine = Engine::try_new(cfg.engine(), LatencyModel::new(cfg.profile.clone()))?;
            slots.push(Slot {
                core: Mutex::new(Core {
                    engine,
                    subs: HashMap::new(),
                    events: Vec::new(),
                }),
                wake: Notify::new(),
            });
        }
        let hasher = BlockHasher::try_new(cfg.args.block_size)
            .ok_or_else(|| anyhow::anyhow!("--block-size must be at least 1"))?;
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            .rotate_left(32);
        let config_json = Bytes::from(serde_json::to_vec(&cfg.describe())?);
        let leases = crate::pull::Leases::new(
            std::time::Duration::from_millis(cfg.args.pull_lease_ms),
            nonce,
        );
        let rebalance = crate::rebalance::Rebalancer::new(&cfg)?;
        let id_header = cfg
            .args
            .rank_id
            .as_deref()
            .and_then(|id| HeaderValue::from_str(id).ok());
        Ok(Arc::new(Self {
            clock: SimClock::start(cfg.args.speedup),
            cfg,
            slots,
            hasher,
            next_id: AtomicU64::new(1),
            nonce,
            bad: std::array::from_fn(|_| AtomicU64::new(0)),
            config_json,
            id_header,
            legs: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http(),
            legs_sent: AtomicU64::new(0),
            legs_failed: AtomicU64::new(0),
            leases,
            pulls: std::array::from_fn(|_| AtomicU64::new(0)),
            rebalance,
            rebalanced: crate::rebalance::Counters::default(),
        }))
    }

    /// Names this rank on a response (`x-tether-rank`).
    fn identify<B>(&self, r: &mut Response<B>) {
        if let Some(v) = &self.id_header {
            r.headers_mut().insert(rh::RANK, v.clone());
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RankConfig {
        &self.cfg
    }

    fn count(&self, r: BadReason) {
        if let Some(c) = BadReason::ALL.iter().position(|x| *x == r) {
            self.bad[c].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The load report (`GET /load`), with the residency summary: every
    /// retention on every DP rank's device and host tier and, with
    /// `--residency-from admission`, every admitted request's key (waiting or
    /// running, its prompt's full blocks, on the device); a key listed more
    /// than once lists its largest state, on the device when any copy is.
    pub fn load(&self) -> LoadReport {
        let max = self.cfg.args.residency_entries;
        let admitted = self.cfg.args.residency_from == "admission";
        let mut held: HashMap<u64, Held> = HashMap::new();
        let now = self.clock.now_ms();
        let ranks: Vec<RankLoad> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let c = lock(s);
                if max > 0 {
                    let in_flight = c
                        .engine
                        .in_flight_keys()
                        .filter(|_| admitted)
                        .map(|(k, t)| (k, t as u64, true));
                    for (k, tokens, device) in c.engine.cache().retained().chain(in_flight) {
                        let key = resident_key(k.tenant.0, k.session.0, k.subagent.0);
                        let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
                        let e = held.entry(key).or_insert(Held { tokens, device });
                        e.tokens = e.tokens.max(tokens);
                        e.device |= device;
                    }
                }
                rank_load(i, &c.engine.gauges_at(now))
            })
            .collect();
        let residency = (max > 0).then(|| {
            let (r, omitted) = Resident::from_entries(held, max);
            r.encode(omitted)
        });
        LoadReport {
            server_load: ranks.iter().map(|r| r.running + r.waiting).sum(),
            sim_ms: (self.clock.now_ms() * 1000.0).round() / 1000.0,
            speedup: self.clock.speedup(),
            ranks,
            residency,
        }
    }

    /// The Prometheus exposition (`GET /metrics`).
    pub fn metrics_text(&self) -> String {
        let snaps: Vec<(EngineMetrics, metrics::EngineGauges, tether_engine::Stats)> = self
            .slots
            .iter()
            .map(|s| {
                let c = lock(s);
                (
                    c.engine.metrics().clone(),
                    c.engine.gauges(),
                    c.engine.cache().stats(),
                )
            })
            .collect();
        let views: Vec<RankView> = snaps
            .iter()
            .enumerate()
            .map(|(i, (m, g, c))| RankView {
                dp_rank: i,
                metrics: m,
                gauges: *g,
                cache: *c,
            })
            .collect();
        let mut out = String::with_capacity(32 * 1024);
        metrics::render(&mut out, &self.cfg.model_name, &views);
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP tether_rank_bad_requests_total Requests refused, by reason."
        );
        let _ = writeln!(out, "# TYPE tether_rank_bad_requests_total counter");
        for (r, c) in BadReason::ALL.iter().zip(&self.bad) {
            let _ = writeln!(
                out,
                "tether_rank_bad_requests_total{{reason=\"{}\"}} {}",
                r.name(),
                c.load(Ordering::Relaxed)
            );
        }
        let p = &self.cfg.profile;
        let _ = writeln!(out, "# HELP tether_rank_info Rank configuration (value 1).");
        let _ = writeln!(out, "# TYPE tether_rank_info gauge");
        let _ = writeln!(
            out,
            "tether_rank_info{{model_name=\"{}\",profile=\"{}\",cache=\"{}\",profile_hash=\"{}\"}} 1",
            metrics::escape_label(&self.cfg.model_name),
            metrics::escape_label(&p.name),
            self.cfg.args.cache.name(),
            self.cfg.profile_hash
        );
        let _ = writeln!(
            out,
            "# HELP tether_rank_speedup Simulated time per wall time."
        );
        let _ = writeln!(out, "# TYPE tether_rank_speedup gauge");
        let _ = writeln!(out, "tether_rank_speedup {}", self.clock.speedup());
        let _ = writeln!(
            out,
            "# HELP tether_rank_engine_hour_usd Price of one engine (DP rank) hour."
        );
        let _ = writeln!(out, "# TYPE tether_rank_engine_hour_usd gauge");
        let _ = writeln!(out, "tether_rank_engine_hour_usd {}", p.engine_hour_usd());
        let _ = writeln!(
            out,
            "# HELP tether_rank_prefill_legs_total Prefill legs sent to a prefiller (decode role), by outcome."
        );
        let _ = writeln!(out, "# TYPE tether_rank_prefill_legs_total counter");
        let sent = self.legs_sent.load(Ordering::Relaxed);
        let failed = self.legs_failed.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "tether_rank_prefill_legs_total{{outcome=\"ok\"}} {}",
            sent.saturating_sub(failed)
        );
        let _ = writeln!(
            out,
            "tether_rank_prefill_legs_total{{outcome=\"failed\"}} {failed}"
        );
        self.pull_metrics(&mut out);
        self.rebalance_metrics(&mut out);
        out
    }
}

/// Serves `rank` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, rank: Arc<Rank>) -> std::io::Result<()> {
    for i in 0..rank.slots.len() {
        tokio::spawn(drive(rank.clone(), i));
    }
    if rank.rebalance.is_some() {
        tokio::spawn(rank.clone().poll_peers());
    }
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            // Out of descriptors or a reset during accept: keep serving.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let rank = rank.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(rank.clone(), req));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Advances engine `i` to the simulated clock forever, delivering events.
async fn drive(rank: Arc<Rank>, i: usize) {
    let slot = &rank.slots[i];
    loop {
        let next = {
            let mut c = lock(slot);
            let core = &mut *c;
            let now = rank.clock.now_ms();
            core.engine.advance(now, &mut core.events);
            for ev in core.events.drain(..) {
                let (id, last) = match &ev {
                    Event::First { id, .. } | Event::Token { id, .. } => (*id, false),
                    Event::Done { id, .. } | Event::Failed { id, .. } => (*id, true),
                };
                let gone = match core.subs.get(&id) {
                    Some(tx) => tx.send(ev).is_err(),
                    None => true,
                };
                if last || gone {
                    core.subs.remove(&id);
                }
                if gone && !last {
                    core.engine.cancel(id);
                }
            }
            core.engine.next_wakeup()
        };
        match next {
            Some(t) => {
                let at = tokio::time::Instant::from_std(rank.clock.instant_at(t));
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = slot.wake.notified() => {}
                }
            }
            None => slot.wake.notified().await,
        }
    }
}

/// Response body: a whole buffer, or SSE frames rendered from engine events.
pub enum RankBody {
    /// A complete body.
    Full(Option<Bytes>),
    /// A streaming body.
    Stream(Box<SseBody>),
}

impl std::fmt::Debug for RankBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RankBody")
    }
}

/// An SSE response in progress.
pub struct SseBody {
    first: Option<Bytes>,
    rx: mpsc::UnboundedReceiver<Event>,
    render: reply::Stream,
    live: LiveGuard,
    done: bool,
}

impl Body for RankBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            RankBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RankBody::Stream(s) => {
                if let Some(b) = s.first.take() {
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                if s.done {
                    return Poll::Ready(None);
                }
                let mut out = Vec::new();
                loop {
                    match s.rx.poll_recv(cx) {
                        Poll::Ready(Some(ev)) => match ev {
                            Event::First { .. } | Event::Token { .. } => s.render.token(&mut out),
                            Event::Done { outcome, .. } => {
                                s.render.finish(&outcome, &mut out);
                                s.live.finished = true;
                                s.done = true;
                                break;
                            }
                            Event::Failed { why, .. } => {
                                s.render.error(&why, &mut out);
                                s.live.finished = true;
                                s.done = true;
                                break;
                            }
                        },
                        Poll::Ready(None) => {
                            s.done = true;
                            break;
                        }
                        Poll::Pending => break,
                    }
                }
                if out.is_empty() {
                    if s.done {
                        Poll::Ready(None)
                    } else {
                        Poll::Pending
                    }
                } else {
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, RankBody::Full(None))
    }
}

/// Cancels a request in its engine if its client goes away before it
/// finishes; a finished tool turn's state may be copied out (`--rebalance`).
struct LiveGuard {
    rank: Arc<Rank>,
    dp: usize,
    id: u64,
    finished: bool,
    rebalance: Option<crate::rebalance::Watch>,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if self.finished {
            if let Some(w) = self.rebalance.take() {
                self.rank.rebalance_finished(w);
            }
            return;
        }
        if let Some(slot) = self.rank.slots.get(self.dp) {
            let mut c = lock(slot);
            c.subs.remove(&self.id);
            c.engine.cancel(self.id);
            drop(c);
            slot.wake.notify_one();
        }
    }
}

fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<RankBody> {
    let mut r = Response::new(RankBody::Full(Some(body.into())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn refuse(rank: &Rank, api: Option<Api>, r: Refusal) -> Response<RankBody> {
    rank.count(r.reason);
    let status = StatusCode::from_u16(r.reason.status()).unwrap_or(StatusCode::BAD_REQUEST);
    full(
        status,
        "application/json",
        reply::error_body(api, r.reason, &r.message),
    )
}

async fn handle(rank: Arc<Rank>, req: Request<Incoming>) -> Result<Response<RankBody>, Infallible> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if let Some(api) = Api::from_path(path.as_bytes()) {
        if method != Method::POST {
            return Ok(refuse(
                &rank,
                Some(api),
                Refusal::new(BadReason::Method, format!("{path} accepts POST")),
            ));
        }
        return Ok(generate(rank, api, &path, req).await);
    }
    if path == crate::rebalance::wire::ADOPT || path == crate::rebalance::wire::FORGET {
        return Ok(rank.serve_rebalance(&path, req).await);
    }
    if path.starts_with("/pull/") {
        return Ok(rank.serve_pull(&path, req).await);
    }
    let get = method == Method::GET || method == Method::HEAD;
    Ok(match path.as_str() {
        "/v1/models" | "/metrics" | "/load" | "/health" | "/tether/config" if !get => refuse(
            &rank,
            None,
            Refusal::new(BadReason::Method, format!("{path} accepts GET")),
        ),
        "/v1/models" => {
            let body = serde_json::json!({"object": "list", "data": [{
                "id": rank.cfg.model_name, "object": "model", "created": unix_now(),
                "owned_by": "tether", "root": rank.cfg.profile.model,
                "max_model_len": rank.cfg.max_model_len,
            }]});
            full(
                StatusCode::OK,
                "application/json",
                serde_json::to_vec(&body).unwrap_or_default(),
            )
        }
        "/metrics" => full(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            rank.metrics_text(),
        ),
        "/load" => full(
            StatusCode::OK,
            "application/json",
            serde_json::to_vec(&rank.load()).unwrap_or_default(),
        ),
        "/health" => full(StatusCode::OK, "application/json", Bytes::new()),
        "/tether/config" => full(StatusCode::OK, "application/json", rank.config_json.clone()),
        _ => refuse(
            &rank,
            None,
            Refusal::new(BadReason::UnknownPath, format!("no endpoint {path}")),
        ),
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The DP rank a request goes to: its header, or the least loaded.
fn pick_dp(rank: &Rank, req: &Request<Incoming>) -> Result<usize, Refusal> {
    let n = rank.slots.len();
    let mut vals = req.headers().get_all(tether_wire::headers::DP_RANK).iter();
    let Some(v) = vals.next() else {
        // vLLM's internal balancing when no rank is named: fewest requests in flight.
        if n == 1 {
            return Ok(0);
        }
        return Ok((0..n)
            .min_by_key(|&i| (lock(&rank.slots[i]).engine.in_flight(), i))
            .unwrap_or(0));
    };
    let bad = |why: String| Refusal::new(BadReason::BadDpRank, why);
    if vals.next().is_some() {
        return Err(bad(format!(
            "{} is repeated",
            tether_wire::headers::DP_RANK
        )));
    }
    let s = v
        .to_str()
        .map_err(|_| bad(format!("{} is not ASCII", tether_wire::headers::DP_RANK)))?;
    let r: usize = s.trim().parse().map_err(|_| {
        bad(format!(
            "{} must be a decimal rank, got {:?}",
            tether_wire::headers::DP_RANK,
            s.chars().take(40).collect::<String>()
        ))
    })?;
    if r >= n {
        return Err(bad(format!(
            "data_parallel_rank {r} is out of range [0, {n})"
        )));
    }
    Ok(r)
}

fn header_marker(req: &Request<Incoming>) -> Result<Option<TurnMarker>, Refusal> {
    let mut pairs = Vec::new();
    for (name, value) in req.headers() {
        if !name
            .as_str()
            .starts_with(tether_wire::headers::TETHER_PREFIX)
        {
            continue;
        }
        let v = value.to_str().map_err(|_| {
            Refusal::new(BadReason::BadMarker, format!("header {name} is not ASCII"))
        })?;
        pairs.push((name.as_str(), v));
    }
    TurnMarker::from_headers(pairs).map_err(|e| Refusal::new(BadReason::BadMarker, e.to_string()))
}

async fn generate(
    rank: Arc<Rank>,
    api: Api,
    path: &str,
    req: Request<Incoming>,
) -> Response<RankBody> {
    let refused = |r: Refusal| refuse(&rank, Some(api), r);
    // When the request reached this rank: a decode rank's prefill leg counts in its latency.
    let received = rank.clock.now_ms();
    let dp = match pick_dp(&rank, &req) {
        Ok(d) => d,
        Err(r) => return refused(r),
    };
    let marker = match header_marker(&req) {
        Ok(m) => m,
        Err(r) => return refused(r),
    };
    let prefiller = if rank.cfg.args.role == Role::Decode {
        match pd::prefiller(
            req.headers()
                .get_all(tether_wire::headers::PREFILLER)
                .iter()
                .map(|v| v.as_bytes()),
        ) {
            Ok(p) => p,
            Err(r) => return refused(r),
        }
    } else {
        None
    };
    // Any role but prefill: a migrated key's state, pulled from its old holder.
    let pulls = rank.cfg.args.role != Role::Prefill;
    let header_pull = if pulls {
        match pull_from(
            req.headers()
                .get_all(tether_wire::headers::PULL_FROM)
                .iter()
                .map(|v| v.as_bytes()),
        ) {
            Ok(p) => p,
            Err(r) => return refused(r),
        }
    } else {
        None
    };
    let route = crate::rebalance::route_key(
        req.headers()
            .get_all(tether_wire::headers::KEY)
            .iter()
            .map(|v| v.as_bytes()),
    );
    let limit = rank.cfg.args.max_body_bytes;
    let too_large = || {
        Refusal::new(
            BadReason::TooLarge,
            format!("request body is over {limit} bytes"),
        )
    };
    if let Some(len) = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && len > limit as u64
    {
        return refused(too_large());
    }
    let body = match http_body_util::Limited::new(req.into_body(), limit)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return refused(too_large());
            }
            // The client went away mid-body: nobody to answer; count it as not JSON.
            return refused(Refusal::new(
                BadReason::NotJson,
                "request body could not be read",
            ));
        }
    };
    let parsed = match request::parse(api, &body) {
        Ok(p) => p,
        Err(r) => return refused(r),
    };
    // A prefill leg carries the decode rank's body, whose id is the decode rank's.
    if let Some(prev) = &parsed.previous_response_id
        && rank.cfg.args.role != Role::Prefill
        && !rank.answered(prev)
    {
        return refused(Refusal::new(
            BadReason::UnknownResponse,
            format!("Response with id '{prev}' not found."),
        ));
    }
    let marker = marker.or(parsed.body_marker);
    // The header wins over the body's member, as for the markers.
    let pull_from = match (header_pull, parsed.pull_from.as_deref()) {
        (Some(a), _) => Some(a),
        (None, Some(v)) if pulls => match pull_from([v.as_bytes()]) {
            Ok(a) => a,
            Err(r) => return refused(r),
        },
        _ => None,
    };
    let prompt = parsed.tokens.len();
    if prompt == 0 {
        return refused(Refusal::new(BadReason::BadPrompt, "the prompt is empty"));
    }
    let mut max_tokens = parsed
        .max_tokens
        .unwrap_or(rank.cfg.args.default_max_tokens);
    if rank.cfg.args.role == Role::Prefill {
        // A prefiller's answer is the first token; the decode rank makes the rest.
        max_tokens = 1;
    }
    if let Err(e) = ContextLimit(rank.cfg.max_model_len).check(prompt as u64, max_tokens as u64) {
        return refused(Refusal::new(BadReason::BadPrompt, e.to_string()));
    }
    let keys = RequestKeys {
        cache_salt: parsed.cache_salt.as_ref().map(|s| s.as_bytes().to_vec()),
        lora: None,
    };
    let hashes = rank.hasher.hash_prompt(&parsed.tokens, &keys);
    // Decode role with a prefiller: the prompt's KV is computed there and sent
    // here; if the leg fails, the prompt is prefilled here (counted).
    let mut kv_in_tokens = 0;
    let mut used_prefiller = None;
    if let Some(to) = prefiller {
        rank.legs_sent.fetch_add(1, Ordering::Relaxed);
        let leg = match pd::prefill_body(api, &body) {
            Ok(b) => pd::prefill_leg(&rank.legs, to, path, dp, b).await,
            Err(e) => Err(e),
        };
        match leg {
            Ok(()) => {
                kv_in_tokens = prompt;
                used_prefiller = Some(to);
            }
            Err(_) => {
                rank.legs_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    // A migrated key's turn (no prefill leg): its state leased from the old
    // holder crosses the KV link; a failed pull computes the prompt here.
    let pulled = match (pull_from, marker.map(|m| m.key), prefiller) {
        (Some(from), Some(key), None) => Some(rank.pull(from, key, &hashes, dp).await),
        _ => None,
    };
    if let Some(p) = &pulled {
        kv_in_tokens = p.kv_in_tokens;
    }
    // The leg or the lease call is part of the request's latency.
    let waited = used_prefiller.is_some() || pulled.as_ref().is_some_and(|p| p.asked);
    drop(body);
    let id = rank.next_id.fetch_add(1, Ordering::Relaxed);
    let sim = SimRequest {
        id,
        hashes,
        prompt_tokens: prompt,
        max_tokens,
        marker,
        stream: parsed.stream,
        kv_in_tokens,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let slot = &rank.slots[dp];
    {
        let mut c = lock(slot);
        let arrival = rank.clock.now_ms().max(c.engine.clock());
        if let Err(e) = c.engine.submit(sim, arrival) {
            drop(c);
            return refused(Refusal::new(BadReason::BadPrompt, e.to_string()));
        }
        c.subs.insert(id, tx);
    }
    slot.wake.notify_one();
    let mut live = LiveGuard {
        rank: rank.clone(),
        dp,
        id,
        finished: false,
        rebalance: rank.rebalance_admitted(marker, route, dp),
    };
    let meta = Meta {
        id: id ^ rank.nonce,
        model: parsed
            .model
            .clone()
            .unwrap_or_else(|| rank.cfg.model_name.clone()),
        created: unix_now(),
        dp_rank: dp,
    };
    let first = rx.recv().await;
    match first {
        Some(Event::Done { mut outcome, .. }) if !parsed.stream => {
            live.finished = true;
            if waited {
                outcome.arrival = outcome.arrival.min(received);
            }
            let mut r = full(
                StatusCode::OK,
                "application/json",
                reply::body(api, &meta, &outcome),
            );
            timing_headers(&mut r, dp, &outcome);
            prefiller_header(&mut r, used_prefiller);
            pulled_header(&mut r, pulled.as_ref());
            rank.identify(&mut r);
            r
        }
        Some(Event::First {
            at, mut admitted, ..
        }) if parsed.stream => {
            if waited {
                admitted.arrival = admitted.arrival.min(received);
            }
            // Usage the API announces up front (Anthropic) is known from admission;
            // it is repeated exactly in the final usage.
            let mut render = reply::Stream::new(api, meta, parsed.include_usage);
            let mut head = Vec::new();
            let (cached, arrival) = (admitted.cached_tokens, admitted.arrival);
            let queue = admitted.admitted - admitted.arrival;
            render.start(prompt, cached, &mut head);
            let mut r = Response::new(RankBody::Stream(Box::new(SseBody {
                first: Some(Bytes::from(head)),
                rx,
                render,
                live,
                done: false,
            })));
            let h = r.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            h.insert("cache-control", HeaderValue::from_static("no-cache"));
            put(h, rh::DP_RANK, dp.to_string());
            put(h, rh::SIM_ARRIVAL_MS, fmt_ms(arrival));
            put(h, rh::SIM_QUEUE_MS, fmt_ms(queue));
            put(h, rh::SIM_TTFT_MS, fmt_ms(at - arrival));
            put(h, rh::CACHED_TOKENS, cached.to_string());
            prefiller_header(&mut r, used_prefiller);
            pulled_header(&mut r, pulled.as_ref());
            rank.identify(&mut r);
            r
        }
        Some(Event::Failed { why, .. }) => {
            live.finished = true;
            refused(Refusal::new(BadReason::Engine, why))
        }
        _ => refused(Refusal::new(
            BadReason::Engine,
            "the engine dropped the request",
        )),
    }
}

/// `x-tether-pulled-from`: the holder whose retained state this answer pulled.
fn pulled_header(r: &mut Response<RankBody>, p: Option<&state_pull::Pulled>) {
    if let Some(g) = p.and_then(|p| p.lease.as_ref()) {
        put(r.headers_mut(), rh::PULLED_FROM, g.from().to_string());
    }
}

/// The holder named by `x-tether-pull-from` (or the body's `pull_from`):
/// `None` without it; a refusal (`bad_pull_from`) when it is repeated, not
/// ASCII or not one `ip:port` (`tether_wire::params::parse_pull_from`).
fn pull_from<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<std::net::SocketAddr>, Refusal> {
    let bad = |why: String| Refusal::new(BadReason::BadPullFrom, why);
    let name = tether_wire::headers::PULL_FROM;
    let mut it = values.into_iter();
    let Some(v) = it.next() else {
        return Ok(None);
    };
    if it.next().is_some() {
        return Err(bad(format!("{name} is repeated")));
    }
    let s = std::str::from_utf8(v).map_err(|_| bad(format!("{name} is not ASCII")))?;
    tether_wire::params::parse_pull_from(s)
        .map(Some)
        .ok_or_else(|| {
            bad(format!(
                "{name} must be one ip:port, got {:?}",
                s.chars().take(60).collect::<String>()
            ))
        })
}

/// `x-tether-prefilled-by`: the prefiller whose KV this answer decoded from.
fn prefiller_header(r: &mut Response<RankBody>, by: Option<std::net::SocketAddr>) {
    if let Some(by) = by {
        put(r.headers_mut(), rh::PREFILLED_BY, by.to_string());
    }
}

fn fmt_ms(v: f64) -> String {
    format!("{:.3}", v)
}

fn put(h: &mut hyper::HeaderMap, name: &'static str, v: String) {
    if let Ok(v) = HeaderValue::from_str(&v) {
        h.insert(name, v);
    }
}

fn timing_headers(r: &mut Response<RankBody>, dp: usize, o: &Outcome) {
    let h = r.headers_mut();
    put(h, rh::DP_RANK, dp.to_string());
    put(h, rh::SIM_ARRIVAL_MS, fmt_ms(o.arrival));
    put(h, rh::SIM_QUEUE_MS, fmt_ms(o.queue_ms()));
    put(h, rh::SIM_TTFT_MS, fmt_ms(o.ttft_ms()));
    put(h, rh::CACHED_TOKENS, o.cached_tokens.to_string());
    put(h, rh::SIM_E2E_MS, fmt_ms(o.e2e_ms()));
    put(h, rh::SIM_ITL_MS, fmt_ms(o.itl_ms()));
}
