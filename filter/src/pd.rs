//! P/D in pick mode: the decode endpoint is the session's pick (cache
//! locality); a prefill endpoint from a separate pool, the least loaded by
//! queued prefill tokens, is named in `x-prefiller-host-port` (llm-d) only
//! when the prompt tokens the decode endpoint is not expected to hold exceed
//! a threshold ([`tether_placement::disaggregate`], the simulator's rule).
//!
//! The filter sees bytes, not tokens, and not the rank's cache. Its estimate
//! (documented in `docs/gateway.md` "P/D"): prompt tokens = body bytes ÷
//! `bytes_per_token`; on a returning turn that stays on its primary endpoint
//! the decode endpoint is expected to hold everything before the last
//! assistant entry (retention pinned it), so only the bytes after it are
//! uncached ([`crate::turn::new_turn_bytes`]); a first turn, a turn with no
//! assistant entry in view, or a key spilled off its primary is expected
//! wholly uncached.

use tether_placement::{Endpoint, Placement, disaggregate};

/// The `pd` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PdConfig {
    /// The prefill pool (`x-prefiller-host-port` candidates).
    pub prefill: Vec<Endpoint>,
    /// Disaggregate when more expected-uncached prompt tokens than this.
    pub threshold_tokens: u64,
    /// Request-body bytes per prompt token, for the estimate.
    pub bytes_per_token: f64,
}

/// Default `pd.threshold_tokens`: the fleet simulator's default (`tether simulate --pd-threshold`).
pub const DEFAULT_THRESHOLD_TOKENS: u64 = 2048;
/// Default `pd.bytes_per_token`: JSON of English text and code runs near 4 bytes per token.
pub const DEFAULT_BYTES_PER_TOKEN: f64 = 4.0;

/// The filter's guess at a request's prompt and the part its decode endpoint holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    pub prompt_tokens: u64,
    pub expected_cached: u64,
}

/// The estimate from the body size and, on a returning turn that stays on
/// its primary, the bytes after the last assistant entry.
pub fn estimate(body_bytes: usize, new_bytes: Option<usize>, spilled: bool, bpt: f64) -> Estimate {
    let tokens = |b: usize| (b as f64 / bpt.max(f64::MIN_POSITIVE)).ceil() as u64;
    let prompt_tokens = tokens(body_bytes);
    let uncached = match (new_bytes, spilled) {
        (Some(n), false) => tokens(n.min(body_bytes)),
        _ => prompt_tokens,
    };
    Estimate {
        prompt_tokens,
        expected_cached: prompt_tokens.saturating_sub(uncached),
    }
}

/// The prefill endpoint (index into `prefill`) for `key`, or `None` when the
/// request prefills on its decode endpoint: the least loaded by `loads`
/// (queued prefill tokens per prefill endpoint; all 0 when unknown), ties
/// broken by the key's rendezvous score — deterministic for a given view.
pub fn prefiller(
    cfg: &PdConfig,
    prefill: &Placement,
    key: u64,
    est: Estimate,
    loads: &[f64],
) -> Option<usize> {
    if !disaggregate(est.prompt_tokens, est.expected_cached, cfg.threshold_tokens) {
        return None;
    }
    prefill.least_loaded(key, 0..prefill.endpoints().len(), loads)
}

#[cfg(test)]
mod tests;

impl PdConfig {
    /// Parses the `pd` object; every error names its field. `decode` are the
    /// pick-mode `endpoints`: a prefill endpoint must have every DP rank a
    /// decode endpoint may name (both legs keep the rank).
    pub fn parse(
        v: &serde_json::Value,
        decode: &[Endpoint],
    ) -> Result<Self, crate::config::ConfigError> {
        use crate::config::ConfigError;
        let err = |f: &str, why: String| ConfigError {
            field: format!("pd.{f}"),
            why,
        };
        let obj = v.as_object().ok_or_else(|| ConfigError {
            field: "pd".into(),
            why: "must be an object".into(),
        })?;
        let mut c = PdConfig {
            prefill: Vec::new(),
            threshold_tokens: DEFAULT_THRESHOLD_TOKENS,
            bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
        };
        for (k, v) in obj {
            match k.as_str() {
                "prefill_endpoints" => {
                    let list = v
                        .as_array()
                        .ok_or_else(|| err(k, "must be a list".into()))?;
                    c.prefill = list
                        .iter()
                        .enumerate()
                        .map(|(i, e)| crate::config::endpoint("pd.prefill_endpoints", i, e))
                        .collect::<Result<_, _>>()?;
                }
                "threshold_tokens" => {
                    c.threshold_tokens = v
                        .as_u64()
                        .ok_or_else(|| err(k, "must be a whole number of tokens".into()))?
                }
                "bytes_per_token" => {
                    c.bytes_per_token = v
                        .as_f64()
                        .filter(|b| b.is_finite() && *b >= 0.5 && *b <= 64.0)
                        .ok_or_else(|| err(k, "must be a number between 0.5 and 64".into()))?
                }
                _ => return Err(err(k, "unknown field".into())),
            }
        }
        if c.prefill.is_empty() {
            return Err(err("prefill_endpoints", "must not be empty".into()));
        }
        let need = decode.iter().map(|e| e.dp_size).max().unwrap_or(1);
        if let Some(i) = c.prefill.iter().position(|e| e.dp_size < need) {
            return Err(err(
                &format!("prefill_endpoints[{i}].dp_size"),
                format!(
                    "must be at least {need}, the largest decode dp_size (both legs keep the DP rank)"
                ),
            ));
        }
        Ok(c)
    }
}
