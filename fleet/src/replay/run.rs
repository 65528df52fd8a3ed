//! The replay driver (tokio): sessions started on the trace's timeline or as
//! N live session trees, each session's requests released by its
//! [`SessionPlan`], synthesized just before they are sent, at most
//! `max_inflight` in flight; a progress bar; cancellation that stops sending
//! at once and keeps what was measured (the report is then marked partial).

use super::client::{Client, Target};
use super::plan::{Mode, SessionPlan};
use super::resident::ResidentRoute;
use super::scrape;
use crate::report::config::{GatewayConfig, RankInfo};
use crate::report::observe::{Clock, Observation, Outcome};
use crate::sim::request_key;
use crate::synth::{HttpRequest, SessionSynth, SynthOptions};
use crate::trace::{Api, RequestId, SessionId, Trace};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tether_placement::{Endpoint, Placement};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;

/// Which schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// Sessions and requests at the trace's timestamps.
    Fixed,
    /// N live session trees at a time, each as fast as its gaps allow.
    Live(usize),
}

/// How requests are spread over several targets (one target: all go there).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Route {
    /// By the gateway's own placement of the session (and subagent) key.
    Session,
    /// In turn.
    RoundRobin,
    /// By residency and load, as the filter's `residency` pick: the targets'
    /// `/load` polled every `poll_ms`, `rule` the placement rule
    /// ([`super::resident`]).
    Resident {
        rule: tether_placement::Rule,
        poll_ms: u64,
        /// How a migrated state moves (which header names the old home).
        migrate: crate::sim::Migrate,
        /// A target's prefill backlog is a wait at the rate it reports in
        /// `/load` (`prefill_tokens_per_s`), where it reports one; otherwise,
        /// and always when false, at the rule's.
        own_rates: bool,
    },
}

/// Everything a replay needs besides the trace.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where requests go.
    pub targets: Vec<Target>,
    /// How requests are spread over several targets.
    pub route: Route,
    /// The schedule.
    pub schedule: Schedule,
    /// Most requests in flight.
    pub max_inflight: usize,
    /// Trace time runs this many times faster than wall time; `None`: the
    /// ranks' own `--speedup` (from the scraped ranks, else from a target's
    /// `/tether/config`), else 1.
    pub speedup: Option<f64>,
    /// Cap on idle gaps (live schedule), trace ms.
    pub max_gap_ms: u64,
    /// Request synthesis.
    pub synth: SynthOptions,
    /// Per-request timeout (wall).
    pub timeout: Duration,
    /// Replay only the first N sessions (by start).
    pub sessions: Option<usize>,
    /// Ranks to scrape (`http://ip:port`); empty: the ranks that answer are
    /// discovered from `x-tether-rank` and scraped at the end.
    pub ranks: Vec<String>,
    /// Envoy admin URL to read the gateway configuration from.
    pub gateway_admin: Option<String>,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
}

/// What a replay measured.
#[derive(Debug)]
pub struct Outcomes {
    /// One per request sent.
    pub observations: Vec<Observation>,
    /// The sessions in scope.
    pub sessions: Vec<SessionId>,
    /// Why it stopped early, if it did.
    pub partial: Option<String>,
    /// Wall seconds.
    pub wall_s: f64,
    /// Trace seconds covered.
    pub trace_s: f64,
    /// The speedup used.
    pub speedup: f64,
    /// Unix ms at the start.
    pub started_unix_ms: u64,
    /// Rank configurations.
    pub ranks: Vec<RankInfo>,
    /// Busy seconds per engine during the run.
    pub busy_s: BTreeMap<String, f64>,
    /// The gateway's configuration, when read.
    pub gateway: Option<GatewayConfig>,
    /// Problems met while scraping (reported, not fatal).
    pub warnings: Vec<String>,
}

/// A replay that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Fixed schedule on a trace without a timeline.
    #[error(
        "the trace has sessions without `start_ms` (recorded independently, e.g. AgentX): replay them as live sessions with --live N"
    )]
    NoTimeline,
    /// Bad options.
    #[error("{0}")]
    Options(String),
}

