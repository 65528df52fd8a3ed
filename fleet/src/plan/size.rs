//! Replica counts for one interval's demand, from the profile alone: a
//! prefill pool as an M/G/c queue, a decode pool by the batch each engine can
//! hold at the ITL target, and an aggregated (coupled) pool that does both.
//!
//! These are the planner's first guesses; the simulation of the planned fleet
//! corrects them (`plan::run`).

use super::demand::Interval;
use serde::Serialize;
use tether_rank_engine::latency::LatencyModel;

/// Latency objectives. Percentiles over all requests (TTFT) or all tokens (ITL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slo {
    /// TTFT p90, ms.
    pub ttft_p90_ms: Option<f64>,
    /// TTFT p99, ms.
    pub ttft_p99_ms: Option<f64>,
    /// Per-token ITL p99, ms (a minimum interactivity of `x` tokens/s per
    /// stream is an ITL of `1000 / x` ms).
    pub itl_p99_ms: Option<f64>,
}

/// What set a pool's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Binding {
    /// One replica: the least a pool with any work has.
    Minimum,
    /// Keeping utilization below 1 (throughput alone).
    Throughput,
    /// The TTFT p90 objective.
    TtftP90,
    /// The TTFT p99 objective.
    TtftP99,
    /// The ITL objective.
    Itl,
    /// KV memory for the decoding sequences.
    KvMemory,
    /// vLLM `--max-num-seqs`: the most sequences one engine runs at once.
    MaxNumSeqs,
    /// Raised after the simulation of the plan missed an objective.
    Simulation,
}

impl Binding {
    /// Its name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Binding::Minimum => "minimum",
            Binding::Throughput => "throughput",
            Binding::TtftP90 => "ttft-p90",
            Binding::TtftP99 => "ttft-p99",
            Binding::Itl => "itl",
            Binding::KvMemory => "kv-memory",
            Binding::MaxNumSeqs => "max-num-seqs",
            Binding::Simulation => "simulation",
        }
    }
}

/// A pool size and why.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Size {
    /// Replicas (engines).
    pub replicas: usize,
    /// The constraint that set it.
    pub binding: Binding,
    /// For a decode (or aggregated) pool: the batch each engine runs, the
    /// mean context and the step time there — the binding in engineering terms.
    pub at: Option<DecodePoint>,
}

/// Where a decode engine is planned to run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DecodePoint {
    /// Sequences per engine.
    pub batch: usize,
    /// Mean context of the decoding sequences, tokens.
    pub context: f64,
    /// Step time there, ms.
    pub step_ms: f64,
}

impl Size {
    /// A pool sized by `binding` with no decode point.
    pub const fn of(replicas: usize, binding: Binding) -> Self {
        Self {
            replicas,
            binding,
            at: None,
        }
    }

    /// What set the size, in engineering terms (`decode ITL at batch 180`).
    pub fn describe(&self, pool: &str) -> String {
        let Some(p) = self.at else {
            return format!("{pool} {}", self.binding.name());
        };
        let (b, c, ms) = (p.batch, p.context, p.step_ms);
        match self.binding {
            Binding::Itl => {
                format!("{pool} ITL at batch {b} ({ms:.1} ms per step, mean context {c:.0} tokens)")
            }
            Binding::KvMemory => format!(
                "{pool} KV memory: {b} sequences of {c:.0} tokens fill the device ({ms:.1} ms per step)"
            ),
            Binding::MaxNumSeqs => {
                format!("{pool} --max-num-seqs {b} ({ms:.1} ms per step at context {c:.0})")
            }
            other => format!("{pool} {} (batch {b}, {ms:.1} ms per step)", other.name()),
        }
    }
}

/// An objective no pool size meets, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Infeasible {
    /// The objective.
    pub binding: Binding,
    /// Why, in a sentence.
    pub why: String,
}

/// Largest pool the sizing considers.
pub const MAX_REPLICAS: usize = 4096;
/// Highest utilization a pool is planned at.
const MAX_RHO: f64 = 0.95;
/// Planned mean step time ≤ the ITL objective ÷ this (the p99 of per-token
/// gaps sits above the mean).
pub const ITL_HEADROOM: f64 = 1.15;
/// Share of device KV a decode engine fills with running sequences.
pub const KV_FILL: f64 = 0.9;

