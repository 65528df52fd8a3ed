//! P/D in pick mode: the decode endpoint is the session's pick (cache
//! locality); a prefill endpoint from a separate pool, the one whose queued
//! prefill would hold a new one back the least (its backlog at its own rate),
//! is named in `x-prefiller-host-port` (llm-d) only
//! when the prompt tokens the decode endpoint is not expected to hold exceed
//! a threshold ([`tether_placement::disaggregate`], the simulator's rule).
//!
//! The filter sees bytes, not tokens, and not the rank's cache. Its estimate
//! (documented in `docs/gateway.md` "P/D"): prompt tokens = body bytes ÷
//! `bytes_per_token`; on a returning turn that stays on its primary endpoint
//! the decode endpoint is expected to hold everything before the last
//! assistant entry (retention pinned it), so only the bytes after it are
//! uncached ([`crate::read::turn::new_turn_bytes`]); a first turn, a turn with no
//! assistant entry in view, or a key spilled off its primary is expected
//! wholly uncached.

use crate::config::pd::PdConfig;
use tether_placement::{Placement, disaggregate};

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
/// (per prefill endpoint, how long its queued prefill holds a new one back,
/// ms; all 0 when unknown), ties
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
