//! `tether replay --route resident`: the replay places each request over its
//! targets (ranks) as the gateway filter's residency-aware pick does — the
//! same `tether_placement::resident` rule on a `/load` view it polls itself —
//! and sends what the gateway would add: the turn markers the ranks retain
//! by and, for a migration, the state's old home — `x-tether-pull-from` (the
//! new rank pulls the state; `--migrate pull`, the default) or
//! `x-prefiller-host-port` (a prefill leg there; `--migrate leg`).
//! `docs/cli.md` ("--route") states the flags.

use super::client::Client;
use crate::sim::Migrate;
use crate::sim::identity::request_key;
use crate::trace::{RequestId, Trace};
use std::sync::RwLock;
use std::time::{Duration, Instant};
use tether_engine::RetentionKey;
use tether_placement::load::report::LoadReport;
use tether_placement::{Endpoint, How, Knows, Placement, Resident, Rule, hash_parts, resident_key};
use tether_wire::headers;

/// One target's last `/load` reply.
#[derive(Debug, Clone)]
struct Polled {
    at: Instant,
    load: f64,
    /// Prompt tokens still to compute.
    backlog: f64,
    /// The target's prefill rate, tokens/s, when it reports one.
    rate: Option<f64>,
    /// `None`: the reply had no (usable) residency summary.
    resident: Option<Resident>,
}

/// The placement state of a resident replay: the targets, the rule, the view.
#[derive(Debug)]
pub struct ResidentRoute {
    placement: Placement,
    origins: Vec<String>,
    rule: Rule,
    max_age: Duration,
    /// How a migrated state moves: which header names the old home.
    migrate: Migrate,
    /// Backlogs as waits at each target's reported rate (else the rule's).
    own_rates: bool,
    view: RwLock<Vec<Option<Polled>>>,
}

/// Where one request goes and what it carries besides the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// Target index.
    pub target: usize,
    pub how: How,
    /// Headers to add: markers, and for a migration `x-tether-pull-from`
    /// (pull) or `x-prefiller-host-port` (leg).
    pub headers: Vec<(String, String)>,
}

impl ResidentRoute {
    /// Targets as `http://host:port` origins; `max_age` after which a reply
    /// no longer counts (its residency becomes unknown, its load 0).
    pub fn new(origins: &[String], rule: Rule, max_age: Duration) -> Self {
        let eps: Vec<Endpoint> = origins
            .iter()
            .map(|o| Endpoint {
                address: o.trim_start_matches("http://").to_owned(),
                weight: 1.0,
                dp_size: 1,
                name: None,
            })
            .collect();
        Self {
            placement: Placement::new(&eps),
            origins: origins.to_vec(),
            rule,
            max_age,
            migrate: Migrate::Pull,
            own_rates: true,
            view: RwLock::new(vec![None; origins.len()]),
        }
    }

    /// The same route reading each target's own prefill rate (`true`, the
    /// default) or the rule's for every target.
    pub fn reading_rates(mut self, own: bool) -> Self {
        self.own_rates = own;
        self
    }

    /// The same route with migrations sent as `m` moves them (default: pull).
    pub fn migrating(mut self, m: Migrate) -> Self {
        self.migrate = m;
        self
    }

    /// Polls every target's `/load` once; returns the problems met (a target
    /// that did not answer keeps its last reply: [`Self::route`] reads its
    /// load beside fresher ones and its residency only while fresh).
    ///
    /// The targets are asked all at once, as the filter's tick dispatches its
    /// polls: a round lasts as long as its slowest reply, not the sum of them,
    /// so one busy rank does not age every other target's reply.
    pub async fn poll(&self, client: &Client) -> Vec<String> {
        let mut asks = tokio::task::JoinSet::new();
        for (i, o) in self.origins.iter().enumerate() {
            let (client, o) = (client.clone(), o.clone());
            asks.spawn(async move {
                let got = client.get_text(&format!("{o}/load")).await;
                (i, o, got, Instant::now())
            });
        }
        let mut problems = Vec::new();
        while let Some(asked) = asks.join_next().await {
            let (i, o, got, at) = match asked {
                Ok(a) => a,
                Err(e) => {
                    problems.push(format!("a /load poll did not finish: {e}"));
                    continue;
                }
            };
            let polled = match got {
                Ok(text) => match serde_json::from_str::<LoadReport>(&text) {
                    Ok(r) => {
                        let resident = match r.residency.as_ref().map(Resident::decode) {
                            Some(Ok(res)) => Some(res),
                            Some(Err(e)) => {
                                problems.push(format!("{o}/load: {e}"));
                                None
                            }
                            None => None,
                        };
                        Polled {
                            at,
                            // As the filter weighs it: requests in flight, ties by busy share.
                            load: tether_placement::resident_load(
                                r.server_load as f64,
                                r.busy(),
                                tether_placement::BUSY_WEIGHT,
                            ),
                            backlog: r.queued_prefill_tokens() as f64,
                            rate: r.prefill_tokens_per_s(),
                            resident,
                        }
                    }
                    Err(e) => {
                        problems.push(format!("{o}/load: not a load report: {e}"));
                        continue;
                    }
                },
                Err(e) => {
                    problems.push(e.to_string());
                    continue;
                }
            };
            if let Ok(mut v) = self.view.write()
                && let Some(slot) = v.get_mut(i)
            {
                *slot = Some(polled);
            }
        }
        problems
    }

