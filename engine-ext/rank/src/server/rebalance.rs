//! Rebalancing in tool gaps on a running rank (`docs/rank.md` "Rebalancing in
//! tool gaps"; the pure parts are [`crate::rebalance`]): the peers' `/load`
//! poller; as a home, the copy of a finished tool/handoff turn's state to the
//! target the shared rule names; as a target, `POST /pull/adopt` (lease the
//! state from the home, retain it through an unmetered one-token request);
//! either side, the twin told to forget when the key's returning turn comes
//! here, and `POST /pull/forget`.

use super::{Rank, RankBody, full, lock};
use crate::engine::{Event as EngineEvent, SimRequest};
use crate::pull::{self, Ask};
use crate::rebalance::twins::OnTurn;
use crate::rebalance::view::Sample;
use crate::rebalance::wire::{self, Adopt};
use crate::rebalance::{Event, Side, Watch};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_engine::{BlockHash, RetentionKey, TurnKind, TurnMarker};
use tether_placement::load::report::LoadReport;
use tether_placement::{dp_rank, resident_key};
use tokio::sync::mpsc;

/// Largest `/load` answer read from a peer (a full residency summary is ~410 KB).
const MAX_LOAD_BYTES: usize = 2 << 20;

/// Why an adopt did not land, with its status.
type Refusal = (StatusCode, String);

impl Rank {
    /// A request of `marker` was admitted on DP rank `dp`: if its key has a
    /// twin, the twin lets its copy go (now, or once the copy crossing ends);
    /// if it is a tool/handoff prompt end, the turn to copy out when it
    /// finishes.
    pub(super) fn rebalance_admitted(
        self: &Arc<Self>,
        marker: Option<TurnMarker>,
        route: Option<u64>,
        dp: usize,
    ) -> Option<Watch> {
        let on = self.rebalance.as_ref()?;
        let m = marker?;
        match on.twins().on_turn(&m.key) {
            OnTurn::Forget(t) => {
                self.rebalanced.add(match t.side {
                    Side::Target => Event::Used,
                    Side::Home => Event::Unused,
                });
                self.spawn_forget(t.peer, m.key, t.last);
            }
            OnTurn::Deferred | OnTurn::Nothing => {}
        }
        if !(m.prompt_end && matches!(m.kind, TurnKind::Tool | TurnKind::Handoff)) {
            return None;
        }
        let Some(route) = route else {
            self.rebalanced.add(Event::NoKey);
            return None;
        };
        Some(Watch {
            dp,
            marker: m,
            route,
        })
    }

