//! The bootstraps of `envoy/`, embedded so binaries and tests need no path at run time.

/// Pick mode, several STATIC ranks behind the `override_host` LB policy (the demo).
pub const DEMO: &str = include_str!("../demo.yaml");
/// Pick mode with an `ORIGINAL_DST` cluster instead of `override_host`.
pub const ORIGINAL_DST: &str = include_str!("../original-dst.yaml");
/// Hash mode: MAGLEV with bounded load on `x-tether-key`.
pub const HASH: &str = include_str!("../hash.yaml");
/// One vLLM server with data parallelism (`x-data-parallel-rank`).
pub const VLLM_DP: &str = include_str!("../vllm-dp.yaml");

/// Every bootstrap with its file name, for validation.
pub const ALL: [(&str, &str); 4] = [
    ("demo.yaml", DEMO),
    ("original-dst.yaml", ORIGINAL_DST),
    ("hash.yaml", HASH),
    ("vllm-dp.yaml", VLLM_DP),
];

/// The plugin configuration each bootstrap is written for (its
/// `header_mutation` entries and header-path route match these outputs;
/// `tether_envoy::outputs::check`).
pub const PLUGIN_CONFIGS: [(&str, &str); 4] = [
    (
        "demo.yaml",
        r#"{"mode":"pick","endpoints":[{"address":"127.0.0.1:8000","dp_size":2},{"address":"127.0.0.1:8001"}]}"#,
    ),
    (
        "original-dst.yaml",
        r#"{"mode":"pick","fallbacks":0,"endpoints":[{"address":"127.0.0.1:8000"},{"address":"127.0.0.1:8001"}],"outputs":["destination"]}"#,
    ),
    ("hash.yaml", r#"{"mode":"hash"}"#),
    (
        "vllm-dp.yaml",
        r#"{"mode":"pick","endpoints":[{"address":"127.0.0.1:8000","dp_size":4}],"outputs":["dp_rank","vllm"]}"#,
    ),
];