    /// Places request `r` of `trace`; `salt` as the replay's `--salt` (mixed
    /// into the session id the markers carry, so two salted replays share no
    /// retained state).
    pub fn route(&self, trace: &Trace, r: RequestId, salt: &str) -> Option<Routed> {
        let (key, mut rk) = request_key(trace, r);
        if !salt.is_empty() {
            rk = salted(rk, salt);
        }
        let rkey = resident_key(rk.tenant.0, rk.session.0, rk.subagent.0);
        let now = Instant::now();
        let view = self.view.read().ok()?;
        let fresh = |i: usize| {
            view.get(i)
                .and_then(Option::as_ref)
                .filter(|p| now.duration_since(p.at) <= self.max_age)
        };
        // As the filter's load view: no fresh reply, no view (all 0); beside
        // fresh ones a stale reply keeps its load (the rank too busy to answer
        // is not read as idle). Residency is known only from fresh replies.
        let live = (0..self.origins.len()).any(|i| fresh(i).is_some());
        let last = |i: usize| view.get(i).and_then(Option::as_ref).filter(|_| live);
        let loads: Vec<f64> = (0..self.origins.len())
            .map(|i| last(i).map_or(0.0, |p| p.load))
            .collect();
        // Backlogs as waits, at each target's own rate where it reports one.
        let waits: Vec<f64> = (0..self.origins.len())
            .map(|i| {
                last(i).map_or(0.0, |p| {
                    let rate = p.rate.filter(|_| self.own_rates);
                    self.rule.cost.wait_ms(p.backlog, rate)
                })
            })
            .collect();
        let knows = |i: usize| match fresh(i).and_then(|p| p.resident.as_ref()) {
            None => Knows::Unknown,
            Some(res) => res.get(rkey).map_or(Knows::Nothing, Knows::Holds),
        };
        let choice = self.placement.place_resident_in(
            key,
            self.rule.candidates.saturating_sub(1),
            &self.rule,
            &loads,
            &waits,
            knows,
        )?;
        let target = choice.endpoint()?;
        let mut headers = markers(trace, r, &rk);
        if let How::Migrate { from } = choice.how {
            let addr = self.placement.endpoints().get(from)?.address.clone();
            let name = match self.migrate {
                Migrate::Pull => headers::PULL_FROM,
                Migrate::Leg => headers::PREFILLER,
            };
            headers.push((name.to_owned(), addr));
        }
        Some(Routed {
            target,
            how: choice.how,
            headers,
        })
    }
}

/// The retention key with the salt mixed into its session hash.
fn salted(rk: RetentionKey, salt: &str) -> RetentionKey {
    let s = hash_parts(&[b"salt", salt.as_bytes(), &rk.session.0.to_le_bytes()]);
    RetentionKey {
        session: tether_wire::HexId(u128::from(s)),
        ..rk
    }
}

/// The turn markers a gateway would send for request `r` (`docs/wire.md`).
fn markers(trace: &Trace, r: RequestId, rk: &RetentionKey) -> Vec<(String, String)> {
    let req = trace.request(r);
    let hex = |v: u128| format!("{v:016x}");
    let mut h = vec![
        (headers::SESSION.to_owned(), hex(rk.session.0)),
        (headers::PROMPT_END.to_owned(), "1".to_owned()),
        (
            headers::TURN_KIND.to_owned(),
            req.opened_by.name().to_owned(),
        ),
    ];
    if rk.tenant.0 != 0 {
        h.push((headers::TENANT.to_owned(), hex(rk.tenant.0)));
    }
    if rk.subagent.0 != 0 {
        h.push((headers::SUBAGENT.to_owned(), hex(rk.subagent.0)));
    }
    h
}

#[cfg(test)]
mod tests;
