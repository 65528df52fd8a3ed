//! Decide, don't grade: the baselines, then a search over the configuration
//! space one setting at a time (coupled vs P/D, routing, cache mode, chunk
//! budget, P/D threshold, `--max-num-seqs`), each candidate sized, simulated
//! and corrected; candidates whose profile-only cost is far above the best
//! simulated one are pruned before simulating. Under a target, headroom can be
//! spent on interactivity (`docs/planning.md`, "The search").

use super::demand::Work;
use super::fit::Planner;
use super::{PlanError, Settings, Spend, Variant};
use crate::sim::{CacheMode, Policy, Step};
use serde::Serialize;
use std::collections::HashMap;

/// A candidate whose profile-only cost exceeds the profile-only cost of the
/// best configuration so far by this factor is not simulated.
const PRUNE_FACTOR: f64 = 1.5;

/// Routing policies the search tries: those a real gateway can run (`oracle`
/// is a ceiling, the hashes of users and addresses are what tether replaces).
const POLICIES: [Policy; 6] = [
    Policy::TetherBounded,
    Policy::TetherResident,
    Policy::Tether,
    Policy::TetherLoad,
    Policy::Prefix,
    Policy::LeastLoaded,
];
/// Chunk budgets (`--max-num-batched-tokens`) tried.
const CHUNKS: [usize; 4] = [8192, 4096, 2048, 512];
/// P/D thresholds tried (uncached tokens above which a prefill goes remote).
const THRESHOLDS: [u64; 4] = [0, 512, 2048, 8192];
/// `--max-num-seqs` values tried.
const MAX_SEQS: [usize; 4] = [64, 128, 256, 512];
/// Decode-pool scales tried when spending headroom on interactivity.
const SPEND_SCALES: [f64; 5] = [1.25, 1.5, 2.0, 3.0, 4.0];

/// One step of the search.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchStep {
    /// The setting searched.
    pub step: String,
    /// Options simulated (pruned ones excluded).
    pub tried: usize,
    /// The configuration before the step.
    pub from: String,
    /// The choice.
    pub chose: String,
    /// $/Mtok before and after (simulated).
    pub usd_before: Option<f64>,
    /// After.
    pub usd_after: Option<f64>,
    /// What the step saved, $/Mtok (0 when it kept the setting).
    pub saved_usd_per_mtok: f64,
}

/// The search's state: every variant evaluated, memoized by configuration.
pub(super) struct Search<'p, 'a> {
    p: &'p Planner<'a>,
    hits: HashMap<(Policy, CacheMode), Vec<Work>>,
    by_settings: HashMap<Settings, usize>,
    guesses: HashMap<Settings, Option<f64>>,
    /// Every variant sized (and, unless infeasible, simulated).
    pub evaluated: Vec<Variant>,
    /// The steps taken.
    pub steps: Vec<SearchStep>,
    /// Candidates pruned before simulation.
    pub pruned: usize,
}

/// Better for the search: meeting beats missing; among the meeting, cheaper;
/// among the missing, the smaller worst miss.
fn better(a: &Variant, b: &Variant) -> bool {
    match (a.meets(), b.meets()) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.usd_per_mtok().unwrap_or(f64::MAX) < b.usd_per_mtok().unwrap_or(f64::MAX),
        (false, false) => {
            let (x, y) = (a.worst_miss(), b.worst_miss());
            match (a.simulated.is_some(), b.simulated.is_some()) {
                (true, false) => true,
                (false, true) => false,
                _ => x < y,
            }
        }
    }
}

impl<'p, 'a> Search<'p, 'a> {
    pub fn new(p: &'p Planner<'a>) -> Self {
        Self {
            p,
            hits: HashMap::new(),
            by_settings: HashMap::new(),
            guesses: HashMap::new(),
            evaluated: Vec::new(),
            steps: Vec::new(),
            pruned: 0,
        }
    }

    /// The expected hits of `s`'s routing and cache (simulated once each).
    pub fn work(&mut self, s: &Settings) -> Result<Vec<Work>, PlanError> {
        let key = (s.policy, s.cache);
        if let Some(w) = self.hits.get(&key) {
            return Ok(w.clone());
        }
        let w = self.p.hits(s)?;
        self.hits.insert(key, w.clone());
        Ok(w)
    }

    /// Sizes, simulates and corrects `s` (once; later calls return the same).
    fn eval(&mut self, name: &str, what: String, s: Settings) -> Result<usize, PlanError> {
        if let Some(&i) = self.by_settings.get(&s) {
            return Ok(i);
        }
        let n = self.evaluated.len() as u64;
        self.p.obs.at(n);
        self.p.obs.note(&format!("{name}: {}", s.describe()));
        let work = self.work(&s)?;
        let v = self.p.variant(name, what, &s, &work)?;
        self.evaluated.push(v);
        self.p.obs.at(n + 1);
        let i = self.evaluated.len() - 1;
        self.by_settings.insert(s, i);
        Ok(i)
    }

