//! State pull on a running rank (`docs/rank.md` "State pull"): as the holder,
//! the lease endpoints, which read what the engines retain and schedule
//! nothing; as the new home, [`Rank::pull`], which asks the old holder for a
//! lease on the turn's retained blocks and hands them to the engine as
//! transferred KV (`SimRequest::kv_in_tokens`, timed on `--kv-link-gbps`).
//! The protocol and the lease table are [`crate::pull`].

use super::{Rank, RankBody, full, lock};
use crate::pull::{self, Ask, Grant, Outcome, Tier};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tether_engine::{BlockHash, RetentionKey};
use tether_placement::resident_key;

/// A pull's result for the request being served.
#[derive(Debug)]
pub struct Pulled {
    /// Leading prompt tokens whose KV came over the link (0 unless `Ok`).
    pub kv_in_tokens: usize,
    /// Whether a call went out (its time counts in the request's latency).
    pub asked: bool,
    /// Released when dropped (the transfer is over once the engine answers).
    pub lease: Option<LeaseGuard>,
}

/// Releases a granted lease on the holder when the request is done with it.
#[derive(Debug)]
pub struct LeaseGuard {
    rank: std::sync::Arc<Rank>,
    from: SocketAddr,
    id: String,
}

impl LeaseGuard {
    /// The holder the state came from.
    pub fn from(&self) -> SocketAddr {
        self.from
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let (rank, from, id) = (self.rank.clone(), self.from, std::mem::take(&mut self.id));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = pull::release(&rank.legs, from, &id, rank.pull_timeout()).await;
            });
        }
    }
}

