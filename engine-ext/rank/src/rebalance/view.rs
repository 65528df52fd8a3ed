//! What a rank knows of its peers' load: their `/load` reports, polled every
//! `--peer-poll-ms` ([`tether_placement::load::report::LoadReport`]), reduced
//! to what the rebalancing rule reads ([`tether_placement::Loads`]).

use std::time::{Duration, Instant};
use tether_placement::load::report::LoadReport;

/// One endpoint's load as the rule reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Requests running + waiting over its DP ranks (`server_load`).
    pub requests: f64,
    /// Device KV in use, 0–1: the mean over its DP ranks.
    pub kv_usage: f64,
    /// Prompt tokens queued for prefill over its DP ranks.
    pub backlog: f64,
}

impl Sample {
    /// From a `/load` report.
    pub fn of_report(r: &LoadReport) -> Sample {
        let n = r.ranks.len().max(1) as f64;
        Sample {
            requests: r.server_load as f64,
            kv_usage: r.ranks.iter().map(|x| x.kv_usage).sum::<f64>() / n,
            backlog: r.queued_prefill_tokens() as f64,
        }
    }
}

/// The rule's three vectors, by endpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Vectors {
    pub requests: Vec<f64>,
    pub kv_usage: Vec<f64>,
    pub backlog: Vec<f64>,
}

impl Vectors {
    /// Borrowed as the rule takes them.
    pub fn loads(&self) -> tether_placement::Loads<'_> {
        tether_placement::Loads {
            requests: &self.requests,
            kv_usage: &self.kv_usage,
            backlog: &self.backlog,
        }
    }
}

/// Each endpoint's last good sample and when it came.
#[derive(Debug, Clone)]
pub struct View {
    samples: Vec<Option<(Sample, Instant)>>,
    max_age: Duration,
}

impl View {
    /// `n` endpoints, none known; a sample older than `max_age` is unknown.
    pub fn new(n: usize, max_age: Duration) -> Self {
        Self {
            samples: vec![None; n],
            max_age,
        }
    }

    /// Endpoint `i`'s poll answered `s` (or, `None`, did not answer).
    pub fn set(&mut self, i: usize, s: Option<Sample>, now: Instant) {
        if let Some(slot) = self.samples.get_mut(i) {
            *slot = s.map(|s| (s, now));
        }
    }

    fn fresh(&self, i: usize, now: Instant) -> Option<Sample> {
        let (s, at) = self.samples.get(i).copied().flatten()?;
        (now.saturating_duration_since(at) <= self.max_age).then_some(s)
    }

    /// Endpoints with a fresh sample.
    pub fn known(&self, now: Instant) -> usize {
        (0..self.samples.len())
            .filter(|&i| self.fresh(i, now).is_some())
            .count()
    }

    /// The rule's view: endpoint `me` as `own` (its fresh gauges), every other
    /// from its fresh sample. An unknown endpoint is never a target: it is
    /// given an infinite prefill backlog (the rule wants a target's no longer
    /// than the home's), no requests and the known endpoints' mean KV, so it
    /// moves neither the bound's total nor the mean.
    pub fn vectors(&self, me: usize, own: Sample, now: Instant) -> Vectors {
        let n = self.samples.len();
        let known: Vec<Option<Sample>> = (0..n)
            .map(|i| {
                if i == me {
                    Some(own)
                } else {
                    self.fresh(i, now)
                }
            })
            .collect();
        let seen: Vec<Sample> = known.iter().flatten().copied().collect();
        let mean_kv = seen.iter().map(|s| s.kv_usage).sum::<f64>() / seen.len().max(1) as f64;
        let mut v = Vectors::default();
        for k in known {
            let s = k.unwrap_or(Sample {
                requests: 0.0,
                kv_usage: mean_kv,
                backlog: f64::INFINITY,
            });
            v.requests.push(s.requests);
            v.kv_usage.push(s.kv_usage);
            v.backlog.push(s.backlog);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_placement::load::report::RankLoad;
    use tether_placement::{Endpoint, LoadBound, MoveCost, Placement, Rebalance, Rule, Unseen};

    fn s(requests: f64, kv_usage: f64, backlog: f64) -> Sample {
        Sample {
            requests,
            kv_usage,
            backlog,
        }
    }

    #[test]
    fn a_report_reads_as_its_dp_ranks_together() {
        let rank = |kv, q| RankLoad {
            dp_rank: 0,
            running: 1,
            waiting: 0,
            restoring: 0,
            queued_prefill_tokens: q,
            kv_usage: kv,
            kv_blocks: 10,
            retentions: 0,
            busy: 0.0,
            prefill_tokens_per_s: 0.0,
        };
        let r = LoadReport {
            server_load: 3,
            sim_ms: 0.0,
            speedup: 1.0,
            ranks: vec![rank(0.2, 10), rank(0.6, 5)],
            residency: None,
        };
        assert_eq!(Sample::of_report(&r), s(3.0, 0.4, 15.0));
    }

    #[test]
    fn an_unknown_or_stale_peer_is_never_the_target() {
        let eps: Vec<Endpoint> = (0..3)
            .map(|i| Endpoint {
                address: format!("127.0.0.1:{}", i + 1),
                weight: 1.0,
                dp_size: 1,
                name: None,
            })
            .collect();
        let p = Placement::new(&eps);
        let rule = Rule {
            candidates: 3,
            bound: LoadBound {
                factor: 1.5,
                floor: 1.0,
            },
            cost: MoveCost::from_link(1.0, 50.0, 5.0, 20_000.0),
            unseen: Unseen::LeastLoaded,
            over_bound: tether_placement::OverBound::Move,
        };
        let t0 = Instant::now();
        let mut v = View::new(3, Duration::from_millis(600));
        v.set(1, Some(s(0.0, 0.0, 0.0)), t0);
        v.set(2, Some(s(0.0, 0.1, 0.0)), t0);
        let hot = s(0.0, 0.9, 0.0);
        let target = |v: &View, now| {
            p.rebalance_target(
                7,
                0,
                &rule,
                Rebalance::default(),
                v.vectors(0, hot, now).loads(),
                0.1,
            )
        };
        assert_eq!(target(&v, t0), Some(1), "the emptiest");
        assert_eq!(v.known(t0), 2);
        v.set(1, None, t0);
        assert_eq!(target(&v, t0), Some(2), "1 did not answer");
        let later = t0 + Duration::from_millis(700);
        assert_eq!(v.known(later), 0);
        assert_eq!(target(&v, later), None, "every peer stale");
        // An unknown peer moves neither the mean nor the bound's total.
        let x = v.vectors(0, hot, later);
        assert_eq!(x.kv_usage, vec![0.9, 0.9, 0.9]);
        assert_eq!(x.requests, vec![0.0, 0.0, 0.0]);
    }
}
