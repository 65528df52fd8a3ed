//! NVIDIA Dynamo's pre-deployment profiling output as a tether profile.
//!
//! Dynamo's profiler (`benchmarks/profiler/profile_sla.py` in `ai-dynamo/dynamo`)
//! saves two NPZ files (a zip of `.npy` arrays, `numpy.savez`):
//!
//! - `selected_prefill_interpolation/raw_data.npz`: `prefill_isl` (input
//!   tokens), `prefill_ttft` (ms, one request alone), `prefill_thpt_per_gpu`
//!   (tokens/s per GPU = isl ÷ ttft ÷ GPUs);
//! - `selected_decode_interpolation/raw_data.npz`: per measured point
//!   `x_kv_usage` (active KV over the engine's KV capacity), `y_context_length`
//!   (ISL + OSL/2 of the sweep), `z_itl` (ms), `z_thpt_per_gpu` (output
//!   tokens/s per GPU), and `max_kv_tokens` (one value).
//!
//! A decode point's batch is the number of concurrent requests it was measured
//! with: `x_kv_usage × max_kv_tokens ÷ y_context_length` (how the profiler
//! computes `x`). The NPZ files do not say what the engine is, what it costs or
//! how large its KV is per token; a small JSON file names them and the two
//! NPZ paths (`docs/profile.md`, "Dynamo profiles"). GPUs per engine, when not
//! given, follow from the throughputs: `batch × 1000 ÷ itl ÷ z_thpt_per_gpu`.

use npyz::npz::NpzArchive;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tether_rank_engine::profile::{Curve, DecodeSurface, Profile, ProfileError};

fn field(f: impl Into<String>, why: impl Into<String>) -> ProfileError {
    ProfileError::Field {
        field: f.into(),
        why: why.into(),
    }
}

/// The JSON around Dynamo's NPZ files.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    dynamo: Files,
    name: String,
    model: String,
    gpu: String,
    #[serde(default)]
    gpus_per_engine: Option<u32>,
    gpu_hour_usd: f64,
    kv_bytes_per_token: u64,
    host_restore_gbps: f64,
    #[serde(default)]
    max_model_len: Option<u64>,
    #[serde(default)]
    sources: Vec<String>,
    #[serde(default)]
    #[allow(dead_code, reason = "free text for humans; accepted, not used")]
    notes: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Files {
    prefill: PathBuf,
    decode: PathBuf,
}

/// The arrays of one NPZ file, as f64, by name.
struct Arrays {
    file: String,
    archive: NpzArchive<std::io::BufReader<std::fs::File>>,
}

impl Arrays {
    fn open(path: &Path, what: &str) -> Result<Self, ProfileError> {
        let file = path.display().to_string();
        let archive = NpzArchive::open(path).map_err(|e| ProfileError::Read {
            path: file.clone(),
            why: format!("{what} NPZ: {e}"),
        })?;
        Ok(Self { file, archive })
    }

    /// A one-dimensional numeric array (any of numpy's float and integer
    /// dtypes), each value finite.
    fn get(&mut self, prefix: &str, name: &str) -> Result<Vec<f64>, ProfileError> {
        let path = format!("{prefix}.{name}");
        let npy = self
            .archive
            .by_name(name)
            .map_err(|e| field(&path, format!("unreadable in {}: {e}", self.file)))?
            .ok_or_else(|| field(&path, format!("missing from {}", self.file)))?;
        if npy.shape().len() != 1 {
            return Err(field(
                &path,
                format!("must be one-dimensional, has shape {:?}", npy.shape()),
            ));
        }
        let descr = npy.dtype().descr();
        let bad = |e: std::io::Error| field(&path, format!("unreadable {descr} data: {e}"));
        let type_str = descr.trim_matches('\'');
        let values: Vec<f64> = match type_str.get(1..) {
            Some("f8") => npy.into_vec::<f64>().map_err(bad)?,
            Some("f4") => npy
                .into_vec::<f32>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            Some("i8") => npy
                .into_vec::<i64>()
                .map_err(bad)?
                .into_iter()
                .map(|v| v as f64)
                .collect(),
            Some("i4") => npy
                .into_vec::<i32>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            Some("u8") => npy
                .into_vec::<u64>()
                .map_err(bad)?
                .into_iter()
                .map(|v| v as f64)
                .collect(),
            Some("u4") => npy
                .into_vec::<u32>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            _ => {
                return Err(field(
                    &path,
                    format!("dtype {descr} is not a float or integer type"),
                ));
            }
        };
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(field(format!("{path}[{i}]"), "must be finite"));
        }
        Ok(values)
    }
}

fn same_len(prefix: &str, arrays: &[(&str, &[f64])]) -> Result<usize, ProfileError> {
    let n = arrays[0].1.len();
    if n == 0 {
        return Err(field(format!("{prefix}.{}", arrays[0].0), "has no points"));
    }
    for (name, a) in arrays {
        if a.len() != n {
            return Err(field(
                format!("{prefix}.{name}"),
                format!("has {} values, {} has {n}", a.len(), arrays[0].0),
            ));
        }
    }
    Ok(n)
}