impl Rank {
    pub(super) fn pull_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.args.pull_timeout_ms)
    }

    /// Model and KV shape: a holder serves only a puller whose blocks mean
    /// the same bytes (the connector's `fingerprint`).
    pub(super) fn fingerprint(&self) -> String {
        format!(
            "tether-rank/{}/{}/{}",
            self.cfg.profile_hash, self.cfg.args.block_size, self.cfg.profile.kv_bytes_per_token
        )
    }

    fn count_pull(&self, o: Outcome) -> Outcome {
        if let Some(i) = Outcome::ALL.iter().position(|x| *x == o) {
            self.pulls[i].fetch_add(1, Ordering::Relaxed);
        }
        o
    }

    /// The retained chain serving the most of `ask` past its start, over every
    /// DP rank (reading only: the engines schedule nothing for it).
    fn leasable(&self, ask: &Ask) -> Option<(Vec<BlockHash>, Tier)> {
        let mut best: Option<(Vec<BlockHash>, Tier)> = None;
        for s in &self.slots {
            let c = lock(s);
            let cache = c.engine.cache();
            let owner = cache
                .retained()
                .map(|(k, _, _)| k)
                .find(|k| resident_key(k.tenant.0, k.session.0, k.subagent.0) == ask.key);
            let Some(k) = owner else { continue };
            let chain = match (cache.device_record(&k), cache.host().record(&k)) {
                (Some(d), _) => (&d.hashes, Tier::Device),
                (None, Some(h)) => (&h.hashes, Tier::Host),
                (None, None) => continue,
            };
            let n = pull::matched(chain.0, &ask.hashes, ask.start);
            if n > 0 && best.as_ref().is_none_or(|(b, _)| n > b.len()) {
                let leased = chain.0.iter().skip(ask.start).take(n).copied().collect();
                best = Some((leased, chain.1));
            }
        }
        best
    }

    /// The new home's side: leases the key's retained blocks from `from`
    /// for a prompt of `hashes` served on DP rank `dp`. Never an error: a
    /// failed pull is counted and the prompt computed here.
    pub(super) async fn pull(
        self: &std::sync::Arc<Self>,
        from: SocketAddr,
        key: RetentionKey,
        hashes: &[BlockHash],
        dp: usize,
    ) -> Pulled {
        let none = |_: Outcome, asked| Pulled {
            kv_in_tokens: 0,
            asked,
            lease: None,
        };
        // Blocks this DP rank has already (its device, else its host tier:
        // an older state of the key, a shared prefix) are not asked for; the
        // holder leases what lies past them.
        let start = self.held_prefix(dp, hashes);
        if start >= hashes.len() {
            return none(self.count_pull(Outcome::HeldHere), false);
        }
        let ask = Ask {
            key: resident_key(key.tenant.0, key.session.0, key.subagent.0),
            hashes: hashes.to_vec(),
            start,
            fingerprint: self.fingerprint(),
            puller: self.cfg.args.rank_id.clone().unwrap_or_default(),
        };
        let asked = Instant::now();
        let g = match pull::ask(&self.legs, from, &ask, self.pull_timeout()).await {
            Ok(g) => g,
            Err(o) => return none(self.count_pull(o), true),
        };
        let guard = g.lease.clone().map(|id| LeaseGuard {
            rank: self.clone(),
            from,
            id,
        });
        let bs = self.cfg.args.block_size;
        if self.outlasts(&g, asked) {
            // Released by the guard's drop.
            return none(self.count_pull(Outcome::Expired), true);
        }
        self.count_pull(Outcome::Ok);
        Pulled {
            kv_in_tokens: (start + g.blocks) * bs,
            asked: true,
            lease: guard,
        }
    }

    /// Leading blocks of `hashes` DP rank `dp` holds already, on its device
    /// or its host tier.
    pub(super) fn held_prefix(&self, dp: usize, hashes: &[BlockHash]) -> usize {
        let c = lock(&self.slots[dp]);
        let cache = c.engine.cache();
        cache
            .peek_prefix(hashes)
            .max(cache.host().prefix_len(hashes))
    }

    /// Whether reading `g`'s blocks over this rank's KV link (at least their
    /// bytes ÷ the link, in wall time at `--speedup`) would end after the
    /// lease does: the holder may free them before the read completes.
    pub(super) fn outlasts(&self, g: &Grant, asked: Instant) -> bool {
        let bytes = (g.blocks * self.cfg.args.block_size) as f64
            * self.cfg.profile.kv_bytes_per_token as f64;
        let sim_ms = bytes / (self.cfg.args.kv_link_gbps * 1e6);
        let wall_ms = sim_ms / self.clock.speedup();
        asked.elapsed().as_secs_f64() * 1e3 + wall_ms >= g.lease_ms as f64
    }

    /// The holder's side: `POST /pull/lease`, `/pull/renew`, `/pull/release`
    /// (`docs/rank.md` "State pull"). Errors answer `{"error": …}`.
    pub(super) async fn serve_pull(
        &self,
        path: &str,
        req: Request<Incoming>,
    ) -> Response<RankBody> {
        let answer = |status: StatusCode, v: serde_json::Value| {
            full(status, "application/json", Bytes::from(v.to_string()))
        };
        let error = |status: StatusCode, why: String| {
            self.leases.refused.fetch_add(1, Ordering::Relaxed);
            answer(status, json!({ "error": why }))
        };
        if req.method() != Method::POST {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{path} accepts POST"),
            );
        }
        let body = match Limited::new(req.into_body(), pull::MAX_BODY)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a {path} body is at most {} bytes", pull::MAX_BODY),
                );
            }
        };
        let now = Instant::now();
        match path {
            pull::LEASE => {
                let ask = match Ask::from_json(&body) {
                    Ok(a) => a,
                    Err(why) => return error(StatusCode::BAD_REQUEST, why),
                };
                if ask.fingerprint != self.fingerprint() {
                    return error(
                        StatusCode::CONFLICT,
                        format!("fingerprint {:?} is not this rank's", ask.fingerprint),
                    );
                }
                let bb = self.cfg.args.block_size as u64 * self.cfg.profile.kv_bytes_per_token;
                let ttl = self.leases.ttl_ms();
                let v = match self.leasable(&ask) {
                    Some((blocks, tier)) => {
                        let id = self.leases.grant(now);
                        Grant::answer(Some(&id), ttl, ask.start, &blocks, bb, Some(tier))
                    }
                    None => {
                        self.leases.empty.fetch_add(1, Ordering::Relaxed);
                        Grant::answer(None, ttl, ask.start, &[], bb, None)
                    }
                };
                answer(StatusCode::OK, v)
            }
            pull::RENEW | pull::RELEASE => {
                let Some(id) = pull::lease_id(&body) else {
                    return error(StatusCode::BAD_REQUEST, "`lease` must be a lease id".into());
                };
                let live = if path == pull::RENEW {
                    self.leases.renew(&id, now)
                } else {
                    self.leases.release(&id, now)
                };
                match (live, path == pull::RENEW) {
                    (true, true) => {
                        answer(StatusCode::OK, json!({"lease_ms": self.leases.ttl_ms()}))
                    }
                    (true, false) => answer(StatusCode::OK, json!({})),
                    (false, _) => answer(StatusCode::NOT_FOUND, json!({"error": "unknown lease"})),
                }
            }
            _ => error(StatusCode::NOT_FOUND, format!("no endpoint {path}")),
        }
    }

    /// The pull and lease counters, Prometheus text.
    pub(super) fn pull_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP tether_rank_pulls_total State pulls this rank made as a migrated key's new home, by outcome."
        );
        let _ = writeln!(out, "# TYPE tether_rank_pulls_total counter");
        for (o, c) in Outcome::ALL.iter().zip(&self.pulls) {
            let _ = writeln!(
                out,
                "tether_rank_pulls_total{{outcome=\"{}\"}} {}",
                o.name(),
                c.load(Ordering::Relaxed)
            );
        }
        let l = &self.leases;
        let _ = writeln!(
            out,
            "# HELP tether_rank_pull_leases_total Lease calls this rank answered as a holder, by event."
        );
        let _ = writeln!(out, "# TYPE tether_rank_pull_leases_total counter");
        for (event, c) in [
            ("granted", &l.granted),
            ("empty", &l.empty),
            ("renewed", &l.renewed),
            ("released", &l.released),
            ("expired", &l.expired),
            ("refused", &l.refused),
        ] {
            let _ = writeln!(
                out,
                "tether_rank_pull_leases_total{{event=\"{event}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP tether_rank_pull_leases_active Leases this rank holds now."
        );
        let _ = writeln!(out, "# TYPE tether_rank_pull_leases_active gauge");
        let _ = writeln!(
            out,
            "tether_rank_pull_leases_active {}",
            l.active(Instant::now())
        );
    }
}
