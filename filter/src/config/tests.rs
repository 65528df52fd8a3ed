use super::*;
use crate::config::outputs::Output;

fn err(json: &str) -> ConfigError {
    Config::parse(json.as_bytes()).expect_err(json)
}

#[test]
fn defaults_match_the_contract() {
    let c = Config::parse(b"").unwrap();
    assert_eq!(c, Config::parse(b"{}").unwrap());
    assert_eq!(c.mode, Mode::Hash);
    assert_eq!(c.fallbacks, 2);
    assert_eq!(c.session_sources.len(), DEFAULT_SESSION_SOURCES.len());
    assert_eq!(c.subagent_sources.len(), DEFAULT_SUBAGENT_SOURCES.len());
    assert_eq!(c.parent_sources.len(), DEFAULT_PARENT_SOURCES.len());
    assert_eq!(
        c.retention_ms,
        RetentionMs {
            first: 300_000,
            user: 300_000,
            tool: 120_000,
            handoff: 300_000
        }
    );
    // Hash mode emits only the key by default (preset `hash`).
    assert_eq!(c.outputs, Outputs::of(&[Output::Key]));
    assert_eq!(c.max_body_bytes, 16 * 1024 * 1024);
    assert!(c.session_sources.last().is_some_and(|s| s.with_head));
}