    /// The profile's cost of `s` without simulating it; `None` when no fleet fits.
    fn analytic(&mut self, s: &Settings) -> Result<Option<f64>, PlanError> {
        if let Some(x) = self.guesses.get(s) {
            return Ok(*x);
        }
        let work = self.work(s)?;
        let x = self
            .p
            .size(&work, s, &self.p.cfg.slo)
            .ok()
            .map(|(steps, _)| {
                let (a, b, _) = self.p.predicted_hours(&steps, &work, s);
                self.p.predicted_usd(a + b)
            });
        self.guesses.insert(*s, x);
        Ok(x)
    }

    /// The baselines: the starting P/D configuration, coupled at its best
    /// chunk budget, routing without retention, and no reuse (Dynamo-sized).
    pub fn baselines(&mut self, start: &Settings) -> Result<(), PlanError> {
        let (policy, cache) = (start.policy.name(), start.cache.name());
        self.eval(
            "plan",
            format!("P/D, {policy} + {cache}: prefill and decode scaled separately on the expected cache hits"),
            *start,
        )?;
        let mut best: Option<usize> = None;
        for budget in [start.max_num_batched_tokens, 2048, 512] {
            if budget < start.max_num_seqs {
                continue;
            }
            let s = Settings {
                disaggregated: false,
                max_num_batched_tokens: budget,
                ..*start
            };
            let i = self.eval(
                "coupled",
                format!("aggregated, {policy} + {cache}, --max-num-batched-tokens {budget}: prefill and decode on the same engines"),
                s,
            )?;
            if best.is_none_or(|b| better(&self.evaluated[i], &self.evaluated[b])) {
                best = Some(i);
            }
        }
        // Only the best chunk budget keeps the name `coupled`.
        for (k, v) in self.evaluated.iter_mut().enumerate() {
            if v.name == "coupled" && Some(k) != best {
                v.name = "coupled-chunk".into();
            }
        }
        self.eval(
            "routing-only",
            format!("P/D, {policy} + lru: session routing without turn-boundary retention"),
            Settings {
                cache: CacheMode::Lru,
                ..*start
            },
        )?;
        let v = super::baseline::no_reuse(self.p, start)?;
        self.by_settings.insert(v.settings, self.evaluated.len());
        self.evaluated.push(v);
        Ok(())
    }

    /// The best variant so far.
    fn best(&self) -> Option<usize> {
        (0..self.evaluated.len()).reduce(|a, b| {
            if better(&self.evaluated[b], &self.evaluated[a]) {
                b
            } else {
                a
            }
        })
    }

    /// One step: tries `options` beside `current` and moves to the best.
    fn step(
        &mut self,
        label: &str,
        current: usize,
        options: Vec<Settings>,
    ) -> Result<usize, PlanError> {
        let from = self.evaluated[current].settings;
        let before = self.evaluated[current].usd_per_mtok();
        let mut best = current;
        let mut tried = 0;
        for s in options {
            if s == from {
                continue;
            }
            if !self.by_settings.contains_key(&s) {
                // Profile-only guesses compared with each other (the
                // simulation trims both alike).
                let bar = match self.best().filter(|&b| self.evaluated[b].meets()) {
                    Some(b) => {
                        let settings = self.evaluated[b].settings;
                        self.analytic(&settings)?
                    }
                    None => None,
                };
                if let (Some(bar), Some(guess)) = (bar, self.analytic(&s)?)
                    && guess > bar * PRUNE_FACTOR
                {
                    self.pruned += 1;
                    continue;
                }
                tried += 1;
            }
            let n = self.evaluated.len();
            let i = self.eval(&format!("search-{n}"), s.describe(), s)?;
            if better(&self.evaluated[i], &self.evaluated[best]) {
                best = i;
            }
        }
        let after = self.evaluated[best].usd_per_mtok();
        self.steps.push(SearchStep {
            step: label.to_owned(),
            tried,
            from: from.describe(),
            chose: self.evaluated[best].settings.describe(),
            usd_before: before,
            usd_after: after,
            saved_usd_per_mtok: match (before, after) {
                (Some(b), Some(a)) if best != current => b - a,
                _ => 0.0,
            },
        });
        Ok(best)
    }