/// Nearest-rank `q`-quantile of `v` (0 when empty).
fn quantile(v: &[f64], q: f64) -> f64 {
    crate::quantile::of(v, q).unwrap_or(0.0)
}

/// Erlang C: the probability an arrival waits in an M/M/c queue with offered
/// load `a` (= λ/μ) on `c` servers.
fn erlang_c(c: usize, a: f64) -> f64 {
    if a >= c as f64 {
        return 1.0;
    }
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (k as f64 + a * b);
    }
    let rho = a / c as f64;
    b / (1.0 - rho * (1.0 - b))
}

/// `q`-quantile of the wait in an M/G/c queue (Allen–Cunneen with an
/// exponential tail): `P(W > t) ≈ C · exp(−(cμ − λ) t / ((ca² + cs²)/2))`.
fn wait_quantile(c: usize, lambda: f64, mean_s: f64, ca2: f64, cs2: f64, q: f64) -> f64 {
    let a = lambda * mean_s;
    if a >= c as f64 {
        return f64::INFINITY;
    }
    let pw = erlang_c(c, a);
    if pw <= 1.0 - q {
        return 0.0;
    }
    let drain = c as f64 / mean_s - lambda;
    ((ca2 + cs2) / 2.0) / drain * (pw / (1.0 - q)).ln()
}

/// The prefill work of an interval on a pool: service times of the requests
/// it prefills, and their arrival burstiness.
pub struct PrefillLoad {
    /// Lone-request prefill times, ms.
    pub service_ms: Vec<f64>,
    /// Time added to each TTFT after the prefill (KV transfer, the decode
    /// rank's first step), ms.
    pub after_ms: f64,
    /// Interval length, ms.
    pub len_ms: f64,
    /// Inter-arrival CV².
    pub ca2: f64,
    /// Share of each engine's time already taken by other work (decoding, in a
    /// coupled pool).
    pub busy_share: f64,
    /// Each engine queues its own requests: the router hands every `c`-th
    /// request to each without looking at load (round robin), so the pool is
    /// `c` single-engine queues, not one queue that `c` engines serve — a
    /// long prompt holds up the requests behind it on its engine while
    /// others idle. At one or two engines (a sample) the two are close; at
    /// tens (the whole trace) the shared queue waits far less.
    pub split: bool,
}

/// Predicted TTFT quantiles (p90, p99) of `load` on `c` engines.
pub fn ttft(load: &PrefillLoad, c: usize) -> (f64, f64) {
    let n = load.service_ms.len();
    if n == 0 || c == 0 {
        return (0.0, 0.0);
    }
    let avail = (1.0 - load.busy_share).max(1e-3);
    let s: Vec<f64> = load.service_ms.iter().map(|x| x / avail).collect();
    let mean = s.iter().sum::<f64>() / n as f64;
    let var = s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
    let cs2 = if mean > 0.0 { var / (mean * mean) } else { 0.0 };
    let lambda = n as f64 / load.len_ms;
    let wait = |q: f64| {
        if load.split {
            // Every c-th arrival: the gaps are sums of c gaps, CV² ÷ c.
            let k = c as f64;
            wait_quantile(1, lambda / k, mean, load.ca2 / k, cs2, q)
        } else {
            wait_quantile(c, lambda, mean, load.ca2, cs2, q)
        }
    };
    let at = |q: f64| wait(q) + quantile(&s, q) + load.after_ms;
    (at(0.9), at(0.99))
}

/// Refuses an objective below what a request takes alone on an idle engine
/// (its prefill and what follows it): the floor no pool size lowers.
pub fn floor(load: &PrefillLoad, slo: &Slo) -> Result<(), Infeasible> {
    if load.service_ms.is_empty() {
        return Ok(());
    }
    let alone =
        |q: f64| quantile(&load.service_ms, q) / (1.0 - load.busy_share).max(1e-3) + load.after_ms;
    for (target, q, b) in [
        (slo.ttft_p90_ms, 0.9, Binding::TtftP90),
        (slo.ttft_p99_ms, 0.99, Binding::TtftP99),
    ] {
        if let Some(t) = target
            && alone(q) > t
        {
            return Err(Infeasible {
                binding: b,
                why: format!(
                    "TTFT p{} <= {t:.0} ms cannot be met: the p{} request's prefill alone takes {:.0} ms on this profile",
                    (q * 100.0) as u32,
                    (q * 100.0) as u32,
                    alone(q)
                ),
            });
        }
    }
    Ok(())
}

