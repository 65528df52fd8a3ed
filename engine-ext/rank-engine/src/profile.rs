//! GPU performance profiles: the in-memory, format-neutral type every latency
//! model in tether reads, and its JSON reader (`docs/profile.md`).
//!
//! A profile describes one engine (a set of GPUs serving one model replica):
//! how long prefill takes per input length, how long one decode step takes per
//! batch size and context, how much KV fits, how fast the host tier restores,
//! and what the GPUs cost. Curves are plain point lists with linear
//! interpolation ([`Curve`], [`DecodeSurface`]), so any profiler's output —
//! tether's JSON, Dynamo's pre-deployment NPZ, a hand-measured table — maps onto
//! the same type by building the point lists.

use serde::Deserialize;
use std::path::Path;
use thiserror::Error;

/// Why a profile was refused; the message names the field.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("reading profile {path}: {why}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        why: String,
    },
    /// Not JSON of the profile's shape (missing, unknown or mistyped field).
    #[error("profile is not valid: {0}")]
    Parse(String),
    /// A field holds a value outside its range.
    #[error("profile field `{field}`: {why}")]
    Field {
        /// Path of the field, e.g. `prefill.points[2].isl`.
        field: String,
        /// What is wrong with it.
        why: String,
    },
}

fn field_err(field: impl Into<String>, why: impl Into<String>) -> ProfileError {
    ProfileError::Field {
        field: field.into(),
        why: why.into(),
    }
}

/// A 1-D curve `y(x)` given by points with strictly increasing `x`.
///
/// Between points: linear interpolation. Outside: the nearest segment extended
/// (a single point is a constant), never below zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    points: Vec<(f64, f64)>,
}

impl Curve {
    /// A curve through `points`; `field` names them in errors.
    pub fn try_new(field: &str, points: Vec<(f64, f64)>) -> Result<Self, ProfileError> {
        if points.is_empty() {
            return Err(field_err(field, "needs at least one point"));
        }
        for (i, (x, y)) in points.iter().enumerate() {
            if !x.is_finite() || !y.is_finite() || *x < 0.0 || *y < 0.0 {
                return Err(field_err(
                    format!("{field}[{i}]"),
                    format!("({x}, {y}) must be finite and non-negative"),
                ));
            }
            if i > 0 && *x <= points[i - 1].0 {
                return Err(field_err(
                    format!("{field}[{i}]"),
                    format!(
                        "x = {x} must be greater than the previous point's {}",
                        points[i - 1].0
                    ),
                ));
            }
        }
        Ok(Self { points })
    }

    /// The points, by increasing `x`.
    pub fn points(&self) -> &[(f64, f64)] {
        &self.points
    }

    /// `y` at `x`.
    pub fn at(&self, x: f64) -> f64 {
        let p = &self.points;
        if p.len() == 1 {
            return p[0].1;
        }
        // Index of the segment [i, i+1] to use (clamped to the ends for extrapolation).
        let i = match p.iter().position(|(px, _)| *px >= x) {
            Some(0) => 0,
            Some(j) => j - 1,
            None => p.len() - 2,
        };
        let ((x0, y0), (x1, y1)) = (p[i], p[i + 1]);
        (y0 + (y1 - y0) * (x - x0) / (x1 - x0)).max(0.0)
    }
}

/// Decode step time as a function of batch size and context length: one
/// [`Curve`] (batch → ITL ms) per measured context, by increasing context.
/// Interpolated in batch on the two contexts around the query, then linearly in
/// context (extended beyond the ends, never below zero).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeSurface {
    by_context: Vec<(f64, Curve)>,
}

impl DecodeSurface {
    /// A surface from per-context curves; `field` names it in errors.
    pub fn try_new(field: &str, by_context: Vec<(f64, Curve)>) -> Result<Self, ProfileError> {
        if by_context.is_empty() {
            return Err(field_err(field, "needs at least one point"));
        }
        for (i, (c, _)) in by_context.iter().enumerate() {
            if !c.is_finite() || *c <= 0.0 {
                return Err(field_err(field, format!("context {c} must be positive")));
            }
            if i > 0 && *c <= by_context[i - 1].0 {
                return Err(field_err(field, "contexts must increase"));
            }
        }
        Ok(Self { by_context })
    }

    /// A surface from `(context, batch, itl_ms)` points: grouped by context,
    /// each group's batches sorted (they must be distinct); `field` names them
    /// in errors.
    pub fn from_points(
        field: &str,
        points: impl IntoIterator<Item = (f64, f64, f64)>,
    ) -> Result<Self, ProfileError> {
        let mut groups: Vec<(f64, Vec<(f64, f64)>)> = Vec::new();
        for (c, b, itl) in points {
            match groups.iter_mut().find(|(x, _)| *x == c) {
                Some((_, v)) => v.push((b, itl)),
                None => groups.push((c, vec![(b, itl)])),
            }
        }
        groups.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut by_context = Vec::with_capacity(groups.len());
        for (c, mut pts) in groups {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            by_context.push((
                c,
                Curve::try_new(&format!("{field} (context {c}) batches"), pts)?,
            ));
        }
        Self::try_new(field, by_context)
    }