    /// The watched turn finished: copy its state out in the background.
    pub(super) fn rebalance_finished(self: &Arc<Self>, w: Watch) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(self.clone().copy_out(w));
        }
    }

    /// This rank's own load, fresh, as the rule reads a peer's.
    fn own_sample(&self) -> Sample {
        let (mut requests, mut kv, mut backlog) = (0.0, 0.0, 0.0);
        for s in &self.slots {
            let g = lock(s).engine.gauges();
            requests += (g.running + g.waiting) as f64;
            kv += g.kv_usage;
            backlog += g.queued_prefill_tokens as f64;
        }
        Sample {
            requests,
            kv_usage: kv / self.slots.len().max(1) as f64,
            backlog,
        }
    }

    /// As the home: when the rule names a target, asks it to adopt the
    /// retained state of `w`'s key, and remembers it as the key's twin.
    async fn copy_out(self: Arc<Self>, w: Watch) {
        let Some(on) = self.rebalance.as_ref() else {
            return;
        };
        let key = w.marker.key;
        let (hashes, state) = {
            let Some(slot) = self.slots.get(w.dp) else {
                return;
            };
            let c = lock(slot);
            let cache = c.engine.cache();
            let held = cache
                .device_record(&key)
                .map(|r| (r.hashes.clone(), r.meta.tokens))
                .or_else(|| (cache.host().record(&key)).map(|r| (r.hashes.clone(), r.meta.tokens)));
            // The state's share of this rank's device KV, which stands for a peer's.
            let state = held.as_ref().map_or(0.0, |(_, t)| cache.device_share(*t));
            (held.map(|(h, _)| h), state)
        };
        let Some((hashes, &last)) = hashes.as_ref().and_then(|h| Some((h, h.last()?))) else {
            return; // not retained (a failed prefill, or evicted already)
        };
        let hashes = hashes.clone();
        if on.twins().get(&key).is_some() {
            return; // copied already
        }
        let me = on.peers.me;
        let view = on.view().vectors(me, self.own_sample(), Instant::now());
        let target = on.peers.placement.rebalance_target(
            w.route,
            me,
            &on.rule,
            on.settings,
            view.loads(),
            state,
        );
        let (Some(to), Some(&from)) = (
            target.and_then(|t| on.peers.addrs.get(t)),
            on.peers.addrs.get(me),
        ) else {
            return;
        };
        let to = *to;
        on.twins().start(key, to, Side::Home, last);
        let call = Adopt {
            from,
            route_key: w.route,
            marker: w.marker,
            hashes,
            fingerprint: self.fingerprint(),
        };
        let body = call.to_json().to_string().into_bytes();
        // The target's lease call is bounded by its --pull-timeout-ms; its
        // engine then takes the copy like any admission.
        let wait = 2 * self.pull_timeout();
        let ok = matches!(
            pull::post(&self.legs, to, wire::ADOPT, body, wait).await,
            Ok((200, _))
        );
        self.rebalanced
            .add(if ok { Event::Copied } else { Event::CopyFailed });
        // Landed before the turn came back: this rank moves its own copy to its
        // host tier, so the relief starts in the gap (a turn that comes back
        // here anyway restores it from there).
        if !self.settle(key, ok)
            && ok
            && let Some(slot) = self.slots.get(w.dp)
            && lock(slot).engine.demote(&key)
        {
            self.rebalanced.add(Event::Demoted);
        }
    }

    /// The copy of `key` ended (`ok`: landed): if the key's turn came here
    /// meanwhile, the twin lets its copy go (true).
    fn settle(self: &Arc<Self>, key: RetentionKey, ok: bool) -> bool {
        let Some(on) = self.rebalance.as_ref() else {
            return false;
        };
        let Some(t) = on.twins().ended(&key, ok) else {
            return false;
        };
        self.rebalanced.add(Event::Late);
        self.spawn_forget(t.peer, key, t.last);
        true
    }

    /// Tells `peer` to forget `key`'s copy ending at `last` (counted when it
    /// cannot be told).
    fn spawn_forget(self: &Arc<Self>, peer: SocketAddr, key: RetentionKey, last: BlockHash) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let rank = self.clone();
        rt.spawn(async move {
            let body = wire::forget_json(&key, last).to_string().into_bytes();
            let told = pull::post(&rank.legs, peer, wire::FORGET, body, rank.pull_timeout()).await;
            if !matches!(told, Ok((200, _))) {
                rank.rebalanced.add(Event::ForgetFailed);
            }
        });
    }

    /// `POST /pull/adopt` and `POST /pull/forget`. Bad calls answer 400, 405,
    /// 409 or 413 (`{"error": …}`, counted as `refused`); an adopt whose copy
    /// did not land answers 502.
    pub(super) async fn serve_rebalance(
        self: &Arc<Self>,
        path: &str,
        req: Request<Incoming>,
    ) -> Response<RankBody> {
        let answer = |status: StatusCode, v: Value| {
            full(status, "application/json", Bytes::from(v.to_string()))
        };
        let refuse = |status: StatusCode, why: String| {
            self.rebalanced.add(Event::Refused);
            answer(status, json!({ "error": why }))
        };
        if req.method() != Method::POST {
            return refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{path} accepts POST"),
            );
        }
        let Ok(body) = Limited::new(req.into_body(), pull::MAX_BODY)
            .collect()
            .await
        else {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a {path} body is at most {} bytes", pull::MAX_BODY),
            );
        };
        let body = body.to_bytes();
        if self.rebalance.is_none() {
            return refuse(
                StatusCode::CONFLICT,
                "rebalancing is off on this rank (--rebalance)".into(),
            );
        }
        if path == wire::FORGET {
            return match wire::forget_of(&body) {
                Ok((key, last)) => answer(
                    StatusCode::OK,
                    json!({ "forgotten": self.forget_here(&key, last) }),
                ),
                Err(why) => refuse(StatusCode::BAD_REQUEST, why),
            };
        }
        let a = match Adopt::from_json(&body) {
            Ok(a) => a,
            Err(why) => return refuse(StatusCode::BAD_REQUEST, why),
        };
        if a.fingerprint != self.fingerprint() {
            return refuse(
                StatusCode::CONFLICT,
                format!("fingerprint {:?} is not this rank's", a.fingerprint),
            );
        }
        // The copy runs to its end even if the caller hangs up.
        let rank = self.clone();
        match tokio::spawn(async move { rank.adopt(a).await }).await {
            Ok(Ok(v)) => answer(StatusCode::OK, v),
            Ok(Err((status, why))) => answer(status, json!({ "error": why })),
            Err(_) => answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "adopt failed"}),
            ),
        }
    }

    /// Lets `key`'s copy ending at `last` go on every DP rank (a newer state
    /// of the key stays); whether one was held.
    fn forget_here(&self, key: &RetentionKey, last: BlockHash) -> bool {
        let mut any = false;
        for s in &self.slots {
            let mut c = lock(s);
            let cache = c.engine.cache();
            let held = cache
                .device_record(key)
                .map(|r| &r.hashes)
                .or_else(|| cache.host().record(key).map(|r| &r.hashes))
                .is_some_and(|h| h.last() == Some(&last));
            if held {
                any |= c.engine.forget(key);
                drop(c);
                s.wake.notify_one();
            }
        }
        if any {
            if let Some(on) = self.rebalance.as_ref() {
                on.twins().remove(key);
            }
            self.rebalanced.add(Event::Released);
        }
        any
    }

    /// As the target: takes the copy and remembers the home as the key's twin.
    async fn adopt(self: Arc<Self>, a: Adopt) -> Result<Value, Refusal> {
        let key = a.marker.key;
        if let (Some(on), Some(&last)) = (self.rebalance.as_ref(), a.hashes.last()) {
            on.twins().start(key, a.from, Side::Target, last);
        }
        let dp = dp_rank(a.route_key, u32::try_from(self.slots.len()).unwrap_or(1)) as usize;
        let tokens = a.hashes.len() * self.cfg.args.block_size;
        let landed = self.take_copy(a, dp).await;
        self.rebalanced.add(if landed.is_ok() {
            Event::Adopted
        } else {
            Event::AdoptFailed
        });
        self.settle(key, landed.is_ok());
        let transferred = landed?;
        Ok(json!({ "tokens": tokens, "transferred": transferred, "dp_rank": dp }))
    }

    /// Leases the blocks this DP rank lacks from the home and retains the
    /// state through an unmetered one-token request whose prompt is the
    /// retained tokens plus one, the leased ones transferred over the KV link
    /// (as the simulator models the copy). The prompt tokens transferred.
    async fn take_copy(self: &Arc<Self>, a: Adopt, dp: usize) -> Result<usize, Refusal> {
        let failed = |why: String| (StatusCode::BAD_GATEWAY, why);
        let bs = self.cfg.args.block_size;
        let start = self.held_prefix(dp, &a.hashes);
        let mut lease = None;
        let mut kv_in_tokens = 0;
        if start < a.hashes.len() {
            let ask = Ask {
                key: resident_key(
                    a.marker.key.tenant.0,
                    a.marker.key.session.0,
                    a.marker.key.subagent.0,
                ),
                hashes: a.hashes.clone(),
                start,
                fingerprint: self.fingerprint(),
                puller: self.cfg.args.rank_id.clone().unwrap_or_default(),
            };
            let asked = Instant::now();
            let g = pull::ask(&self.legs, a.from, &ask, self.pull_timeout())
                .await
                .map_err(|o| failed(format!("the lease from {} failed: {}", a.from, o.name())))?;
            lease = g.lease.clone();
            if self.outlasts(&g, asked) {
                self.release_lease(a.from, lease);
                return Err(failed("the lease would end before the transfer".into()));
            }
            kv_in_tokens = (start + g.blocks) * bs;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let sim = SimRequest {
            id,
            prompt_tokens: a.hashes.len() * bs + 1,
            hashes: a.hashes,
            max_tokens: 1,
            marker: Some(a.marker),
            stream: false,
            kv_in_tokens,
        };
        let done = self.run_unmetered(sim, dp).await;
        self.release_lease(a.from, lease);
        done.map_err(failed)
    }

    /// Runs `sim` on DP rank `dp` outside the metrics; its transferred tokens.
    async fn run_unmetered(&self, sim: SimRequest, dp: usize) -> Result<usize, String> {
        let slot = self.slots.get(dp).ok_or("no such DP rank")?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let id = sim.id;
        {
            let mut c = lock(slot);
            let arrival = self.clock.now_ms().max(c.engine.clock());
            c.engine
                .submit_unmetered(sim, arrival)
                .map_err(|e| e.to_string())?;
            c.subs.insert(id, tx);
        }
        slot.wake.notify_one();
        match rx.recv().await {
            Some(EngineEvent::Done { outcome, .. }) => Ok(outcome.transferred_tokens),
            Some(EngineEvent::Failed { why, .. }) => Err(why),
            _ => Err("the engine dropped the copy".into()),
        }
    }

    fn release_lease(&self, from: SocketAddr, lease: Option<String>) {
        let (Some(id), Ok(rt)) = (lease, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let (client, wait) = (self.legs.clone(), self.pull_timeout());
        rt.spawn(async move {
            let _ = pull::release(&client, from, &id, wait).await;
        });
    }

    /// Polls every peer's `/load` each `--peer-poll-ms`, forever; a peer
    /// that does not answer within the period is unknown until it does.
    pub(super) async fn poll_peers(self: Arc<Self>) {
        let Some(on) = self.rebalance.as_ref() else {
            return;
        };
        let mut tick = tokio::time::interval(on.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let wait = crate::rebalance::poll_timeout(on.poll);
        loop {
            tick.tick().await;
            let mut calls = tokio::task::JoinSet::new();
            for (i, &addr) in on.peers.addrs.iter().enumerate() {
                if i != on.peers.me {
                    let client = self.legs.clone();
                    calls.spawn(async move { (i, peer_load(&client, addr, wait).await) });
                }
            }
            while let Some(r) = calls.join_next().await {
                if let Ok((i, s)) = r {
                    on.view().set(i, s, Instant::now());
                }
            }
        }
    }

    /// The rebalancing counters and gauges, Prometheus text.
    pub(super) fn rebalance_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP tether_rank_rebalance_total Rebalancing in tool gaps, by event (docs/rank.md)."
        );
        let _ = writeln!(out, "# TYPE tether_rank_rebalance_total counter");
        for e in Event::ALL {
            let _ = writeln!(
                out,
                "tether_rank_rebalance_total{{event=\"{}\"}} {}",
                e.name(),
                self.rebalanced.get(e)
            );
        }
        let (twins, known) = self.rebalance.as_ref().map_or((0, 0), |on| {
            (on.twins().len(), on.view().known(Instant::now()))
        });
        for (name, help, v) in [
            (
                "tether_rank_rebalance_twins",
                "Keys whose state this rank shares with a twin (copy crossing or landed).",
                twins,
            ),
            (
                "tether_rank_rebalance_peers_known",
                "Peers whose last /load poll answered (within the last three polls, at least 1 s).",
                known,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name} {v}");
        }
    }
}

/// One peer's `/load`, read as the rule's sample; `None` when it does not
/// answer 200 with a load report within `wait`.
async fn peer_load(client: &pull::Client, to: SocketAddr, wait: Duration) -> Option<Sample> {
    let call = async {
        let req = Request::get(format!("http://{to}/load"))
            .body(http_body_util::Full::new(Bytes::new()))
            .ok()?;
        let resp = client.request(req).await.ok()?;
        if resp.status() != StatusCode::OK {
            return None;
        }
        let body = Limited::new(resp.into_body(), MAX_LOAD_BYTES)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let r: LoadReport = serde_json::from_slice(&body).ok()?;
        Some(Sample::of_report(&r))
    };
    tokio::time::timeout(wait, call).await.ok().flatten()
}