    /// The search, one setting at a time from the better of the starting
    /// P/D configuration and coupled.
    pub fn run(&mut self, start: &Settings) -> Result<(), PlanError> {
        let mut cur = self.by_settings.get(start).copied().unwrap_or(0);
        let s0 = self.evaluated[cur].settings;
        cur = self.step(
            "split: P/D or coupled",
            cur,
            vec![Settings {
                disaggregated: !s0.disaggregated,
                ..s0
            }],
        )?;
        let s = self.evaluated[cur].settings;
        cur = self.step(
            "routing policy",
            cur,
            POLICIES
                .iter()
                .map(|&policy| Settings { policy, ..s })
                .collect(),
        )?;
        let s = self.evaluated[cur].settings;
        cur = self.step(
            "cache mode",
            cur,
            CacheMode::ALL
                .iter()
                .map(|&cache| Settings { cache, ..s })
                .collect(),
        )?;
        let s = self.evaluated[cur].settings;
        cur = self.step(
            "chunk budget (--max-num-batched-tokens)",
            cur,
            CHUNKS
                .iter()
                .filter(|&&c| c >= s.max_num_seqs)
                .map(|&max_num_batched_tokens| Settings {
                    max_num_batched_tokens,
                    ..s
                })
                .collect(),
        )?;
        let s = self.evaluated[cur].settings;
        if s.disaggregated {
            cur = self.step(
                "P/D threshold",
                cur,
                THRESHOLDS
                    .iter()
                    .map(|&pd_threshold_tokens| Settings {
                        pd_threshold_tokens,
                        ..s
                    })
                    .collect(),
            )?;
        }
        let s = self.evaluated[cur].settings;
        self.step(
            "--max-num-seqs",
            cur,
            MAX_SEQS
                .iter()
                .filter(|&&m| m <= s.max_num_batched_tokens)
                .map(|&max_num_seqs| Settings { max_num_seqs, ..s })
                .collect(),
        )?;
        Ok(())
    }

    /// Under the target: the cheapest configuration's decode pool scaled up
    /// while it stays within `target` $/Mtok, each scale simulated.
    pub fn spend_on_interactivity(&mut self, target: f64) -> Result<(), PlanError> {
        let Some(b) = self.best().filter(|&b| self.evaluated[b].meets()) else {
            return Ok(());
        };
        let base = self.evaluated[b].clone();
        if base.usd_per_mtok().is_none_or(|c| c >= target) {
            return Ok(());
        }
        let work = self.work(&base.settings)?;
        for k in SPEND_SCALES {
            let steps: Vec<Step> = base
                .steps
                .iter()
                .map(|s| Step {
                    decode: ((s.decode as f64) * k).ceil() as usize,
                    ..*s
                })
                .collect();
            let (pre, dec, _) = self.p.predicted_hours(&steps, &work, &base.settings);
            if self.p.predicted_usd(pre + dec) > target * 1.1 {
                break;
            }
            let (report, _) = self.p.run(&base.settings, &steps, false)?;
            let met = self.p.misses(&report).is_empty();
            let sizes: Vec<_> = steps
                .iter()
                .map(|_| {
                    (
                        super::size::Size::of(0, super::size::Binding::Minimum),
                        super::size::Size::of(0, super::size::Binding::Minimum),
                    )
                })
                .collect();
            let v = self.p.finish(
                &format!("spent-x{k}"),
                format!(
                    "{} with its decode pool x{k}: headroom spent on interactivity",
                    base.name
                ),
                &base.settings,
                &work,
                steps,
                &sizes,
                report,
                met,
                1,
            );
            let over = v.usd_per_mtok().is_none_or(|c| c > target);
            self.evaluated.push(v);
            if over {
                break;
            }
        }
        Ok(())
    }

    /// The chosen configuration and the runner-up: the cheapest meeting every
    /// objective (with `spend`, the best interactivity among those within the
    /// target), and the next.
    pub fn choose(
        &self,
        target: Option<f64>,
        spend: Option<Spend>,
    ) -> (Option<usize>, Option<usize>) {
        let mut ok: Vec<usize> = (0..self.evaluated.len())
            .filter(|&i| self.evaluated[i].meets() && self.evaluated[i].usd_per_mtok().is_some())
            .collect();
        let cost = |i: &usize| self.evaluated[*i].usd_per_mtok().unwrap_or(f64::MAX);
        ok.sort_by(|a, b| cost(a).total_cmp(&cost(b)));
        if let (Some(Spend::Interactivity), Some(t)) = (spend, target) {
            let inter = |i: &usize| {
                self.evaluated[*i]
                    .simulated
                    .as_ref()
                    .map_or(0.0, |r| r.sim.interactivity_tok_s)
            };
            let mut within: Vec<usize> = ok.iter().copied().filter(|i| cost(i) <= t).collect();
            within.sort_by(|a, b| {
                inter(b)
                    .total_cmp(&inter(a))
                    .then(cost(a).total_cmp(&cost(b)))
            });
            if let Some(&c) = within.first() {
                let r = ok.iter().copied().find(|&i| i != c);
                return (Some(c), r);
            }
        }
        (ok.first().copied(), ok.get(1).copied())
    }
}
