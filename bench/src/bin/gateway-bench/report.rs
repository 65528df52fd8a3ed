//! The benchmark's arithmetic and its table: medians over rounds, paired
//! per-round ratios and deltas against the baseline and the floors, and the two
//! targets (PASS / MISS / PENDING).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The measured configurations, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    /// a. Envoy with no filter: the baseline.
    NoFilter,
    /// b. A wasm filter that only sets one header: the header-path floor.
    HeaderFloor,
    /// c. A wasm filter that only receives the body and routes via filter state: the body-path floor.
    BodyFloor,
    /// d. tether, identity in a header.
    TetherHeader,
    /// e. tether, identity only in the JSON body.
    TetherBody,
    /// f. Envoy-native `json_to_metadata` → `header_mutation` → hash policy.
    NativeJson,
    /// g. (diagnostic) The header floor inside tether's chain (buffer disabled
    /// per route, `header_mutation`, MAGLEV): splits d's cost into chain and filter.
    FloorInChain,
    /// h. (diagnostic) The body floor inside tether's chain (filter state
    /// `wasm.tether.x-tether-key` → `header_mutation` → MAGLEV): e vs h is
    /// tether's body path alone, with the routing chain held equal.
    BodyFloorInChain,
    /// i. (diagnostic) tether's header path with every header output
    /// (`"outputs": "all"`, the chain copying all of them): what emitting
    /// everything costs over the default.
    AllHeader,
    /// j. (diagnostic) tether's body path with every header output.
    AllBody,
    /// k. (diagnostic) tether's body path for a vLLM connector (`"outputs":
    /// "vllm"`): the markers written into the body's `kv_transfer_params`.
    VllmBody,
    /// l. (diagnostic) h plus the host calls tether's body path makes with
    /// its default outputs (the header map, the body's two 16 KiB ends),
    /// without its computation: l − h is what those calls cost in Envoy,
    /// e − l what tether computes.
    BodyReadInChain,
    /// m. (diagnostic) l plus the least decision a filter keyed on a body
    /// field makes (floor mode `body-key`: the last `"prompt_cache_key"` in
    /// the bytes read, hashed): m − l is the cheapest body-key decision,
    /// e − m what tether's own decision (head hash, sources) adds to it.
    MinimalKeyInChain,
}

impl Variant {
    pub const ALL: [Variant; 13] = [
        Variant::NoFilter,
        Variant::HeaderFloor,
        Variant::BodyFloor,
        Variant::TetherHeader,
        Variant::TetherBody,
        Variant::NativeJson,
        Variant::FloorInChain,
        Variant::BodyFloorInChain,
        Variant::AllHeader,
        Variant::AllBody,
        Variant::VllmBody,
        Variant::BodyReadInChain,
        Variant::MinimalKeyInChain,
    ];

    /// The one-letter name used on the command line (`--variants a,b,c`).
    pub fn letter(self) -> char {
        match self {
            Variant::NoFilter => 'a',
            Variant::HeaderFloor => 'b',
            Variant::BodyFloor => 'c',
            Variant::TetherHeader => 'd',
            Variant::TetherBody => 'e',
            Variant::NativeJson => 'f',
            Variant::FloorInChain => 'g',
            Variant::BodyFloorInChain => 'h',
            Variant::AllHeader => 'i',
            Variant::AllBody => 'j',
            Variant::VllmBody => 'k',
            Variant::BodyReadInChain => 'l',
            Variant::MinimalKeyInChain => 'm',
        }
    }

