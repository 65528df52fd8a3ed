use super::*;
use crate::bootstraps::{ALL, PLUGIN_CONFIGS};
use crate::template;
use std::collections::BTreeMap;

/// A shipped bootstrap rendered with its own plugin configuration.
fn shipped(name: &str) -> Value {
    let text = ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .unwrap();
    with_config(
        text,
        PLUGIN_CONFIGS.iter().find(|(n, _)| *n == name).unwrap().1,
    )
}

fn with_config(text: &str, config: &str) -> Value {
    let mut vars = BTreeMap::new();
    vars.insert("FILTER_WASM".to_owned(), "/x.wasm".to_owned());
    vars.insert("PLUGIN_CONFIG".to_owned(), template::yaml_string(config));
    for i in 0..4 {
        vars.insert(format!("RANK_{i}_PORT"), (8000 + i).to_string());
    }
    serde_yaml_ng::from_str(&template::render(text, &vars).unwrap()).unwrap()
}

#[test]
fn every_shipped_bootstrap_matches_its_plugin_configuration() {
    assert_eq!(ALL.len(), PLUGIN_CONFIGS.len());
    for (name, _) in ALL {
        let problems = check(&shipped(name));
        assert!(problems.is_empty(), "{name}: {problems:#?}");
    }
}

#[test]
fn an_entry_for_an_output_never_set_and_an_output_nobody_copies_are_errors() {
    let hash = ALL.iter().find(|(n, _)| *n == "hash.yaml").unwrap().1;
    // The key plus one more header: nobody copies x-tether-session.
    let doc = with_config(hash, r#"{"outputs":["key","session"]}"#);
    let p = check(&doc);
    assert!(
        p.iter()
            .any(|p| p.contains("x-tether-session") && p.contains("no header_mutation entry")),
        "{p:#?}"
    );
    // The demo's pick outputs in front of the hash chain: the key is read but never set.
    let doc = with_config(
        hash,
        r#"{"mode":"pick","endpoints":[{"address":"127.0.0.1:1"}]}"#,
    );
    let p = check(&doc);
    assert!(
        p.iter()
            .any(|p| p.contains("copies x-tether-key, which the filter never sets")),
        "{p:#?}"
    );
    assert!(
        p.iter()
            .any(|p| p.contains("hash_policy reads x-tether-key")),
        "{p:#?}"
    );
    assert!(p.iter().any(|p| p.contains("disables buffering")), "{p:#?}");
    // A filter-state output nothing reads.
    let doc = with_config(hash, r#"{"outputs":["hash","hashable_string"]}"#);
    let p = check(&doc);
    assert!(
        p.iter()
            .any(|p| p.contains("envoy.hashable_string") && p.contains("nothing reads it")),
        "{p:#?}"
    );
}

#[test]
fn align_makes_any_configuration_consistent() {
    for (name, text) in ALL {
        for extra in [
            r#""outputs":"all""#,
            r#""outputs":["key","retain","turn"]"#,
            r#""outputs":["vllm","key"]"#,
            r#""header_fast_path":false,"outputs":["all"]"#,
        ] {
            let config = match name {
                "hash.yaml" => format!("{{{extra}}}"),
                "original-dst.yaml" => format!(
                    r#"{{"mode":"pick","fallbacks":0,"endpoints":[{{"address":"127.0.0.1:1"}}],{extra}}}"#
                ),
                _ => format!(
                    r#"{{"mode":"pick","endpoints":[{{"address":"127.0.0.1:1"}}],{extra}}}"#
                ),
            };
            let config = if name == "hash.yaml" || extra.contains("all") {
                config
            } else {
                // Pick chains read the destination: it must be set.
                config.replace("\"outputs\":[", "\"outputs\":[\"destination\",")
            };
            let mut doc = with_config(text, &config);
            align(&mut doc);
            let problems: Vec<String> = check(&doc)
                .into_iter()
                .filter(|p| !p.contains("nothing reads it"))
                .collect();
            assert!(problems.is_empty(), "{name} with {config}: {problems:#?}");
        }
    }
}

#[test]
fn every_polled_endpoint_must_be_in_the_polled_cluster() {
    let demo = ALL.iter().find(|(n, _)| *n == "demo.yaml").unwrap().1;
    let cfg = |load: &str, prefill: &str| {
        format!(
            r#"{{"mode":"pick","endpoints":[{{"address":"127.0.0.1:8000"}},{{"address":"127.0.0.1:8001"}}],
               "header_fast_path":false,"load":{load},
               "pd":{{"prefill_endpoints":[{{"address":"{prefill}"}}]}}}}"#
        )
    };
    // The demo cluster `ranks` holds 127.0.0.1:8000-8003.
    let mut doc = with_config(demo, &cfg("{}", "127.0.0.1:8003"));
    align(&mut doc);
    assert_eq!(check(&doc), Vec::<String>::new());
    let mut doc = with_config(demo, &cfg("{}", "127.0.0.1:9999"));
    align(&mut doc);
    let p = check(&doc);
    assert!(
        p.len() == 1 && p[0].contains("127.0.0.1:9999") && p[0].contains("another rank"),
        "{p:#?}"
    );
    let mut doc = with_config(demo, &cfg(r#"{"cluster":"nope"}"#, "127.0.0.1:8003"));
    align(&mut doc);
    let p = check(&doc);
    assert!(p.len() == 1 && p[0].contains("\"nope\""), "{p:#?}");
}