/// Reads a Dynamo profile: the JSON `text` (whose NPZ paths are relative to
/// `dir`) and the two NPZ files it names.
pub fn from_json(text: &str, dir: &Path) -> Result<Profile, ProfileError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let m: Meta = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            ProfileError::Parse(e.inner().to_string())
        } else {
            field(path, e.inner().to_string())
        }
    })?;
    let mut pre = Arrays::open(&dir.join(&m.dynamo.prefill), "prefill")?;
    let isl = pre.get("prefill", "prefill_isl")?;
    let ttft = pre.get("prefill", "prefill_ttft")?;
    let pthpt = pre.get("prefill", "prefill_thpt_per_gpu")?;
    same_len(
        "prefill",
        &[
            ("prefill_isl", &isl),
            ("prefill_ttft", &ttft),
            ("prefill_thpt_per_gpu", &pthpt),
        ],
    )?;
    let mut points: Vec<(f64, f64)> = Vec::with_capacity(isl.len());
    for (i, (&x, &y)) in isl.iter().zip(&ttft).enumerate() {
        if x <= 0.0 {
            return Err(field(
                format!("prefill.prefill_isl[{i}]"),
                "must be positive",
            ));
        }
        if y <= 0.0 {
            return Err(field(
                format!("prefill.prefill_ttft[{i}]"),
                "must be positive",
            ));
        }
        points.push((x, y));
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let prefill = Curve::try_new("prefill.prefill_isl", points)?;

    let mut dec = Arrays::open(&dir.join(&m.dynamo.decode), "decode")?;
    let x = dec.get("decode", "x_kv_usage")?;
    let y = dec.get("decode", "y_context_length")?;
    let z = dec.get("decode", "z_itl")?;
    let zt = dec.get("decode", "z_thpt_per_gpu")?;
    let kv = dec.get("decode", "max_kv_tokens")?;
    same_len(
        "decode",
        &[
            ("x_kv_usage", &x),
            ("y_context_length", &y),
            ("z_itl", &z),
            ("z_thpt_per_gpu", &zt),
        ],
    )?;
    let max_kv_tokens = match kv.as_slice() {
        [v] if *v >= 1.0 => *v as u64,
        [_] => return Err(field("decode.max_kv_tokens", "must be at least 1")),
        _ => {
            return Err(field(
                "decode.max_kv_tokens",
                format!("must hold one value, holds {}", kv.len()),
            ));
        }
    };
    let mut points = Vec::with_capacity(x.len());
    let mut tp_estimates = Vec::new();
    for i in 0..x.len() {
        if x[i] <= 0.0 {
            return Err(field(format!("decode.x_kv_usage[{i}]"), "must be positive"));
        }
        if y[i] <= 0.0 {
            return Err(field(
                format!("decode.y_context_length[{i}]"),
                "must be positive",
            ));
        }
        if z[i] <= 0.0 {
            return Err(field(format!("decode.z_itl[{i}]"), "must be positive"));
        }
        let raw = x[i] * max_kv_tokens as f64 / y[i];
        // Concurrency is a request count: snap float noise back onto it.
        let batch = if (raw - raw.round()).abs() < 1e-3 {
            raw.round()
        } else {
            raw
        };
        if batch < 1.0 - 1e-9 {
            return Err(field(
                format!("decode.x_kv_usage[{i}]"),
                format!("implies a batch of {batch:.3} (< 1) at context {}", y[i]),
            ));
        }
        if zt[i] > 0.0 {
            tp_estimates.push(batch * 1000.0 / z[i] / zt[i]);
        }
        points.push((y[i], batch.max(1.0), z[i]));
    }
    let decode = DecodeSurface::from_points("decode", points)?;
    let gpus_per_engine = match m.gpus_per_engine {
        Some(g) => g,
        None => derive_gpus(&mut tp_estimates)?,
    };
    let mut sources = m.sources;
    sources.push(format!(
        "Converted from Dynamo pre-deployment profiling output ({} prefill points from {}, {} decode points from {}): decode batch = x_kv_usage x max_kv_tokens / y_context_length.",
        isl.len(),
        m.dynamo.prefill.display(),
        x.len(),
        m.dynamo.decode.display()
    ));
    let p = Profile {
        name: m.name,
        model: m.model,
        gpu: m.gpu,
        gpus_per_engine,
        gpu_hour_usd: m.gpu_hour_usd,
        max_kv_tokens,
        kv_bytes_per_token: m.kv_bytes_per_token,
        host_restore_gbps: m.host_restore_gbps,
        max_model_len: m.max_model_len,
        prefill_ttft_ms: prefill,
        decode_itl_ms: decode,
        hybrid: None,
        sources,
    };
    p.validate()?;
    Ok(p)
}

/// GPUs per engine from decode throughput per GPU: the median of
/// `batch × 1000 ÷ itl ÷ z_thpt_per_gpu`, which must be a whole number.
fn derive_gpus(estimates: &mut [f64]) -> Result<u32, ProfileError> {
    if estimates.is_empty() {
        return Err(field(
            "gpus_per_engine",
            "not given, and z_thpt_per_gpu has no positive value to derive it from",
        ));
    }
    estimates.sort_by(f64::total_cmp);
    let median = estimates[estimates.len() / 2];
    let whole = median.round();
    if whole < 1.0 || (median - whole).abs() > 0.1 * whole {
        return Err(field(
            "gpus_per_engine",
            format!(
                "not given, and the throughputs imply {median:.2} GPUs per engine, not a whole number: give it"
            ),
        ));
    }
    Ok(whole as u32)
}

#[cfg(test)]
mod tests;