    /// The per-context curves.
    pub fn curves(&self) -> &[(f64, Curve)] {
        &self.by_context
    }

    /// ITL in ms of one decode step over `batch` sequences of mean context `context`.
    pub fn itl_ms(&self, batch: f64, context: f64) -> f64 {
        self.at_batch(batch).itl_ms(context)
    }

    /// The surface at one batch size: ITL by context, with the per-context
    /// batch interpolation done once (a decode run keeps its batch while its
    /// context grows; the values are those of [`DecodeSurface::itl_ms`]).
    pub fn at_batch(&self, batch: f64) -> BatchCurve {
        BatchCurve {
            points: self
                .by_context
                .iter()
                .map(|(c, curve)| (*c, curve.at(batch)))
                .collect(),
        }
    }
}

/// ITL by context at one batch size ([`DecodeSurface::at_batch`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchCurve {
    points: Vec<(f64, f64)>,
}

impl BatchCurve {
    /// ITL in ms at mean context `context`.
    pub fn itl_ms(&self, context: f64) -> f64 {
        let c = &self.points;
        if c.len() == 1 {
            return c[0].1;
        }
        let i = match c.iter().position(|(cx, _)| *cx >= context) {
            Some(0) => 0,
            Some(j) => j - 1,
            None => c.len() - 2,
        };
        let ((c0, y0), (c1, y1)) = (c[i], c[i + 1]);
        (y0 + (y1 - y0) * (context - c0) / (c1 - c0)).max(0.0)
    }
}

/// One engine's performance and price: what a latency model, a fleet
/// simulator or a planner needs. Built by [`Profile::from_json`] or by any
/// other reader that fills the same fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Short name, e.g. `llama-3.1-8b-fp8-h200-tp1`.
    pub name: String,
    /// Model served (the default served model name).
    pub model: String,
    /// GPU type, for reports.
    pub gpu: String,
    /// GPUs one engine (one rank, one DP rank) occupies.
    pub gpus_per_engine: u32,
    /// Price of one GPU-hour in USD.
    pub gpu_hour_usd: f64,
    /// KV tokens one engine holds on the device.
    pub max_kv_tokens: u64,
    /// Bytes of KV per token across all layers (host-tier sizing, restore time).
    pub kv_bytes_per_token: u64,
    /// Host → device restore bandwidth in GB/s (10⁹ bytes per second).
    pub host_restore_gbps: f64,
    /// Longest prompt + output the engine accepts; `None` = unbounded.
    pub max_model_len: Option<u64>,
    /// Prefill time of a lone request: uncached input tokens → ms.
    pub prefill_ttft_ms: Curve,
    /// Decode inter-token latency by batch size and context.
    pub decode_itl_ms: DecodeSurface,
    /// For a hybrid model (linear-attention / SSM layers beside attention): its state.
    pub hybrid: Option<HybridState>,
    /// Where the figures come from.
    pub sources: Vec<String>,
}

