//! The Envoy bootstraps of `envoy/` (embedded by `tether_envoy::bootstraps`)
//! and helpers that fill their rank placeholders.

use crate::EchoRank;

pub use tether_envoy::bootstraps::{ALL, DEMO, HASH, ORIGINAL_DST, VLLM_DP};

/// Template variables `RANK_0`, `RANK_1`, … = each rank's `ip:port` split as
/// `RANK_<i>_IP` / `RANK_<i>_PORT` (Envoy wants address and port apart).
pub fn rank_vars(ranks: &[EchoRank]) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for (i, r) in ranks.iter().enumerate() {
        v.push((format!("RANK_{i}_IP"), r.addr().ip().to_string()));
        v.push((format!("RANK_{i}_PORT"), r.port().to_string()));
    }
    v
}
