//! Per-engine counters and histograms, and their Prometheus text rendering
//! under vLLM's metric names (`vllm:*`, labels `model_name`, `engine`) plus
//! tether's own (`tether_*`). Pure data: the engine records, the server renders.

use std::fmt::Write;

/// vLLM's TTFT buckets (seconds).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token / per-output-token buckets (seconds).
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-phase latency buckets (seconds).
pub const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's 1-2-5 token-count buckets up to `max` (`build_1_2_5_buckets`).
pub fn buckets_1_2_5(max: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1u64;
    loop {
        for m in [1u64, 2, 5] {
            let v = m.saturating_mul(scale);
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        match scale.checked_mul(10) {
            Some(s) => scale = s,
            None => return out,
        }
    }
}

/// A cumulative histogram with fixed upper bounds (Prometheus `le` buckets).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// Empty histogram over `bounds` (increasing).
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one value.
    pub fn observe(&mut self, v: f64) {
        self.observe_n(v, 1);
    }

    /// Records the same value `n` times (a step's duration is the inter-token
    /// latency of every sequence it decoded).
    pub fn observe_n(&mut self, v: f64, n: u64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += n;
        }
        self.sum += v * n as f64;
        self.count += n;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// What one engine counted since start.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetrics {
    /// Prompt tokens of admitted requests (`vllm:prompt_tokens`).
    pub prompt_tokens: u64,
    /// Output tokens generated (`vllm:generation_tokens`).
    pub generation_tokens: u64,
    /// Prompt tokens looked up in the device prefix cache (`vllm:prefix_cache_queries`).
    pub prefix_queries: u64,
    /// Of those, tokens found on the device (`vllm:prefix_cache_hits`).
    pub prefix_hits: u64,
    /// Tokens looked up in the host tier after the device miss (`vllm:external_prefix_cache_queries`).
    pub external_queries: u64,
    /// Tokens restored from the host tier (`vllm:external_prefix_cache_hits`).
    pub external_hits: u64,
    /// Prompt tokens computed by prefill (`prompt_tokens_by_source{source="local_compute"}`).
    pub computed_tokens: u64,
    /// Requests finished normally (`vllm:request_success{finished_reason="stop"}`).
    pub finished: u64,
    /// Requests cancelled by their client before finishing.
    pub aborted: u64,
    /// Full blocks retained at a prompt end (cumulative).
    pub retained_blocks: u64,
    /// Simulated ms the host link spent restoring.
    pub restore_ms: f64,
    /// Prompt tokens whose KV arrived from another engine (a P/D prefill leg).
    pub transferred_tokens: u64,
    /// Simulated ms the KV-transfer link spent receiving.
    pub transfer_ms: f64,
    /// Engine steps run.
    pub steps: u64,
    /// Simulated ms the engine spent running steps (its busy time: what a
    /// replay prices as GPU time, since idle time would be shared or scaled away).
    pub busy_ms: f64,
    /// Inter-token latency per token in µs, 2 significant digits: the
    /// quantiles the fleet simulator reports (the vLLM buckets of `itl` are too
    /// coarse for a p50 of a few ms).
    pub itl_us: hdrhistogram::Histogram<u64>,
    /// TTFT (s).
    pub ttft: Histogram,
    /// Inter-token latency per token (s).
    pub itl: Histogram,
    /// Mean time per output token per request (s).
    pub tpot: Histogram,
    /// End to end (s).
    pub e2e: Histogram,
    /// Waiting (s).
    pub queue: Histogram,
    /// Prefill phase, from admission to first token (s).
    pub prefill: Histogram,
    /// Decode phase, from first to last token (s).
    pub decode: Histogram,
    /// Running phase (s).
    pub inference: Histogram,
    /// Prompt tokens per request.
    pub prompt_len: Histogram,
    /// Output tokens per request.
    pub output_len: Histogram,
    /// Prompt tokens computed per request (`vllm:request_prefill_kv_computed_tokens`).
    pub computed_len: Histogram,
}

