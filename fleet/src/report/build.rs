//! Observations + trace + serving configuration → a [`Report`]: counts, token
//! totals, hit ratios beside the trace's ideal, avoidable re-prefill at the
//! placement the replay saw, latency quantiles, per-engine load, cost, plot series.

use super::config::ServingConfig;
use super::model::{
    Bucket, Cost, Dist, EngineLoad, FORMAT, HitRatio, Latency, Load, Report, Reprefill, Requests,
    RunInfo, Series, Tokens, TraceInfo, VERSION,
};
use super::observe::{Clock, Observation, Outcome};
use crate::quantile;
use crate::trace::{RequestId, SessionId, Trace, content_hash};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What [`build`] needs besides the observations.
#[derive(Debug)]
pub struct BuildInput<'a> {
    /// The trace replayed.
    pub trace: &'a Trace,
    /// Its file, as given.
    pub trace_path: String,
    /// The format it was read as.
    pub trace_format: String,
    /// The sessions replayed (all, unless the replay was limited).
    pub sessions: &'a [SessionId],
    /// One per request sent, in any order.
    pub observations: &'a [Observation],
    /// How the run went (`clock` is filled in here).
    pub run: RunInfo,
    /// The configuration in force.
    pub config: ServingConfig,
    /// Simulated busy seconds per engine during the run (`rank#dp`), scraped
    /// from the ranks' `/metrics`; empty when not scraped.
    pub busy_s: BTreeMap<String, f64>,
}