/// Fewest engines whose predicted TTFT meets `slo` (and whose utilization
/// stays below 0.95), or why none does.
pub fn prefill(load: &PrefillLoad, slo: &Slo) -> Result<Size, Infeasible> {
    if load.service_ms.is_empty() {
        return Ok(Size::of(0, Binding::Minimum));
    }
    floor(load, slo)?;
    let work: f64 = load.service_ms.iter().sum::<f64>() / (1.0 - load.busy_share).max(1e-3);
    let start = ((work / load.len_ms / MAX_RHO).ceil() as usize).max(1);
    let mut binding = if start > 1 {
        Binding::Throughput
    } else {
        Binding::Minimum
    };
    for c in start..=MAX_REPLICAS {
        let (p90, p99) = ttft(load, c);
        let miss90 = slo.ttft_p90_ms.is_some_and(|t| p90 > t);
        let miss99 = slo.ttft_p99_ms.is_some_and(|t| p99 > t);
        if !miss90 && !miss99 {
            return Ok(Size::of(c, binding));
        }
        binding = if miss99 {
            Binding::TtftP99
        } else {
            Binding::TtftP90
        };
    }
    Err(Infeasible {
        binding,
        why: format!("the TTFT objective needs more than {MAX_REPLICAS} engines"),
    })
}

/// The decode work of an interval.
pub struct DecodeLoad {
    /// Output tokens.
    pub output_tokens: f64,
    /// Mean context of decoding sequences.
    pub context: f64,
    /// Interval length, ms.
    pub len_ms: f64,
    /// Prefill time the decode engines also run (local prefills), ms.
    pub local_prefill_ms: f64,
}

/// What bounds one engine's batch: its KV tokens and `--max-num-seqs`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineLimits {
    /// Device KV tokens (`--kv-tokens`, else the profile's).
    pub kv_tokens: u64,
    /// `--max-num-seqs`.
    pub max_num_seqs: usize,
}