#[test]
fn a_full_configuration_parses() {
    let c = Config::parse(
        br#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","weight":2,"dp_size":8},{"address":"[::1]:9000"}],
        "fallbacks":1,"session_sources":["header:x-run","body:meta.run+head"],"subagent_sources":[],"parent_sources":[],
        "tenant_header":"x-tenant","cache_salt":{"secret":"s"},"retention_ms":{"tool":5},"subagent_tools":["Task"],
        "outputs":["pick","routed_dp_rank","debug"],"max_body_bytes":1000,
        "header_fast_path":false,"turn_count_max_bytes":10}"#,
    )
    .unwrap();
    assert_eq!(c.endpoints[0].weight, 2.0);
    assert_eq!(c.endpoints[1].address, "[::1]:9000");
    assert_eq!(c.endpoints[1].dp_size, 1);
    assert_eq!(
        c.session_sources[1].origin,
        Origin::Body(vec!["meta".into(), "run".into()])
    );
    assert_eq!(c.retention_ms.tool, 5);
    assert_eq!(c.retention_ms.user, 300_000);
    assert!(c.rewrites_body());
    assert_eq!(
        c.outputs,
        Outputs::of(&[
            Output::Destination,
            Output::DpRank,
            Output::RoutedDpRank,
            Output::Debug
        ])
    );
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (r#"{"bogus":1}"#, "bogus"),
        (r#"{"mode":"round"}"#, "mode"),
        (r#"{"mode":3}"#, "mode"),
        (r#"{"mode":"pick"}"#, "endpoints"),
        (r#"{"mode":"pick","endpoints":[]}"#, "endpoints"),
        (
            r#"{"endpoints":[{"address":"host:80"}]}"#,
            "endpoints[0].address",
        ),
        (
            r#"{"endpoints":[{"address":"1.2.3.4"}]}"#,
            "endpoints[0].address",
        ),
        (
            r#"{"endpoints":[{"address":"1.2.3.4:80","weight":0}]}"#,
            "endpoints[0].weight",
        ),
        (
            r#"{"endpoints":[{"address":"1.2.3.4:80","weight":-1}]}"#,
            "endpoints[0].weight",
        ),
        (
            r#"{"endpoints":[{"address":"1.2.3.4:80","weight":"x"}]}"#,
            "endpoints[0].weight",
        ),
        (
            r#"{"endpoints":[{"address":"1.2.3.4:80","dp_size":0}]}"#,
            "endpoints[0].dp_size",
        ),
        (
            r#"{"endpoints":[{"address":"1.2.3.4:80","zone":"a"}]}"#,
            "endpoints[0].zone",
        ),
        (r#"{"session_sources":["cookie:x"]}"#, "session_sources[0]"),
        (
            r#"{"session_sources":["header:X-Upper"]}"#,
            "session_sources[0]",
        ),
        (
            r#"{"subagent_sources":["body:a..b"]}"#,
            "subagent_sources[0]",
        ),
        (
            r#"{"parent_sources":["header:x-tether-key"]}"#,
            "parent_sources[0]",
        ),
        (r#"{"tenant_header":""}"#, "tenant_header"),
        (r#"{"cache_salt":{"secret":""}}"#, "cache_salt.secret"),
        (r#"{"cache_salt":{"key":"x"}}"#, "cache_salt.key"),
        (r#"{"retention_ms":{"tool":-1}}"#, "retention_ms.tool"),
        (r#"{"retention_ms":{"idle":1}}"#, "retention_ms.idle"),
        (r#"{"engine":{"session_header":true}}"#, "engine"),
        (r#"{"debug_header":true}"#, "debug_header"),
        (r#"{"outputs":"everything"}"#, "outputs"),
        (r#"{"outputs":3}"#, "outputs"),
        (r#"{"outputs":["key",7]}"#, "outputs[1]"),
        (r#"{"outputs":["key","routed_dp_rank"]}"#, "outputs[1]"),
        (r#"{"outputs":["pick"]}"#, "outputs[0]"),
        (r#"{"max_body_bytes":0}"#, "max_body_bytes"),
        (r#"{"fallbacks":-2}"#, "fallbacks"),
        (r#"[1]"#, "(configuration)"),
        (r#"{"#, "(configuration)"),
    ];
    for (json, field) in cases {
        let e = err(json);
        assert_eq!(e.field, field, "{json}: {e}");
        assert!(e.to_string().starts_with(&format!("{field}: ")), "{e}");
    }
}

#[test]
fn tenant_header_must_be_a_plain_lower_case_name() {
    for bad in ["X-Tenant", "x-Tenant", ":authority", "x:tenant", ""] {
        let e = err(&format!(r#"{{"tenant_header":"{bad}"}}"#));
        assert_eq!(e.field, "tenant_header", "{bad:?}");
    }
    let c = Config::parse(br#"{"tenant_header":"x-tenant_1"}"#).unwrap();
    assert_eq!(c.tenant_header.as_deref(), Some("x-tenant_1"));
}

/// Each body output, and salting, alone makes the filter rewrite bodies.
#[test]
fn each_body_output_alone_rewrites_the_body() {
    let pick = r#""mode":"pick","endpoints":[{"address":"10.0.0.1:8000"}]"#;
    assert!(!Config::parse(b"").unwrap().rewrites_body());
    for extra in [
        r#""cache_salt":{"secret":"k"}"#,
        r#""outputs":["body_session_id"]"#,
        r#""outputs":["routed_dp_rank"]"#,
        r#""outputs":"vllm""#,
    ] {
        let c = Config::parse(format!("{{{pick},{extra}}}").as_bytes()).unwrap();
        assert!(c.rewrites_body(), "{extra}");
    }
    assert!(
        !Config::parse(format!(r#"{{{pick},"outputs":["pick","session_id"]}}"#).as_bytes())
            .unwrap()
            .rewrites_body()
    );
}

/// `load` as part of a pick-mode configuration.
fn load(v: serde_json::Value) -> Result<LoadConfig, ConfigError> {
    let c =
        serde_json::json!({"mode": "pick", "endpoints": [{"address": "10.0.0.1:8000"}], "load": v});
    Config::parse(c.to_string().as_bytes()).map(|c| c.load.unwrap())
}

/// `pd` as part of a pick-mode configuration whose decode endpoints have `dp_size` 2.
fn pd(v: serde_json::Value) -> Result<PdConfig, ConfigError> {
    let c = serde_json::json!({"mode": "pick", "header_fast_path": false,
        "endpoints": [{"address": "10.0.0.1:8000", "dp_size": 2}], "pd": v});
    Config::parse(c.to_string().as_bytes()).map(|c| c.pd.unwrap())
}

#[test]
fn load_config_defaults_and_refusals_name_the_field() {
    let c = load(serde_json::json!({})).unwrap();
    assert_eq!(c, LoadConfig::default());
    let c = load(serde_json::json!({"poll_ms": 500})).unwrap();
    assert_eq!(c.max_age_ms, 2500, "the default age follows the period");
    for (v, field) in [
        (serde_json::json!({"poll_ms": 5}), "load.poll_ms"),
        (serde_json::json!({"poll_ms": "x"}), "load.poll_ms"),
        (serde_json::json!({"timeout_ms": 0}), "load.timeout_ms"),
        (
            serde_json::json!({"max_age_ms": 100, "poll_ms": 200}),
            "load.max_age_ms",
        ),
        (serde_json::json!({"factor": 1.0}), "load.factor"),
        (serde_json::json!({"floor": 0.5}), "load.floor"),
        (serde_json::json!({"cluster": ""}), "load.cluster"),
        (serde_json::json!({"bogus": 1}), "load.bogus"),
        (serde_json::json!([1]), "load"),
    ] {
        assert_eq!(load(v.clone()).unwrap_err().field, field, "{v}");
    }
}

#[test]
fn pd_config_refusals_name_the_field() {
    let ok =
        pd(serde_json::json!({"prefill_endpoints": [{"address": "10.0.1.1:8000", "dp_size": 2}]}))
            .unwrap();
    assert_eq!(ok.threshold_tokens, pd::DEFAULT_THRESHOLD_TOKENS);
    assert_eq!(ok.prefill[0].address, "10.0.1.1:8000");
    for (v, field) in [
        (serde_json::json!({}), "pd.prefill_endpoints"),
        (
            serde_json::json!({"prefill_endpoints": []}),
            "pd.prefill_endpoints",
        ),
        (
            serde_json::json!({"prefill_endpoints": [{"address": "nowhere"}]}),
            "pd.prefill_endpoints[0].address",
        ),
        (
            serde_json::json!({"prefill_endpoints": [{"address": "10.0.1.1:1", "dp_size": 1}]}),
            "pd.prefill_endpoints[0].dp_size",
        ),
        (
            serde_json::json!({"prefill_endpoints": [{"address": "10.0.1.1:1", "dp_size": 2}], "threshold_tokens": -1}),
            "pd.threshold_tokens",
        ),
        (
            serde_json::json!({"prefill_endpoints": [{"address": "10.0.1.1:1", "dp_size": 2}], "bytes_per_token": 0}),
            "pd.bytes_per_token",
        ),
        (serde_json::json!({"x": 1}), "pd.x"),
        (serde_json::json!(3), "pd"),
    ] {
        assert_eq!(pd(v.clone()).unwrap_err().field, field, "{v}");
    }
}

#[test]
fn endpoint_names_are_read_and_bad_ones_refused_by_name() {
    let c = Config::parse(
        br#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","name":"rank-a"},{"address":"10.0.0.2:8000"}]}"#,
    )
    .unwrap();
    assert_eq!(c.endpoints[0].name.as_deref(), Some("rank-a"));
    assert_eq!(c.endpoints[0].identity(), "rank-a");
    assert_eq!(c.endpoints[1].identity(), "10.0.0.2:8000");
    for (json, field) in [
        (
            r#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","name":""}]}"#,
            "endpoints[0].name",
        ),
        (
            r#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","name":"a b"}]}"#,
            "endpoints[0].name",
        ),
        (
            r#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","name":7}]}"#,
            "endpoints[0].name",
        ),
        (
            r#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:8000","name":"x"},{"address":"10.0.0.2:8000","name":"x"}]}"#,
            "endpoints[1].name",
        ),
    ] {
        assert_eq!(err(json).field, field, "{json}");
    }
}

#[test]
fn the_eject_config_is_checked_by_field() {
    let eject = |v: serde_json::Value| {
        let c = serde_json::json!({"mode": "pick", "endpoints": [{"address": "10.0.0.1:8000"}], "eject": v});
        Config::parse(c.to_string().as_bytes()).map(|c| c.eject)
    };
    let ok = eject(serde_json::json!({"failures": 2, "ms": 500})).unwrap();
    assert_eq!(
        ok,
        EjectConfig {
            failures: 2,
            ms: 500
        }
    );
    for (v, field) in [
        (serde_json::json!({"failures": 0}), "eject.failures"),
        (serde_json::json!({"failures": "3"}), "eject.failures"),
        (serde_json::json!({"ms": 5}), "eject.ms"),
        (serde_json::json!({"seconds": 5}), "eject.seconds"),
        (serde_json::json!(3), "eject"),
    ] {
        assert_eq!(eject(v.clone()).unwrap_err().field, field, "{v}");
    }
}

fn residency(v: serde_json::Value, load: bool) -> Result<Config, ConfigError> {
    let mut c = serde_json::json!({"mode": "pick", "residency": v,
        "endpoints": [{"address": "10.0.0.1:8000"}, {"address": "10.0.0.2:8000"}]});
    if load {
        c["load"] = serde_json::json!({});
    }
    Config::parse(c.to_string().as_bytes())
}

#[test]
fn residency_config_defaults_and_refusals_name_the_field() {
    let c = residency(serde_json::json!({}), true).unwrap();
    // The default d of 4, capped at the endpoints configured.
    let want = residency::ResidencyConfig {
        candidates: c.endpoints.len().min(4),
        ..residency::ResidencyConfig::default()
    };
    assert_eq!(c.residency, Some(want));
    // The default migration pulls: the new endpoint is told where from.
    assert_eq!(
        c.residency.as_ref().map(|r| r.migrate),
        Some(residency::Migrate::Pull)
    );
    assert!(
        c.outputs.has(Output::PullFrom) && !c.outputs.has(Output::Prefiller),
        "a pulled migration names the old home in x-tether-pull-from"
    );
    let leg = residency(serde_json::json!({"migrate": "leg"}), true).unwrap();
    assert_eq!(
        leg.residency.as_ref().map(|r| r.migrate),
        Some(residency::Migrate::Leg)
    );
    assert!(
        leg.outputs.has(Output::Prefiller) && !leg.outputs.has(Output::PullFrom),
        "a leg names the old home as the prefiller"
    );
    let c = residency(serde_json::json!({"link_gbps": 0, "candidates": 1}), true).unwrap();
    assert!(
        c.residency
            .unwrap()
            .rule()
            .cost
            .transfer_ms(1)
            .is_infinite()
    );
    for (v, field) in [
        (serde_json::json!({"candidates": 0}), "residency.candidates"),
        (serde_json::json!({"candidates": 3}), "residency.candidates"),
        (
            serde_json::json!({"busy_weight": 1.5}),
            "residency.busy_weight",
        ),
        (
            serde_json::json!({"busy_weight": -0.1}),
            "residency.busy_weight",
        ),
        (
            serde_json::json!({"kv_bytes_per_token": 0}),
            "residency.kv_bytes_per_token",
        ),
        (serde_json::json!({"link_gbps": -1}), "residency.link_gbps"),
        (
            serde_json::json!({"transfer_setup_ms": -0.5}),
            "residency.transfer_setup_ms",
        ),
        (
            serde_json::json!({"prefill_tokens_per_s": 0}),
            "residency.prefill_tokens_per_s",
        ),
        (
            serde_json::json!({"prefill_tokens_per_s": "fast"}),
            "residency.prefill_tokens_per_s",
        ),
        (serde_json::json!({"factor": 1}), "residency.factor"),
        (serde_json::json!({"floor": 0.5}), "residency.floor"),
        (serde_json::json!({"bogus": 1}), "residency.bogus"),
        (serde_json::json!({"unseen": "nearest"}), "residency.unseen"),
        (serde_json::json!({"unseen": 1}), "residency.unseen"),
        (serde_json::json!({"migrate": "push"}), "residency.migrate"),
        (serde_json::json!({"migrate": "Pull"}), "residency.migrate"),
        (serde_json::json!({"migrate": true}), "residency.migrate"),
        (
            serde_json::json!({"over_bound": "stay"}),
            "residency.over_bound",
        ),
        (serde_json::json!({"over_bound": 2}), "residency.over_bound"),
        (serde_json::json!([2]), "residency"),
    ] {
        assert_eq!(residency(v.clone(), true).unwrap_err().field, field, "{v}");
    }
    assert_eq!(
        residency(serde_json::json!({}), false).unwrap_err().field,
        "residency"
    );
    for (v, want) in [
        ("least-loaded", tether_placement::Unseen::LeastLoaded),
        ("rendezvous", tether_placement::Unseen::Rendezvous),
    ] {
        let c = residency(serde_json::json!({ "unseen": v }), true).unwrap();
        assert_eq!(c.residency.unwrap().rule().unseen, want, "{v}");
    }
    for (v, want) in [
        (None, tether_placement::OverBound::Move),
        (Some("move"), tether_placement::OverBound::Move),
        (Some("keep-up"), tether_placement::OverBound::KeepUp),
    ] {
        let j = v.map_or(
            serde_json::json!({}),
            |v| serde_json::json!({ "over_bound": v }),
        );
        let c = residency(j, true).unwrap();
        assert_eq!(c.residency.unwrap().rule().over_bound, want, "{v:?}");
    }
    let hash = Config::parse(br#"{"mode":"hash","residency":{},"load":{}}"#).unwrap_err();
    assert_eq!(hash.field, "residency");
    let e = residency(serde_json::json!({"migrate": "push"}), true).unwrap_err();
    assert!(e.why.contains("\"pull\" or \"leg\""), "{e}");
}

#[test]
fn the_pull_from_output_needs_residency() {
    let e = Config::parse(
        br#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:80"}],"outputs":["pick","pull_from"]}"#,
    )
    .unwrap_err();
    assert_eq!(e.field, "outputs");
    assert!(e.why.contains("pull_from"), "{e}");
    let e = Config::parse(br#"{"outputs":["pull_from"]}"#).unwrap_err();
    assert_eq!(e.field, "outputs[0]", "pick-only: {e}");
}

#[test]
fn chains_wrap_and_secret() {
    use crate::read::chain_id::mac_key;
    let d = Config::parse(b"{}").unwrap();
    assert!(d.chains.wrap);
    assert_eq!(d.chains.key, mac_key(None));
    let off = Config::parse(br#"{"chains": {"wrap": false}}"#).unwrap();
    assert!(!off.chains.wrap);
    let own = Config::parse(br#"{"chains": {"secret": "k"}}"#).unwrap();
    assert_eq!(own.chains.key, mac_key(Some(b"k")));
    // Without its own secret the chain ids use the cache_salt secret, with or without `chains`.
    for raw in [
        br#"{"cache_salt": {"secret": "salt"}}"#.as_slice(),
        br#"{"cache_salt": {"secret": "salt"}, "chains": {"ttl_s": 60}}"#,
    ] {
        assert_eq!(
            Config::parse(raw).unwrap().chains.key,
            mac_key(Some(b"salt"))
        );
    }
    let both = Config::parse(br#"{"cache_salt": {"secret": "salt"}, "chains": {"secret": "k"}}"#);
    assert_eq!(both.unwrap().chains.key, mac_key(Some(b"k")));
    assert_eq!(
        Config::parse(br#"{"chains": {"secret": ""}}"#)
            .unwrap_err()
            .field,
        "chains.secret"
    );
    assert_eq!(
        Config::parse(br#"{"chains": {"wrap": 1}}"#)
            .unwrap_err()
            .field,
        "chains.wrap"
    );
}