/// Replay time: trace ms since the start (wall × speedup).
#[derive(Clone, Copy, Debug)]
struct Clock0 {
    start: Instant,
    speedup: f64,
}

impl Clock0 {
    fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0 * self.speedup
    }

    fn instant_at(&self, trace_ms: f64) -> Instant {
        self.start + Duration::from_secs_f64((trace_ms / self.speedup / 1000.0).max(0.0))
    }
}

struct Shared {
    trace: Arc<Trace>,
    opts: Options,
    client: Client,
    clock: Clock0,
    inflight: Semaphore,
    cancel: watch::Receiver<bool>,
    tx: mpsc::UnboundedSender<Observation>,
    placement: Option<Placement>,
    resident: Option<Arc<ResidentRoute>>,
    rr: AtomicU64,
}

impl Shared {
    fn cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// The target of request `r`, and the headers its placement adds.
    fn target_of(&self, r: RequestId) -> (usize, Vec<(String, String)>) {
        if let Some(res) = &self.resident {
            return res
                .route(&self.trace, r, &self.opts.synth.salt)
                .map_or((0, Vec::new()), |x| (x.target, x.headers));
        }
        if self.opts.targets.len() <= 1 {
            return (0, Vec::new());
        }
        let t = match (self.opts.route, &self.placement) {
            (Route::Session, Some(p)) => {
                let (key, _) = request_key(&self.trace, r);
                p.pick(key, 0)
                    .and_then(|p| p.order.first().copied())
                    .unwrap_or(0)
            }
            _ => {
                (self.rr.fetch_add(1, Ordering::Relaxed) % self.opts.targets.len() as u64) as usize
            }
        };
        (t, Vec::new())
    }
}

/// Latency of an outcome in trace ms (simulated when reported, else wall × speedup).
fn latency_trace_ms(o: &Outcome, wall_ms: f64, speedup: f64) -> f64 {
    match o {
        Outcome::Served(s) if s.timing.clock == Clock::Simulated => s.timing.e2e_ms,
        _ => wall_ms * speedup,
    }
}

async fn send_one(
    sh: Arc<Shared>,
    r: RequestId,
    mut req: HttpRequest,
    api: Api,
    release_ms: f64,
    due_ms: f64,
) -> Option<(RequestId, Observation, f64)> {
    let mut cancel = sh.cancel.clone();
    tokio::select! {
        _ = tokio::time::sleep_until(sh.clock.instant_at(release_ms).into()) => {}
        _ = cancel.wait_for(|c| *c) => return None,
    }
    let _permit = tokio::select! {
        p = sh.inflight.acquire() => p.ok()?,
        _ = cancel.wait_for(|c| *c) => return None,
    };
    if sh.cancelled() {
        return None;
    }
    let (t, extra) = sh.target_of(r);
    req.headers.extend(extra);
    let target = &sh.opts.targets[t];
    let sent_ms = sh.clock.now_ms();
    let wall = Instant::now();
    let outcome = tokio::select! {
        o = sh.client.exchange(target, api, req) => o,
        _ = cancel.wait_for(|c| *c) => return None,
    };
    let wall_ms = wall.elapsed().as_secs_f64() * 1000.0;
    let latency = latency_trace_ms(&outcome, wall_ms, sh.clock.speedup);
    Some((
        r,
        Observation {
            request: r.0,
            sent_ms,
            lag_ms: (sent_ms - due_ms).max(0.0),
            outcome,
        },
        latency,
    ))
}

async fn run_session(sh: Arc<Shared>, s: SessionId, mode: Mode) {
    let trace = sh.trace.clone();
    let mut plan = SessionPlan::new(&trace, s, mode);
    let mut synth = SessionSynth::new(&trace, s, sh.opts.synth.clone());
    let mut pending: HashMap<RequestId, HttpRequest> = HashMap::new();
    let mut inflight = JoinSet::new();
    let start = sh.clock.now_ms();
    loop {
        for (r, release, due) in plan.ready(start) {
            // Synthesis runs in session order; keep what comes before `r`.
            while !pending.contains_key(&r) {
                match synth.next() {
                    Some((id, req)) => {
                        pending.insert(id, req);
                    }
                    None => break,
                }
            }
            let Some(req) = pending.remove(&r) else {
                continue;
            };
            let api = Api::from_path(req.path.as_bytes()).unwrap_or(Api::Chat);
            inflight.spawn(send_one(sh.clone(), r, req, api, release, due));
        }
        if sh.cancelled() {
            inflight.abort_all();
            return;
        }
        match inflight.join_next().await {
            None => return,
            Some(Ok(Some((r, obs, latency)))) => {
                let _ = sh.tx.send(obs);
                plan.complete(r, sh.clock.now_ms(), latency);
            }
            Some(_) => {
                // Cancelled (or the task died): stop this session.
                inflight.abort_all();
                return;
            }
        }
    }
}