/// The most sequences one engine decodes while its step meets the ITL target,
/// their KV fits and `--max-num-seqs` allows; `None` when even one sequence
/// misses the target.
pub fn max_batch(
    model: &LatencyModel,
    context: f64,
    itl_target: Option<f64>,
    limits: EngineLimits,
) -> Option<(usize, Binding)> {
    let kv_cap = ((KV_FILL * limits.kv_tokens as f64) / context.max(1.0))
        .floor()
        .max(1.0) as usize;
    let (cap, cap_binding) = if limits.max_num_seqs.max(1) < kv_cap {
        (limits.max_num_seqs.max(1), Binding::MaxNumSeqs)
    } else {
        (kv_cap, Binding::KvMemory)
    };
    let fits =
        |b: usize| itl_target.is_none_or(|t| model.decode_ms(b, context) <= t / ITL_HEADROOM);
    if !fits(1) {
        return None;
    }
    // Largest b ≤ cap meeting the target (step time grows with the batch).
    let (mut lo, mut hi) = (1usize, cap.max(1));
    if fits(hi) {
        return Some((hi, cap_binding));
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some((lo, Binding::Itl))
}

/// Fewest decode engines for `load`.
pub fn decode(
    model: &LatencyModel,
    load: &DecodeLoad,
    slo: &Slo,
    limits: EngineLimits,
) -> Result<Size, Infeasible> {
    if load.output_tokens <= 0.0 {
        return Ok(Size::of(0, Binding::Minimum));
    }
    if load.context > limits.kv_tokens as f64 {
        return Err(Infeasible {
            binding: Binding::KvMemory,
            why: format!(
                "decode KV memory: one sequence of mean context {:.0} tokens needs more than the engine's {} KV tokens",
                load.context, limits.kv_tokens
            ),
        });
    }
    let Some((b, why)) = max_batch(model, load.context, slo.itl_p99_ms, limits) else {
        return Err(Infeasible {
            binding: Binding::Itl,
            why: format!(
                "ITL p99 <= {:.1} ms cannot be met: one sequence alone at context {:.0} decodes at {:.1} ms per token on this profile",
                slo.itl_p99_ms.unwrap_or(0.0),
                load.context,
                model.decode_ms(1, load.context)
            ),
        });
    };
    // Tokens per ms one engine emits at that batch, less the time its local prefills take.
    let per_engine = b as f64 / model.decode_ms(b, load.context).max(1e-6);
    let decode_engines = load.output_tokens / load.len_ms / per_engine;
    let prefill_engines = load.local_prefill_ms / load.len_ms;
    let need = ((decode_engines + prefill_engines) / MAX_RHO)
        .ceil()
        .max(1.0) as usize;
    if need > MAX_REPLICAS {
        return Err(Infeasible {
            binding: why,
            why: format!("decode needs more than {MAX_REPLICAS} engines"),
        });
    }
    Ok(Size {
        replicas: need,
        binding: if need == 1 { Binding::Minimum } else { why },
        at: Some(DecodePoint {
            batch: b,
            context: load.context,
            step_ms: model.decode_ms(b, load.context),
        }),
    })
}

/// Fewest aggregated engines, each prefilling and decoding: decode takes its
/// share of every engine's time, prefill queues for the rest, and a prefill
/// chunk in a decode step stretches that step (the ITL cost of coupling).
pub fn coupled(
    model: &LatencyModel,
    demand: &Interval,
    service_ms: &[f64],
    slo: &Slo,
    limits: EngineLimits,
    chunk_tokens: usize,
) -> Result<Size, Infeasible> {
    let len = demand.len_ms;
    let d = DecodeLoad {
        output_tokens: demand.output_tokens as f64,
        context: demand.decode_context,
        len_ms: len,
        local_prefill_ms: 0.0,
    };
    let prefill_ms: f64 = service_ms.iter().sum();
    let base = decode(model, &d, slo, limits)?;
    let (b, _) = max_batch(model, d.context.max(1.0), slo.itl_p99_ms, limits)
        .unwrap_or((1, Binding::Minimum));
    // A decode step that carries a full prefill chunk.
    let stall = model.prefill_ms(chunk_tokens.max(1));
    let mut binding = base.binding;
    for n in base.replicas.max(1)..=MAX_REPLICAS {
        let streams = (d.output_tokens / len) * model.decode_ms(b, d.context) / n as f64;
        let decode_share = (streams / b as f64).min(1.0) * (d.output_tokens > 0.0) as u8 as f64;
        let prefill_share = prefill_ms / len / n as f64;
        if decode_share + prefill_share >= MAX_RHO {
            binding = Binding::Throughput;
            continue;
        }
        let load = PrefillLoad {
            split: false,
            service_ms: service_ms.to_vec(),
            after_ms: 0.0,
            len_ms: len,
            ca2: demand.arrival_cv2,
            busy_share: decode_share,
        };
        let (p90, p99) = ttft(&load, n);
        if slo.ttft_p90_ms.is_some_and(|t| p90 > t) {
            binding = Binding::TtftP90;
            continue;
        }
        if slo.ttft_p99_ms.is_some_and(|t| p99 > t) {
            binding = Binding::TtftP99;
            continue;
        }
        // More than 1 % of steps carry a chunk: the p99 gap includes one.
        let itl_p99 = model.decode_ms(b.min(streams.ceil().max(1.0) as usize), d.context)
            + if prefill_share > 0.01 { stall } else { 0.0 };
        if slo.itl_p99_ms.is_some_and(|t| itl_p99 > t) {
            binding = Binding::Itl;
            continue;
        }
        return Ok(Size {
            replicas: n,
            binding,
            at: base.at,
        });
    }
    Err(Infeasible {
        binding,
        why: format!(
            "no aggregated fleet of up to {MAX_REPLICAS} engines meets the objectives (a decode step carrying a {chunk_tokens}-token prefill chunk takes {stall:.0} ms more)"
        ),
    })
}

#[cfg(test)]
mod tests;