/// A hybrid model's linear state, as the engine keeps it (vLLM `--mamba-cache-mode
/// align`): one snapshot per resumable boundary, paid from the KV budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridState {
    /// Bytes of one state snapshot over all linear-attention / SSM layers (and all
    /// GPUs of the engine): what a retained boundary costs on the device and the host
    /// link, on top of its KV.
    pub state_bytes: u64,
    /// Tokens between the boundaries the engine can resume at (vLLM's
    /// `mamba_block_size`, equal to its block size in align mode).
    pub align_tokens: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonProfile {
    name: String,
    model: String,
    gpu: String,
    gpus_per_engine: u32,
    gpu_hour_usd: f64,
    max_kv_tokens: u64,
    kv_bytes_per_token: u64,
    host_restore_gbps: f64,
    #[serde(default)]
    max_model_len: Option<u64>,
    prefill: JsonPrefill,
    decode: JsonDecode,
    #[serde(default)]
    hybrid: Option<JsonHybrid>,
    #[serde(default)]
    sources: Vec<String>,
    #[serde(default)]
    #[allow(dead_code, reason = "free text for humans; accepted, not used")]
    notes: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonHybrid {
    state_bytes: u64,
    align_tokens: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonPrefill {
    points: Vec<PrefillPoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefillPoint {
    isl: f64,
    ttft_ms: f64,
    #[serde(default)]
    #[allow(dead_code, reason = "provenance marker for humans; accepted, not used")]
    derived: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDecode {
    points: Vec<DecodePoint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodePoint {
    context: f64,
    batch: f64,
    itl_ms: f64,
    #[serde(default)]
    #[allow(dead_code, reason = "provenance marker for humans; accepted, not used")]
    derived: bool,
}

impl Profile {
    /// Reads and validates a JSON profile file.
    pub fn from_file(path: &Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|e| ProfileError::Read {
            path: path.display().to_string(),
            why: e.to_string(),
        })?;
        Self::from_json(&text)
    }

    /// Parses and validates the JSON profile format (`docs/profile.md`).
    pub fn from_json(text: &str) -> Result<Self, ProfileError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let j: JsonProfile = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                ProfileError::Parse(e.inner().to_string())
            } else {
                field_err(path, e.inner().to_string())
            }
        })?;
        let prefill = Curve::try_new(
            "prefill.points",
            j.prefill
                .points
                .iter()
                .map(|p| (p.isl, p.ttft_ms))
                .collect(),
        )?;
        if prefill.points().iter().any(|(x, y)| *x <= 0.0 || *y <= 0.0) {
            return Err(field_err(
                "prefill.points",
                "every isl and ttft_ms must be positive",
            ));
        }
        let mut points = Vec::with_capacity(j.decode.points.len());
        for (i, p) in j.decode.points.iter().enumerate() {
            if !(p.context.is_finite() && p.context > 0.0) {
                return Err(field_err(
                    format!("decode.points[{i}].context"),
                    "must be positive",
                ));
            }
            if !(p.batch.is_finite() && p.batch >= 1.0) {
                return Err(field_err(
                    format!("decode.points[{i}].batch"),
                    "must be at least 1",
                ));
            }
            if !(p.itl_ms.is_finite() && p.itl_ms > 0.0) {
                return Err(field_err(
                    format!("decode.points[{i}].itl_ms"),
                    "must be positive",
                ));
            }
            points.push((p.context, p.batch, p.itl_ms));
        }
        let decode = DecodeSurface::from_points("decode.points", points)?;
        let p = Profile {
            name: j.name,
            model: j.model,
            gpu: j.gpu,
            gpus_per_engine: j.gpus_per_engine,
            gpu_hour_usd: j.gpu_hour_usd,
            max_kv_tokens: j.max_kv_tokens,
            kv_bytes_per_token: j.kv_bytes_per_token,
            host_restore_gbps: j.host_restore_gbps,
            max_model_len: j.max_model_len,
            prefill_ttft_ms: prefill,
            decode_itl_ms: decode,
            hybrid: j.hybrid.map(|h| HybridState {
                state_bytes: h.state_bytes,
                align_tokens: h.align_tokens,
            }),
            sources: j.sources,
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks the scalar fields (readers of other formats call this too).
    pub fn validate(&self) -> Result<(), ProfileError> {
        if self.name.trim().is_empty() {
            return Err(field_err("name", "must not be empty"));
        }
        if self.model.trim().is_empty() {
            return Err(field_err("model", "must not be empty"));
        }
        if self.gpus_per_engine == 0 {
            return Err(field_err("gpus_per_engine", "must be at least 1"));
        }
        if !(self.gpu_hour_usd.is_finite() && self.gpu_hour_usd >= 0.0) {
            return Err(field_err("gpu_hour_usd", "must be a non-negative number"));
        }
        if self.max_kv_tokens == 0 {
            return Err(field_err("max_kv_tokens", "must be positive"));
        }
        if self.kv_bytes_per_token == 0 {
            return Err(field_err("kv_bytes_per_token", "must be positive"));
        }
        if !(self.host_restore_gbps.is_finite() && self.host_restore_gbps > 0.0) {
            return Err(field_err("host_restore_gbps", "must be positive"));
        }
        if self.max_model_len == Some(0) {
            return Err(field_err("max_model_len", "must be positive when set"));
        }
        if let Some(h) = self.hybrid {
            if h.state_bytes == 0 {
                return Err(field_err("hybrid.state_bytes", "must be positive"));
            }
            if h.align_tokens == 0 {
                return Err(field_err("hybrid.align_tokens", "must be positive"));
            }
        }
        Ok(())
    }

    /// Price of one engine-hour in USD.
    pub fn engine_hour_usd(&self) -> f64 {
        self.gpu_hour_usd * f64::from(self.gpus_per_engine)
    }
}

/// A profile with the given curves for unit tests: prefill points, and
/// per-context decode points.
#[cfg(test)]
pub(crate) fn test_profile(
    prefill: &[(f64, f64)],
    decode: &[(f64, &[(f64, f64)])],
    kv_bytes_per_token: u64,
    host_restore_gbps: f64,
) -> Profile {
    Profile {
        name: "test".into(),
        model: "m".into(),
        gpu: "g".into(),
        gpus_per_engine: 1,
        gpu_hour_usd: 2.0,
        max_kv_tokens: 1 << 20,
        kv_bytes_per_token,
        host_restore_gbps,
        max_model_len: None,
        prefill_ttft_ms: Curve::try_new("prefill", prefill.to_vec()).unwrap(),
        decode_itl_ms: DecodeSurface::try_new(
            "decode",
            decode
                .iter()
                .map(|(c, pts)| (*c, Curve::try_new("decode", pts.to_vec()).unwrap()))
                .collect(),
        )
        .unwrap(),
        hybrid: None,
        sources: vec![],
    }
}

#[cfg(test)]
mod tests;