    pub fn from_letter(c: char) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.letter() == c)
    }

    pub fn label(self) -> &'static str {
        match self {
            Variant::NoFilter => "no filter",
            Variant::HeaderFloor => "wasm floor: set 1 header",
            Variant::BodyFloor => "wasm floor: body + filter state",
            Variant::TetherHeader => "tether, header key",
            Variant::TetherBody => "tether, body key",
            Variant::NativeJson => "native json_to_metadata",
            Variant::FloorInChain => "wasm floor in tether's chain",
            Variant::BodyFloorInChain => "body floor in tether's chain",
            Variant::AllHeader => "tether, header key, all outputs",
            Variant::AllBody => "tether, body key, all outputs",
            Variant::VllmBody => "tether, body key, outputs vllm",
            Variant::BodyReadInChain => "body floor + tether's reads, in chain",
            Variant::MinimalKeyInChain => "l + the least body-key decision",
        }
    }

    /// The floor a variant is judged against, if any: tether's variants
    /// against the floor inside tether's own chain (same buffer filter,
    /// `header_mutation` and MAGLEV cluster), the floors in the chain and
    /// native routing against the plain floors.
    pub fn floor(self) -> Option<Variant> {
        match self {
            Variant::TetherHeader | Variant::AllHeader => Some(Variant::FloorInChain),
            Variant::TetherBody
            | Variant::AllBody
            | Variant::VllmBody
            | Variant::BodyReadInChain
            | Variant::MinimalKeyInChain => Some(Variant::BodyFloorInChain),
            Variant::FloorInChain => Some(Variant::HeaderFloor),
            Variant::NativeJson | Variant::BodyFloorInChain => Some(Variant::BodyFloor),
            _ => None,
        }
    }
}

/// One round's figures for one (variant, body size).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Latency at concurrency 1, microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
    /// Requests/s at saturation.
    pub rps: f64,
    /// CPU time of the variant's Envoy process per request at saturation,
    /// microseconds (all its threads, from `/proc/<pid>/task/*/schedstat`);
    /// `None` where the kernel does not expose it.
    pub cpu_us: Option<f64>,
}

/// Every round's samples, keyed by (variant, body size in bytes).
#[derive(Debug, Default)]
pub struct Results {
    samples: BTreeMap<(Variant, usize), Vec<Sample>>,
}

/// Header path target: tether's saturated throughput ≥ this × the header floor's.
pub const HEADER_TARGET: f64 = 0.97;
/// Body path target: tether's p50 added over no filter ≤ this × what the body floor adds.
pub const BODY_TARGET: f64 = 1.25;

pub use tether_fleet::quantile::median;

impl Results {
    pub fn record(&mut self, variant: Variant, size: usize, sample: Sample) {
        self.samples
            .entry((variant, size))
            .or_default()
            .push(sample);
    }

    fn rounds(&self, variant: Variant, size: usize) -> &[Sample] {
        self.samples
            .get(&(variant, size))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Median over rounds of one figure, over the rounds that have it.
    pub fn median_of(
        &self,
        variant: Variant,
        size: usize,
        f: impl Fn(&Sample) -> Option<f64>,
    ) -> Option<f64> {
        median(
            &self
                .rounds(variant, size)
                .iter()
                .filter_map(f)
                .collect::<Vec<_>>(),
        )
    }

    /// Median over rounds of `f(variant's sample, other's sample)`, pairing the
    /// samples of the same round so that noise common to a round cancels;
    /// rounds where `f` has no value are left out.
    pub fn paired(
        &self,
        variant: Variant,
        other: Variant,
        size: usize,
        f: impl Fn(&Sample, &Sample) -> Option<f64>,
    ) -> Option<f64> {
        let a = self.rounds(variant, size);
        let b = self.rounds(other, size);
        median(
            &a.iter()
                .zip(b)
                .filter_map(|(x, y)| f(x, y))
                .collect::<Vec<_>>(),
        )
    }

    /// Saturated throughput relative to `other` (median of per-round ratios).
    pub fn rps_ratio(&self, variant: Variant, other: Variant, size: usize) -> Option<f64> {
        self.paired(variant, other, size, |x, y| Some(x.rps / y.rps))
    }

    /// p50 added over `other`, microseconds (median of per-round differences).
    pub fn added_p50(&self, variant: Variant, other: Variant, size: usize) -> Option<f64> {
        self.paired(variant, other, size, |x, y| Some(x.p50_us - y.p50_us))
    }

    /// Envoy CPU per request added over `other`, microseconds (median of
    /// per-round differences over the rounds where both were measured).
    pub fn added_cpu(&self, variant: Variant, other: Variant, size: usize) -> Option<f64> {
        self.paired(variant, other, size, |x, y| Some(x.cpu_us? - y.cpu_us?))
    }
}

/// A target's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Pass(String),
    Miss(String),
    Pending(String),
    /// The comparison rests on a difference that noise swamped (e.g. a floor
    /// that measured as adding nothing): rerun on a quieter machine.
    Inconclusive(String),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Pass(s) => write!(f, "PASS  {s}"),
            Verdict::Miss(s) => write!(f, "MISS  {s}"),
            Verdict::Pending(s) => write!(f, "PENDING  {s}"),
            Verdict::Inconclusive(s) => write!(f, "INCONCLUSIVE  {s}"),
        }
    }
}