/// Replays `trace`; `cancel` set to true stops it (the outcomes are then partial).
pub async fn replay(
    trace: Arc<Trace>,
    opts: Options,
    cancel: watch::Receiver<bool>,
) -> Result<Outcomes, StartError> {
    if opts.targets.is_empty() {
        return Err(StartError::Options("no --target given".into()));
    }
    if let Some(s) = opts.speedup
        && !(s.is_finite() && s > 0.0)
    {
        return Err(StartError::Options(
            "--speedup must be a positive number".into(),
        ));
    }
    let mut sessions: Vec<SessionId> = (0..trace.sessions().len() as u32).map(SessionId).collect();
    let has_timeline = trace.sessions().iter().all(|s| s.start_ms.is_some());
    if opts.schedule == Schedule::Fixed && !has_timeline {
        return Err(StartError::NoTimeline);
    }
    if has_timeline {
        sessions.sort_by_key(|&s| (trace.session(s).start_ms, s));
    }
    if let Some(n) = opts.sessions {
        sessions.truncate(n);
    }
    let total: u64 = sessions
        .iter()
        .map(|&s| trace.session_requests(s).len() as u64)
        .sum();
    let origin_ms = sessions
        .iter()
        .filter_map(|&s| trace.session(s).start_ms)
        .min()
        .unwrap_or(0);
    let client = Client::new(opts.timeout);
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut warnings = Vec::new();

    // The serving side before the run.
    let (gateway, gateway_endpoints) = match &opts.gateway_admin {
        Some(a) => match scrape::gateway_config(&client, a).await {
            Ok((g, eps)) => (Some(g), eps),
            Err(e) => {
                warnings.push(format!("gateway configuration not read: {e}"));
                (None, Vec::new())
            }
        },
        None => (None, Vec::new()),
    };
    let mut busy_before: BTreeMap<String, f64> = BTreeMap::new();
    let mut rank_names: BTreeMap<String, String> = BTreeMap::new();
    let mut rank_infos = Vec::new();
    for origin in &opts.ranks {
        match scrape::rank_config(&client, origin).await {
            Ok(info) => {
                if let Ok(b) = scrape::rank_busy(&client, origin, &info.rank).await {
                    busy_before.extend(b);
                }
                rank_names.insert(origin.clone(), info.rank.clone());
                rank_infos.push(info);
            }
            Err(e) => warnings.push(format!("rank not scraped: {e}")),
        }
    }

    let speedup = match opts.speedup {
        Some(s) => s,
        None => {
            let mut found = rank_infos.iter().find_map(rank_speedup);
            for t in &opts.targets {
                if found.is_some() {
                    break;
                }
                found = scrape::rank_config(&client, &t.url(""))
                    .await
                    .ok()
                    .as_ref()
                    .and_then(rank_speedup);
            }
            found.unwrap_or(1.0)
        }
    };
    for r in &rank_infos {
        if let Some(s) = rank_speedup(r)
            && (s - speedup).abs() > 1e-9
        {
            warnings.push(format!(
                "rank {} runs at --speedup {s} but the replay at {speedup}: think and tool gaps are scaled differently from the ranks' clock",
                r.rank
            ));
        }
    }
    let placement = (opts.targets.len() > 1).then(|| {
        Placement::new(
            &opts
                .targets
                .iter()
                .map(|t| Endpoint {
                    address: t.origin.trim_start_matches("http://").to_owned(),
                    weight: 1.0,
                    dp_size: 1,
                    name: None,
                })
                .collect::<Vec<_>>(),
        )
    });
    let resident = match opts.route {
        Route::Resident {
            rule,
            poll_ms,
            migrate,
            own_rates,
        } => {
            let origins: Vec<String> = opts.targets.iter().map(|t| t.origin.clone()).collect();
            // A reply older than three polls no longer counts (as the filter's `max_age_ms`).
            let res = ResidentRoute::new(&origins, rule, Duration::from_millis(poll_ms.max(1) * 3))
                .migrating(migrate)
                .reading_rates(own_rates);
            // A first view before the first request.
            for w in res.poll(&client).await {
                warnings.push(format!("resident route: {w}"));
            }
            Some(Arc::new(res))
        }
        _ => None,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Replay time 0 is a moment from now, so the first sessions are
    // synthesized before they are due rather than late.
    let clock = Clock0 {
        start: Instant::now() + Duration::from_millis(300),
        speedup,
    };
    let mode = match opts.schedule {
        Schedule::Fixed => Mode::Fixed { origin_ms },
        Schedule::Live(_) => Mode::Live {
            max_gap_ms: opts.max_gap_ms,
        },
    };
    let progress = opts.progress;
    let sh_targets = opts.targets.clone();
    let sh = Arc::new(Shared {
        trace: trace.clone(),
        inflight: Semaphore::new(opts.max_inflight.max(1)),
        opts,
        client: client.clone(),
        clock,
        cancel: cancel.clone(),
        tx,
        placement,
        resident: resident.clone(),
        rr: AtomicU64::new(0),
    });
    // `--route resident`: poll the targets' `/load` for the run's length.
    let poller = resident.map(|res| {
        let client = client.clone();
        let poll_ms = match sh.opts.route {
            Route::Resident { poll_ms, .. } => poll_ms.max(1),
            _ => 200,
        };
        tokio::spawn(async move {
            loop {
                let _ = res.poll(&client).await;
                tokio::time::sleep(Duration::from_millis(poll_ms)).await;
            }
        })
    });

    // Start sessions: on the timeline, or N live at a time.
    let starter = {
        let sh = sh.clone();
        let trace = trace.clone();
        let sessions = sessions.clone();
        tokio::spawn(async move {
            let mut tasks = JoinSet::new();
            let live = match sh.opts.schedule {
                Schedule::Live(n) => Some(Arc::new(Semaphore::new(n.max(1)))),
                Schedule::Fixed => None,
            };
            let mut cancel = sh.cancel.clone();
            for s in sessions {
                let permit = match &live {
                    Some(sem) => tokio::select! {
                        p = sem.clone().acquire_owned() => p.ok(),
                        _ = cancel.wait_for(|c| *c) => break,
                    },
                    None => {
                        // Spawn a little before the session's first request is due.
                        let at = trace
                            .session(s)
                            .start_ms
                            .unwrap_or(origin_ms)
                            .saturating_sub(origin_ms) as f64;
                        let early = 200.0 * sh.clock.speedup;
                        tokio::select! {
                            _ = tokio::time::sleep_until(sh.clock.instant_at(at - early).into()) => {}
                            _ = cancel.wait_for(|c| *c) => break,
                        }
                        None
                    }
                };
                let sh2 = sh.clone();
                tasks.spawn(async move {
                    run_session(sh2, s, mode).await;
                    drop(permit);
                });
                // Reap finished sessions as we go so the set stays small.
                while let Some(r) = tasks.try_join_next() {
                    let _ = r;
                }
            }
            while tasks.join_next().await.is_some() {}
        })
    };
    drop(sh);

    let bar = if progress {
        let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} requests, eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let mut observations = Vec::with_capacity(total as usize);
    let (mut prompt, mut cached, mut errors) = (0u64, 0u64, 0u64);
    while let Some(o) = rx.recv().await {
        match o.served() {
            Some(s) => {
                prompt += s.prompt_tokens;
                cached += s.cached_tokens;
            }
            None => errors += 1,
        }
        bar.inc(1);
        bar.set_message(format!(
            "hit {:.1} %, {errors} errors",
            if prompt > 0 {
                100.0 * cached as f64 / prompt as f64
            } else {
                0.0
            }
        ));
        observations.push(o);
    }
    let _ = starter.await;
    if let Some(p) = poller {
        p.abort();
    }
    // The last state stays on screen: what the run did is worth a line.
    bar.finish();
    let wall_s = clock.start.elapsed().as_secs_f64();
    let partial = if *cancel.borrow() {
        Some(format!(
            "interrupted after {:.1} s: {} of {} requests sent",
            wall_s,
            observations.len(),
            total
        ))
    } else {
        None
    };

    // The serving side after the run.
    let mut busy_s = BTreeMap::new();
    // Rank names seen in answers that must be matched by a scraped rank.
    let mut unscraped: Vec<String> = Vec::new();
    let mut origins: Vec<(String, Option<String>)> = opts_ranks(&rank_names)
        .into_iter()
        .map(|(o, n)| (o, Some(n)))
        .collect();
    if origins.is_empty() {
        let mut seen: Vec<String> = observations
            .iter()
            .filter_map(|o| o.served().and_then(|s| s.rank.clone()))
            .collect();
        seen.sort();
        seen.dedup();
        origins = discover_ranks(&seen, &sh_targets, &gateway_endpoints);
        unscraped = seen;
    }
    for (origin, name) in origins {
        let name = match name {
            Some(n) => n,
            None => match scrape::rank_config(&client, &origin).await {
                Ok(info) => {
                    let n = info.rank.clone();
                    rank_infos.push(info);
                    n
                }
                Err(e) => {
                    warnings.push(format!("rank not scraped: {e}"));
                    continue;
                }
            },
        };
        match scrape::rank_busy(&client, &origin, &name).await {
            Ok(after) => {
                for (e, v) in after {
                    let before = busy_before.get(&e).copied().unwrap_or(0.0);
                    busy_s.insert(e, (v - before).max(0.0));
                }
            }
            Err(e) => warnings.push(format!("rank metrics not read: {e}")),
        }
    }
    unscraped.retain(|r| !rank_infos.iter().any(|i| &i.rank == r));
    if !unscraped.is_empty() {
        warnings.push(format!(
            "rank(s) {} answered but were not found to read their configuration and busy time (the report has no cost for them): name them with --ranks ip:port, or give --gateway-admin so the gateway's endpoints are asked",
            unscraped.join(", ")
        ));
    }

    Ok(Outcomes {
        observations,
        sessions,
        partial,
        wall_s,
        trace_s: wall_s * clock.speedup,
        speedup,
        started_unix_ms,
        ranks: rank_infos,
        busy_s,
        gateway,
        warnings,
    })
}

/// Where to read the ranks that answered, when `--ranks` named none: a rank
/// that names itself by address is asked there; a rank with its own
/// `--rank-id` is looked for among the gateway's endpoints (each asked for its
/// `/tether/config`, which names it); one rank behind one target that names
/// itself otherwise is the target.
fn discover_ranks(
    seen: &[String],
    targets: &[Target],
    gateway_endpoints: &[String],
) -> Vec<(String, Option<String>)> {
    let is_addr = |r: &String| r.parse::<std::net::SocketAddr>().is_ok();
    if let ([only], [t]) = (seen, targets)
        && !is_addr(only)
        && gateway_endpoints.is_empty()
    {
        return vec![(t.url(""), None)];
    }
    let mut origins: Vec<String> = seen.iter().filter(|r| is_addr(r)).cloned().collect();
    if seen.iter().any(|r| !is_addr(r)) {
        origins.extend(gateway_endpoints.iter().cloned());
    }
    origins.sort();
    origins.dedup();
    origins
        .into_iter()
        .map(|r| (format!("http://{r}"), None))
        .collect()
}

fn rank_speedup(r: &RankInfo) -> Option<f64> {
    r.config.get("serving")?.get("speedup")?.as_f64()
}

fn opts_ranks(names: &BTreeMap<String, String>) -> Vec<(String, String)> {
    names.iter().map(|(o, n)| (o.clone(), n.clone())).collect()
}

#[cfg(test)]
mod tests;