impl EngineMetrics {
    /// Zeroed metrics; token-count histograms bucketed up to `max_len` tokens.
    pub fn new(max_len: u64) -> Self {
        let tokens = buckets_1_2_5(max_len.max(1));
        Self {
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_queries: 0,
            prefix_hits: 0,
            external_queries: 0,
            external_hits: 0,
            computed_tokens: 0,
            finished: 0,
            aborted: 0,
            retained_blocks: 0,
            restore_ms: 0.0,
            transferred_tokens: 0,
            transfer_ms: 0.0,
            steps: 0,
            busy_ms: 0.0,
            itl_us: hdrhistogram::Histogram::new(2).unwrap_or_else(|_| unreachable!()),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            tpot: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(REQUEST_BUCKETS),
            queue: Histogram::new(REQUEST_BUCKETS),
            prefill: Histogram::new(REQUEST_BUCKETS),
            decode: Histogram::new(REQUEST_BUCKETS),
            inference: Histogram::new(REQUEST_BUCKETS),
            prompt_len: Histogram::new(&tokens),
            output_len: Histogram::new(&tokens),
            computed_len: Histogram::new(&tokens),
        }
    }
}

/// Point-in-time state of one engine, for gauges (and the load endpoint).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineGauges {
    /// Requests admitted (holding KV): restoring, prefilling or decoding.
    pub running: usize,
    /// Requests not admitted yet.
    pub waiting: usize,
    /// Of the running, those waiting for a host restore.
    pub restoring: usize,
    /// Prompt tokens still to prefill, over waiting and running requests.
    pub queued_prefill_tokens: u64,
    /// Device blocks in use by requests or retentions, over capacity.
    pub kv_usage: f64,
    /// Device blocks holding cached KV (in use or evictable).
    pub kv_cached_blocks: usize,
    /// Device block capacity.
    pub kv_blocks: usize,
    /// Device retentions held.
    pub device_retentions: usize,
    /// Host-tier bytes in use.
    pub host_bytes_used: u64,
    /// Host-tier capacity in bytes.
    pub host_bytes: u64,
    /// Simulated time the engine has reached, ms.
    pub sim_ms: f64,
    /// Share of recent time spent stepping (0–1, `tether_placement::busy`).
    pub busy: f64,
    /// Prefill tokens per simulated second of a full step
    /// (`max_num_batched_tokens` of new prompt tokens, the profile's rate):
    /// what turns `queued_prefill_tokens` into a wait.
    pub prefill_tokens_per_s: f64,
}

/// Everything rendered for one DP rank.
#[derive(Debug, Clone, Copy)]
pub struct RankView<'a> {
    /// The DP rank (`engine` label).
    pub dp_rank: usize,
    /// Counters and histograms.
    pub metrics: &'a EngineMetrics,
    /// Gauges.
    pub gauges: EngineGauges,
    /// The retention policy's counters.
    pub cache: tether_engine::Stats,
}

/// Reads one value of a rank's view.
type Getter = fn(&RankView) -> f64;

struct Family<'a> {
    out: &'a mut String,
    model: &'a str,
}

impl Family<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, rank: usize, extra: &str, v: f64) {
        let _ = writeln!(
            self.out,
            "{name}{{model_name=\"{}\",engine=\"{rank}\"{extra}}} {}",
            self.model,
            fmt_num(v)
        );
    }

    fn scalar(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        ranks: &[RankView],
        f: impl Fn(&RankView) -> f64,
    ) {
        self.head(name, kind, help);
        for r in ranks {
            self.sample(name, r.dp_rank, "", f(r));
        }
    }

    /// A counter family with one series per value of `key`.
    fn labelled(
        &mut self,
        name: &str,
        help: &str,
        ranks: &[RankView],
        key: &str,
        series: &[(&str, Getter)],
    ) {
        self.head(name, "counter", help);
        for r in ranks {
            for (v, f) in series {
                self.sample(name, r.dp_rank, &format!(",{key}=\"{v}\""), f(r));
            }
        }
    }

    fn histogram<'r>(
        &mut self,
        name: &str,
        help: &str,
        ranks: &'r [RankView<'r>],
        f: impl Fn(&'r RankView<'r>) -> &'r Histogram,
    ) {
        self.head(name, "histogram", help);
        for r in ranks {
            let h = f(r);
            let mut cum = 0;
            for (b, c) in h.bounds.iter().zip(&h.counts) {
                cum += c;
                self.sample(
                    &format!("{name}_bucket"),
                    r.dp_rank,
                    &format!(",le=\"{}\"", fmt_num(*b)),
                    cum as f64,
                );
            }
            self.sample(
                &format!("{name}_bucket"),
                r.dp_rank,
                ",le=\"+Inf\"",
                h.count as f64,
            );
            self.sample(&format!("{name}_sum"), r.dp_rank, "", h.sum);
            self.sample(&format!("{name}_count"), r.dp_rank, "", h.count as f64);
        }
    }
}

fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

/// Escapes a label value for the Prometheus text format.
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders every engine metric in the Prometheus text format (0.0.4).
pub fn render(out: &mut String, model_name: &str, ranks: &[RankView]) {
    let model = escape_label(model_name);
    let mut f = Family { out, model: &model };
    f.scalar(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        ranks,
        |r| r.gauges.running as f64,
    );
    f.scalar(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        ranks,
        |r| r.gauges.waiting as f64,
    );
    f.scalar(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        ranks,
        |r| r.gauges.kv_usage,
    );
    f.scalar(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        ranks,
        |r| r.metrics.prefix_queries as f64,
    );
    f.scalar(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        ranks,
        |r| r.metrics.prefix_hits as f64,
    );
    f.scalar("vllm:external_prefix_cache_queries_total", "counter", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", ranks, |r| r.metrics.external_queries as f64);
    f.scalar("vllm:external_prefix_cache_hits_total", "counter", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", ranks, |r| r.metrics.external_hits as f64);
    f.scalar(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        ranks,
        |_| 0.0,
    );
    f.scalar(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        ranks,
        |r| r.metrics.prompt_tokens as f64,
    );
    f.labelled(
        "vllm:prompt_tokens_by_source_total",
        "Number of prompt tokens by source.",
        ranks,
        "source",
        &[
            ("local_compute", |r| r.metrics.computed_tokens as f64),
            ("local_cache_hit", |r| r.metrics.prefix_hits as f64),
            ("external_kv_transfer", |r| r.metrics.external_hits as f64),
        ],
    );
    f.scalar(
        "vllm:prompt_tokens_cached_total",
        "counter",
        "Number of cached prompt tokens (local + external).",
        ranks,
        |r| (r.metrics.prefix_hits + r.metrics.external_hits) as f64,
    );
    f.scalar(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        ranks,
        |r| r.metrics.generation_tokens as f64,
    );
    f.labelled(
        "vllm:request_success_total",
        "Count of successfully processed requests.",
        ranks,
        "finished_reason",
        &[
            ("stop", |r| r.metrics.finished as f64),
            ("abort", |r| r.metrics.aborted as f64),
        ],
    );
    f.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        ranks,
        |r| &r.metrics.ttft,
    );
    f.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        ranks,
        |r| &r.metrics.itl,
    );
    f.histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        ranks,
        |r| &r.metrics.tpot,
    );
    f.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        ranks,
        |r| &r.metrics.e2e,
    );
    f.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        ranks,
        |r| &r.metrics.queue,
    );
    f.histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        ranks,
        |r| &r.metrics.inference,
    );
    f.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        ranks,
        |r| &r.metrics.prefill,
    );
    f.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        ranks,
        |r| &r.metrics.decode,
    );
    f.histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        ranks,
        |r| &r.metrics.prompt_len,
    );
    f.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        ranks,
        |r| &r.metrics.output_len,
    );
    f.histogram(
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        ranks,
        |r| &r.metrics.computed_len,
    );
    // tether's own: the retention policy and the host tier.
    f.scalar(
        "tether_retained_total",
        "counter",
        "Prompt ends retained (retention records created).",
        ranks,
        |r| r.cache.retained as f64,
    );
    f.scalar(
        "tether_retained_blocks_total",
        "counter",
        "Full KV blocks pinned by prompt-end retentions.",
        ranks,
        |r| r.metrics.retained_blocks as f64,
    );
    f.scalar(
        "tether_retentions",
        "gauge",
        "Retention records held on the device.",
        ranks,
        |r| r.gauges.device_retentions as f64,
    );
    f.scalar(
        "tether_superseded_total",
        "counter",
        "Retentions replaced by the same key's next prompt end.",
        ranks,
        |r| r.cache.superseded as f64,
    );
    f.scalar(
        "tether_refreshed_total",
        "counter",
        "Retentions refreshed by a returning turn.",
        ranks,
        |r| r.cache.refreshed as f64,
    );
    f.scalar(
        "tether_expired_dropped_total",
        "counter",
        "Expired retentions dropped to make room.",
        ranks,
        |r| r.cache.expired_dropped as f64,
    );
    f.scalar(
        "tether_offloaded_total",
        "counter",
        "Live retentions moved to the host tier under device pressure.",
        ranks,
        |r| r.cache.offloaded as f64,
    );
    f.scalar(
        "tether_dropped_total",
        "counter",
        "Live retentions dropped because the host tier could not take them.",
        ranks,
        |r| r.cache.dropped as f64,
    );
    f.scalar(
        "tether_restored_blocks_total",
        "counter",
        "KV blocks restored from the host tier.",
        ranks,
        |r| r.cache.restored_blocks as f64,
    );
    f.scalar(
        "tether_restore_misses_total",
        "counter",
        "Host-tier restores refused (checksum mismatch or failed copy).",
        ranks,
        |r| r.cache.restore_misses as f64,
    );
    f.scalar(
        "tether_prefetched_total",
        "counter",
        "Host-tier retentions prefetched to the device ahead of their session's return.",
        ranks,
        |r| r.cache.prefetched as f64,
    );
    f.scalar(
        "tether_prefetch_used_total",
        "counter",
        "Prefetched retentions hit by their session's next request.",
        ranks,
        |r| r.cache.prefetch_used as f64,
    );
    f.scalar(
        "tether_prefetch_wasted_total",
        "counter",
        "Prefetched retentions that left the device unhit.",
        ranks,
        |r| r.cache.prefetch_wasted as f64,
    );
    f.scalar(
        "tether_restore_seconds_total",
        "counter",
        "Simulated seconds the host link spent restoring.",
        ranks,
        |r| r.metrics.restore_ms / 1000.0,
    );
    f.scalar(
        "tether_host_bytes_used",
        "gauge",
        "Host-tier bytes in use.",
        ranks,
        |r| r.gauges.host_bytes_used as f64,
    );
    f.scalar(
        "tether_host_bytes_capacity",
        "gauge",
        "Host-tier capacity in bytes.",
        ranks,
        |r| r.gauges.host_bytes as f64,
    );
    f.scalar(
        "tether_kv_cached_blocks",
        "gauge",
        "Device blocks holding cached KV.",
        ranks,
        |r| r.gauges.kv_cached_blocks as f64,
    );
    f.scalar(
        "tether_kv_blocks_capacity",
        "gauge",
        "Device KV blocks.",
        ranks,
        |r| r.gauges.kv_blocks as f64,
    );
    f.scalar(
        "tether_rank_steps_total",
        "counter",
        "Engine steps simulated.",
        ranks,
        |r| r.metrics.steps as f64,
    );
    f.scalar(
        "tether_rank_busy_seconds_total",
        "counter",
        "Simulated seconds the engine spent running steps (busy time).",
        ranks,
        |r| r.metrics.busy_ms / 1000.0,
    );
    f.scalar(
        "tether_rank_sim_seconds",
        "gauge",
        "Simulated time the engine has reached, seconds since start.",
        ranks,
        |r| r.gauges.sim_ms / 1000.0,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_five_buckets_match_vllm() {
        assert_eq!(
            buckets_1_2_5(100),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(buckets_1_2_5(1), vec![1.0]);
    }

    #[test]
    fn histogram_renders_cumulative_buckets() {
        let mut m = EngineMetrics::new(100);
        m.ttft.observe(0.003);
        m.ttft.observe(0.5);
        m.ttft.observe(5000.0);
        let view = RankView {
            dp_rank: 1,
            metrics: &m,
            gauges: EngineGauges::default(),
            cache: tether_engine::Stats::default(),
        };
        let mut s = String::new();
        render(&mut s, "m\"x", &[view]);
        assert!(s.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",engine=\"1\",le=\"0.005\"} 1.0"));
        assert!(s.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",engine=\"1\",le=\"0.5\"} 2.0"));
        assert!(s.contains("vllm:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",engine=\"1\",le=\"+Inf\"} 3.0"));
        assert!(s.contains(
            "vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\",engine=\"1\"} 3.0"
        ));
        // One HELP/TYPE per family.
        assert_eq!(
            s.matches("# TYPE vllm:num_requests_running gauge").count(),
            1
        );
    }
}
