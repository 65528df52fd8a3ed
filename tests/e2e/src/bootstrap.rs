//! The Envoy bootstraps of `envoy/`, embedded so binaries and tests need no
//! path at run time, and helpers that fill their rank placeholders.

use crate::EchoRank;

/// Pick mode, several STATIC ranks behind the `override_host` LB policy (the demo).
pub const DEMO: &str = include_str!("../../../envoy/demo.yaml");
/// Pick mode with an `ORIGINAL_DST` cluster instead of `override_host`.
pub const ORIGINAL_DST: &str = include_str!("../../../envoy/original-dst.yaml");
/// Hash mode: MAGLEV with bounded load on `x-tether-key`.
pub const HASH: &str = include_str!("../../../envoy/hash.yaml");
/// One vLLM server with data parallelism (`x-data-parallel-rank`).
pub const VLLM_DP: &str = include_str!("../../../envoy/vllm-dp.yaml");

/// Every bootstrap with its file name, for validation.
pub const ALL: [(&str, &str); 4] = [
    ("demo.yaml", DEMO),
    ("original-dst.yaml", ORIGINAL_DST),
    ("hash.yaml", HASH),
    ("vllm-dp.yaml", VLLM_DP),
];

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