/// Prompt tokens an infinite prefix cache would serve to each request of
/// `order` (in that order), where `cache_of` names the cache a request reads
/// and fills: one per session = perfect affinity, one per rank = the placement
/// seen, one for all = the global bound. Capped at `input − 1`: an engine
/// recomputes the last prompt token even when everything is cached.
pub fn infinite_cache_hits(
    trace: &Trace,
    order: &[RequestId],
    mut cache_of: impl FnMut(RequestId) -> u64,
) -> HashMap<RequestId, u64> {
    let store = trace.blocks();
    let bs = u64::from(trace.block_size());
    let mut seen: HashSet<(u64, usize)> = HashSet::new();
    let mut path = Vec::new();
    let mut out = HashMap::with_capacity(order.len());
    for &id in order {
        let c = cache_of(id);
        let req = trace.request(id);
        store.path_into(req.blocks, &mut path);
        let mut blocks = 0u64;
        for n in &path {
            if !seen.contains(&(c, n.node())) {
                break;
            }
            blocks += store.segment_len(*n) as u64;
        }
        for n in &path {
            seen.insert((c, n.node()));
        }
        let input = u64::from(req.input_tokens);
        out.insert(id, (blocks * bs).min(input.saturating_sub(1)));
    }
    out
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn max_over_mean(vals: &[u64], n: usize) -> Option<f64> {
    let n = n.max(vals.len());
    let total: u64 = vals.iter().sum();
    if n == 0 || total == 0 {
        return None;
    }
    let mean = total as f64 / n as f64;
    Some(*vals.iter().max()? as f64 / mean)
}

/// Engines the configuration has: `rank#i` for each scraped rank's DP ranks.
fn configured_engines(config: &ServingConfig) -> Vec<String> {
    let mut out = Vec::new();
    for r in &config.ranks {
        let dp = r
            .config
            .get("serving")
            .and_then(|s| s.get("dp_size"))
            .and_then(|d| d.as_u64())
            .unwrap_or(1);
        for i in 0..dp {
            out.push(format!("{}#{i}", r.rank));
        }
    }
    out
}

/// Builds the report.
pub fn build(input: BuildInput<'_>) -> Report {
    let BuildInput {
        trace,
        trace_path,
        trace_format,
        sessions,
        observations,
        mut run,
        config,
        busy_s,
    } = input;

    // The requests in scope, each session's first, the session of each.
    let mut in_scope: Vec<RequestId> = Vec::new();
    let mut first: HashSet<RequestId> = HashSet::new();
    let mut session_order: Vec<RequestId> = Vec::new();
    for &s in sessions {
        let reqs = trace.session_requests(s);
        if let Some(&f) = reqs.first() {
            first.insert(f);
        }
        session_order.extend_from_slice(&reqs);
        in_scope.extend(reqs);
    }
    let scope: HashSet<RequestId> = in_scope.iter().copied().collect();
    let mut arrival_order: Vec<RequestId> = trace
        .by_arrival()
        .into_iter()
        .filter(|r| scope.contains(r))
        .collect();
    if arrival_order.len() != in_scope.len() {
        // Sessions without a shared timeline: session order is the only order.
        arrival_order = session_order.clone();
    }

    // The trace's ideal.
    let ideal_session = infinite_cache_hits(trace, &session_order, |r| {
        u64::from(trace.request(r).session.0)
    });
    let ideal_global = infinite_cache_hits(trace, &arrival_order, |_| 0);
    let input_of = |r: RequestId| u64::from(trace.request(r).input_tokens);
    let total_in: u64 = in_scope.iter().map(|&r| input_of(r)).sum();
    let ret_in: u64 = in_scope
        .iter()
        .filter(|r| !first.contains(r))
        .map(|&r| input_of(r))
        .sum();
    let ideal_s: u64 = ideal_session.values().sum();
    let ideal_s_ret: u64 = ideal_session
        .iter()
        .filter(|(r, _)| !first.contains(r))
        .map(|(_, v)| v)
        .sum();
    let ideal_g: u64 = ideal_global.values().sum();

    // Counts and totals.
    let mut requests = Requests {
        in_trace: in_scope.len() as u64,
        sent: observations.len() as u64,
        ..Default::default()
    };
    let mut tokens = Tokens::default();
    let (mut dev, mut restored, mut dev_known, mut res_known) = (0u64, 0u64, true, true);
    let (mut ret_prompt, mut ret_cached) = (0u64, 0u64);
    let (mut ttft, mut itl, mut e2e, mut queue, mut tps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut clocks: HashSet<Clock> = HashSet::new();
    let mut per_engine: BTreeMap<String, EngineLoad> = BTreeMap::new();
    let mut unattributed = 0u64;
    for o in observations {
        match &o.outcome {
            Outcome::Failed { kind, .. } => {
                requests.errors += 1;
                *requests.errors_by_kind.entry(kind.name()).or_default() += 1;
            }
            Outcome::Served(s) => {
                requests.completed += 1;
                if s.attempts > 1 {
                    requests.retried += 1;
                }
                let cached = s.cached_tokens.min(s.prompt_tokens);
                tokens.prompt += s.prompt_tokens;
                tokens.cached += cached;
                tokens.computed += s.prompt_tokens - cached;
                tokens.output += s.output_tokens;
                match s.device_cached_tokens {
                    Some(d) => dev += d,
                    None => dev_known = false,
                }
                match s.restored_tokens {
                    Some(d) => restored += d,
                    None => res_known = false,
                }
                if !first.contains(&RequestId(o.request)) {
                    ret_prompt += s.prompt_tokens;
                    ret_cached += cached;
                }
                let t = &s.timing;
                clocks.insert(t.clock);
                ttft.push(t.ttft_ms);
                e2e.push(t.e2e_ms);
                if let Some(i) = t.itl_ms {
                    itl.push(i);
                }
                if let Some(q) = t.queue_ms {
                    queue.push(q);
                }
                let decode_ms = t.e2e_ms - t.ttft_ms;
                if s.output_tokens > 1 && decode_ms > 0.0 {
                    tps.push((s.output_tokens - 1) as f64 / (decode_ms / 1000.0));
                }
                match s.engine() {
                    Some(e) => {
                        let l = per_engine.entry(e.clone()).or_insert_with(|| EngineLoad {
                            engine: e,
                            ..Default::default()
                        });
                        l.requests += 1;
                        l.prompt_tokens += s.prompt_tokens;
                        l.computed_tokens += s.prompt_tokens - cached;
                    }
                    None => unattributed += 1,
                }
            }
        }
    }
    requests.not_sent = requests.in_trace.saturating_sub(requests.sent);
    if requests.completed > 0 {
        tokens.device_cached = dev_known.then_some(dev);
        tokens.restored = res_known.then_some(restored);
    }
    run.lag_ms = Dist::of(observations.iter().map(|o| o.lag_ms).collect());
    run.clock = match (
        clocks.contains(&Clock::Simulated),
        clocks.contains(&Clock::Client),
    ) {
        (true, false) => "simulated",
        (false, true) => "client",
        (true, true) => "mixed",
        (false, false) => "none",
    }
    .to_owned();

    // Avoidable re-prefill at the placement seen.
    let mut served: Vec<&Observation> = observations
        .iter()
        .filter(|o| o.served().is_some())
        .collect();
    served.sort_by(|a, b| {
        a.sent_ms
            .total_cmp(&b.sent_ms)
            .then(a.request.cmp(&b.request))
    });
    let engines: Vec<Option<String>> = served
        .iter()
        .map(|o| o.served().and_then(|s| s.engine()))
        .collect();
    let per_rank = engines.iter().any(Option::is_some);
    let mut engine_ids: HashMap<String, u64> = HashMap::new();
    let cache_ids: HashMap<RequestId, u64> = served
        .iter()
        .zip(&engines)
        .map(|(o, e)| {
            let id = RequestId(o.request);
            let c = match e {
                Some(e) => {
                    let n = engine_ids.len() as u64;
                    *engine_ids.entry(e.clone()).or_insert(n)
                }
                // No identity: its session's own cache (ids above any engine's).
                None => (1 << 40) + u64::from(trace.request(id).session.0),
            };
            (id, c)
        })
        .collect();
    let order: Vec<RequestId> = served.iter().map(|o| RequestId(o.request)).collect();
    let reusable = infinite_cache_hits(trace, &order, |r| cache_ids.get(&r).copied().unwrap_or(0));
    let mut reprefill = Reprefill {
        basis: if per_rank { "per_rank" } else { "per_session" }.to_owned(),
        ..Default::default()
    };
    for o in &served {
        if let Some(s) = o.served() {
            let r = reusable.get(&RequestId(o.request)).copied().unwrap_or(0);
            reprefill.reusable_tokens += r;
            reprefill.avoidable_tokens += r.saturating_sub(s.cached_tokens);
        }
    }

    // Load.
    let configured = configured_engines(&config);
    for e in &configured {
        per_engine.entry(e.clone()).or_insert_with(|| EngineLoad {
            engine: e.clone(),
            ..Default::default()
        });
    }
    for (e, b) in &busy_s {
        if let Some(l) = per_engine.get_mut(e) {
            l.busy_s = Some(*b);
        }
    }
    let engines_list: Vec<EngineLoad> = per_engine.into_values().collect();
    let n_engines = if configured.is_empty() {
        engines_list.len()
    } else {
        configured.len()
    };
    let col = |f: fn(&EngineLoad) -> u64| engines_list.iter().map(f).collect::<Vec<u64>>();
    let load = Load {
        max_over_mean_requests: max_over_mean(&col(|l| l.requests), n_engines),
        max_over_mean_prompt_tokens: max_over_mean(&col(|l| l.prompt_tokens), n_engines),
        max_over_mean_computed_tokens: max_over_mean(&col(|l| l.computed_tokens), n_engines),
        engines_configured: (!configured.is_empty()).then_some(configured.len() as u64),
        engines: engines_list,
        unattributed,
    };

    // Cost.
    let price = config.profile.as_ref().map(|p| p.engine_hour_usd);
    let busy_total: f64 = busy_s.values().sum();
    let billed_tokens = tokens.prompt + tokens.output;
    let cost = match price {
        Some(p) => {
            let (basis, hours) = if !busy_s.is_empty() {
                ("busy", busy_total / 3600.0)
            } else {
                ("fleet_time", n_engines as f64 * run.trace_s / 3600.0)
            };
            let usd = hours * p;
            Cost {
                basis: Some(basis.to_owned()),
                engine_hours: hours,
                usd,
                usd_per_mtok: (billed_tokens > 0).then(|| usd / (billed_tokens as f64 / 1e6)),
            }
        }
        None => Cost::default(),
    };

    // Series.
    let sorted = quantile::sorted(ttft.clone());
    let ttft_cdf = if sorted.is_empty() {
        Vec::new()
    } else {
        (0..=100)
            .filter_map(|i| {
                let q = f64::from(i) / 100.0;
                quantile::nearest_rank(&sorted, q).map(|v| (v, q))
            })
            .collect()
    };
    let span_s = observations.iter().map(|o| o.sent_ms).fold(0.0, f64::max) / 1000.0;
    let bucket_s = (span_s / 60.0).ceil().max(1.0);
    let mut buckets: Vec<Bucket> = (0..=(span_s / bucket_s) as usize)
        .map(|i| Bucket {
            t_s: i as f64 * bucket_s,
            ..Default::default()
        })
        .collect();
    for o in observations {
        if let Some(s) = o.served() {
            let i = ((o.sent_ms / 1000.0 / bucket_s) as usize).min(buckets.len() - 1);
            let b = &mut buckets[i];
            b.requests += 1;
            b.prompt_tokens += s.prompt_tokens;
            b.cached_tokens += s.cached_tokens.min(s.prompt_tokens);
        }
    }

    let overall = ratio(tokens.cached, tokens.prompt);
    let returning = ratio(ret_cached, ret_prompt);
    let hit = HitRatio {
        overall,
        returning,
        ideal_session: ratio(ideal_s, total_in),
        ideal_session_returning: ratio(ideal_s_ret, ret_in),
        ideal_global: ratio(ideal_g, total_in),
        of_ideal: ratio_f(overall, ratio(ideal_s, total_in)),
        of_ideal_returning: ratio_f(returning, ratio(ideal_s_ret, ret_in)),
    };
    let reqs = trace.requests();
    let agents: HashSet<u32> = in_scope
        .iter()
        .map(|&r| reqs[r.0 as usize].agent.0)
        .collect();
    Report {
        format: FORMAT.to_owned(),
        version: VERSION,
        trace: TraceInfo {
            path: trace_path,
            name: trace.header().name.clone(),
            format: trace_format,
            content_hash: content_hash(trace),
            block_size: trace.block_size(),
            sessions: sessions.len() as u64,
            agents: agents.len() as u64,
            requests: in_scope.len() as u64,
            input_tokens: total_in,
            output_tokens: in_scope
                .iter()
                .map(|&r| u64::from(reqs[r.0 as usize].output_tokens))
                .sum(),
        },
        run,
        config,
        requests,
        tokens,
        hit_ratio: hit,
        reprefill,
        latency: Latency {
            ttft_ms: Dist::of(ttft),
            itl_ms: Dist::of(itl),
            e2e_ms: Dist::of(e2e),
            queue_ms: Dist::of(queue),
            output_tokens_per_s: Dist::of(tps),
        },
        load,
        cost,
        series: Series {
            ttft_cdf,
            hit_over_time: buckets,
            bucket_s,
        },
        simulation: None,
    }
}

fn ratio_f(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

#[cfg(test)]
pub(crate) mod tests;