/// Header path: tether ≥ 0.97 × the saturated throughput of the trivial
/// filter inside tether's own chain (g), at every size.
pub fn header_target(results: &Results, sizes: &[usize]) -> Verdict {
    let mut parts = Vec::new();
    let mut pass = true;
    for &size in sizes {
        let Some(r) = results.rps_ratio(Variant::TetherHeader, Variant::FloorInChain, size) else {
            return Verdict::Pending("needs variants d and g".into());
        };
        pass &= r >= HEADER_TARGET;
        parts.push(format!("{}: {r:.3}x", human_size(size)));
    }
    let text = format!(
        "header path rps vs the trivial filter in tether's chain (d vs g) ≥ {HEADER_TARGET}x — {}",
        parts.join(", ")
    );
    if pass {
        Verdict::Pass(text)
    } else {
        Verdict::Miss(text)
    }
}

/// Body path at `size`: tether's p50 added over no filter ≤ 1.25 × what the
/// body floor inside tether's own chain (h) adds.
pub fn body_target(results: &Results, size: usize) -> Verdict {
    let tether = results.added_p50(Variant::TetherBody, Variant::NoFilter, size);
    let floor = results.added_p50(Variant::BodyFloorInChain, Variant::NoFilter, size);
    let (Some(tether), Some(floor)) = (tether, floor) else {
        return Verdict::Pending(format!("needs variants e, h and a at {}", human_size(size)));
    };
    let limit = BODY_TARGET * floor;
    let text = format!(
        "body path p50 added at {}: tether (e) {tether:+.0} µs vs the body floor in tether's chain (h) {floor:+.0} µs (limit {limit:+.0} µs)",
        human_size(size)
    );
    if floor <= 0.0 {
        Verdict::Inconclusive(format!(
            "{text}; the floor measured as adding nothing, noise exceeds the effect"
        ))
    } else if tether <= limit {
        Verdict::Pass(format!("{text}, {:.2}x the floor", tether / floor))
    } else {
        Verdict::Miss(format!("{text}, {:.2}x the floor", tether / floor))
    }
}

pub fn human_size(bytes: usize) -> String {
    if bytes >= 1024 * 1024 {
        format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
    } else {
        format!("{} KB", (bytes as f64 / 1024.0).round())
    }
}

fn cell(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "—".into())
}

