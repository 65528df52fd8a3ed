//! Every bootstrap passes `envoy --mode validate`; a bad plugin configuration
//! keeps Envoy from starting, with a log line naming the field.

use crate::support::*;
use serde_json::json;
use tether_e2e::{Envoy, HarnessError, bootstrap, paths};

#[test]
fn every_bootstrap_validates() {
    need(paths::require_envoy());
    let filter = need(paths::require_filter_wasm());
    // The files on disk are the ones embedded in the harness.
    for (name, text) in bootstrap::ALL {
        let on_disk =
            std::fs::read_to_string(paths::envoy_dir().join(name)).expect("bootstrap file");
        assert_eq!(on_disk, text, "{name}");
        // Each with the plugin configuration it is written for (its outputs
        // match its header_mutation entries: tether_envoy::outputs).
        let (_, cfg) = tether_envoy::bootstraps::PLUGIN_CONFIGS
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a plugin configuration per bootstrap");
        let cfg: serde_json::Value = serde_json::from_str(cfg).expect("JSON");
        let mut b = Envoy::builder()
            .var("FILTER_WASM", filter.display().to_string())
            .plugin_config(&cfg);
        for i in 0..4 {
            b = b.var(format!("RANK_{i}_PORT"), (10000 + i).to_string());
        }
        if let Err(e) = b.validate(text) {
            panic!("{name} does not validate: {e}");
        }
    }
}

#[test]
fn validate_rejects_a_broken_bootstrap() {
    need(paths::require_envoy());
    let broken = bootstrap::HASH.replace("hash_balance_factor", "hash_balance_factr");
    let b = Envoy::builder()
        .plugin_config(&json!({"mode": "hash"}))
        .var("RANK_0_PORT", "1")
        .var("RANK_1_PORT", "2");
    let b = b.var("RANK_2_PORT", "3").var("RANK_3_PORT", "4");
    match b.validate(&broken) {
        Err(HarnessError::Invalid { log, .. }) => {
            assert!(log.contains("hash_balance_factr"), "{log}")
        }
        other => panic!("expected rejection, got {other:?}"),
    }
}

/// Starts Envoy with a bad tether configuration; returns the log.
fn refused(cfg: serde_json::Value) -> String {
    need_envoy_and_filter();
    let r = Envoy::builder()
        .plugin_config(&cfg)
        .var("RANK_0_PORT", "10000")
        .start(bootstrap::VLLM_DP);
    match r {
        Err(HarnessError::ExitedEarly { log, .. }) => log,
        Err(e) => panic!("expected Envoy to exit, got {e}"),
        Ok(e) => panic!("Envoy started with {cfg}; log:\n{}", e.log()),
    }
}

#[test]
fn bad_plugin_configuration_refuses_to_start_naming_the_field() {
    let cases = [
        (json!({"mode": "pick", "endpoints": []}), "endpoints"),
        (
            json!({"mode": "hash", "sesion_sources": []}),
            "sesion_sources",
        ),
        (
            json!({"mode": "pick", "endpoints": [{"address": "not-an-address"}]}),
            "address",
        ),
        (
            json!({"mode": "pick", "endpoints": [{"address": "127.0.0.1:1", "weight": 0}]}),
            "weight",
        ),
        (json!({"mode": "sideways"}), "mode"),
    ];
    for (cfg, field) in cases {
        let log = refused(cfg.clone());
        let line = log
            .lines()
            .find(|l| l.contains("tether: invalid configuration"))
            .unwrap_or_else(|| panic!("{cfg}: no `tether: invalid configuration` line in:\n{log}"));
        assert!(
            line.contains(field),
            "{cfg}: line does not name `{field}`: {line}"
        );
    }
}