/// The results table: one row per (size, variant) that ran.
pub fn table(results: &Results, variants: &[Variant], sizes: &[usize]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| body | variant | p50 µs | p99 µs | +p50 vs a µs | rps | rps vs a | rps vs floor | +p50 vs floor µs | Envoy CPU µs/req | +CPU vs floor µs |"
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for &size in sizes {
        for &v in variants {
            if results.rounds(v, size).is_empty() {
                continue;
            }
            let floor = v.floor();
            let _ = writeln!(
                out,
                "| {} | {}. {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                human_size(size),
                v.letter(),
                v.label(),
                cell(results.median_of(v, size, |s| Some(s.p50_us)), |x| format!(
                    "{x:.0}"
                )),
                cell(results.median_of(v, size, |s| Some(s.p99_us)), |x| format!(
                    "{x:.0}"
                )),
                cell(results.added_p50(v, Variant::NoFilter, size), |x| format!(
                    "{x:+.0}"
                )),
                cell(results.median_of(v, size, |s| Some(s.rps)), |x| format!(
                    "{x:.0}"
                )),
                cell(results.rps_ratio(v, Variant::NoFilter, size), |x| format!(
                    "{x:.3}x"
                )),
                cell(
                    floor.and_then(|f| results.rps_ratio(v, f, size)),
                    |x| format!("{x:.3}x ({})", floor.map_or('-', Variant::letter))
                ),
                cell(
                    floor.and_then(|f| results.added_p50(v, f, size)),
                    |x| format!("{x:+.0}")
                ),
                cell(results.median_of(v, size, |s| s.cpu_us), |x| format!(
                    "{x:.0}"
                )),
                cell(
                    floor.and_then(|f| results.added_cpu(v, f, size)),
                    |x| format!("{x:+.0}")
                ),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p50_us: f64, rps: f64) -> Sample {
        Sample {
            p50_us,
            p99_us: p50_us * 2.0,
            rps,
            cpu_us: Some(1e6 / rps),
        }
    }

    #[test]
    fn median_handles_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn ratios_pair_samples_of_the_same_round() {
        let mut r = Results::default();
        // Round 2 is uniformly slower (noise); paired ratios stay at 0.9 in both.
        r.record(Variant::FloorInChain, 4096, s(100.0, 1000.0));
        r.record(Variant::FloorInChain, 4096, s(200.0, 500.0));
        r.record(Variant::TetherHeader, 4096, s(110.0, 900.0));
        r.record(Variant::TetherHeader, 4096, s(220.0, 450.0));
        let ratio = r
            .rps_ratio(Variant::TetherHeader, Variant::FloorInChain, 4096)
            .expect("ratio");
        assert!((ratio - 0.9).abs() < 1e-9);
        assert!(matches!(header_target(&r, &[4096]), Verdict::Miss(_)));
    }

    #[test]
    fn added_cpu_pairs_only_rounds_where_both_were_measured() {
        let mut r = Results::default();
        let with = |cpu: Option<f64>| Sample {
            cpu_us: cpu,
            ..s(100.0, 1000.0)
        };
        r.record(Variant::BodyFloorInChain, 4096, with(Some(100.0)));
        r.record(Variant::BodyFloorInChain, 4096, with(None));
        r.record(Variant::BodyFloorInChain, 4096, with(Some(300.0)));
        r.record(Variant::TetherBody, 4096, with(Some(130.0)));
        r.record(Variant::TetherBody, 4096, with(Some(999.0)));
        r.record(Variant::TetherBody, 4096, with(Some(310.0)));
        // Rounds 1 and 3 pair: +30 and +10; round 2 has no floor figure.
        let d = r
            .added_cpu(Variant::TetherBody, Variant::BodyFloorInChain, 4096)
            .expect("two paired rounds");
        assert!((d - 20.0).abs() < 1e-9, "{d}");
        let floor = r.median_of(Variant::BodyFloorInChain, 4096, |s| s.cpu_us);
        assert_eq!(floor, Some(200.0));
    }

    #[test]
    fn body_target_compares_added_latency_not_totals() {
        let mut r = Results::default();
        let size = 400 * 1024;
        r.record(Variant::NoFilter, size, s(500.0, 2000.0));
        r.record(Variant::BodyFloorInChain, size, s(560.0, 1800.0));
        r.record(Variant::TetherBody, size, s(570.0, 1700.0));
        // tether adds 70 µs, the floor 60 µs: 70 ≤ 1.25 × 60 = 75.
        assert!(matches!(body_target(&r, size), Verdict::Pass(_)));
        r = Results::default();
        r.record(Variant::NoFilter, size, s(500.0, 2000.0));
        r.record(Variant::BodyFloorInChain, size, s(560.0, 1800.0));
        r.record(Variant::TetherBody, size, s(580.0, 1700.0));
        assert!(matches!(body_target(&r, size), Verdict::Miss(_)));
    }

    #[test]
    fn a_floor_lost_in_noise_is_inconclusive_not_a_pass() {
        let mut r = Results::default();
        let size = 400 * 1024;
        r.record(Variant::NoFilter, size, s(600.0, 2000.0));
        r.record(Variant::BodyFloorInChain, size, s(580.0, 1800.0));
        r.record(Variant::TetherBody, size, s(590.0, 1700.0));
        assert!(matches!(body_target(&r, size), Verdict::Inconclusive(_)));
    }

    #[test]
    fn missing_variants_make_targets_pending() {
        let r = Results::default();
        assert!(matches!(header_target(&r, &[4096]), Verdict::Pending(_)));
        assert!(matches!(body_target(&r, 4096), Verdict::Pending(_)));
    }
}
