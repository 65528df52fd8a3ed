//! The Istio manifests in `envoy/istio/` are valid for the Kubernetes API server
//! (Istio's CRD openAPIV3 schemas, unknown fields rejected) and agree with each
//! other and with the filter contract in `docs/gateway.md`.

#[path = "istio_manifests/header_mutation.rs"]
mod header_mutation;
#[path = "istio_manifests/objects.rs"]
mod objects;
#[path = "istio_manifests/structural.rs"]
mod structural;

use anyhow::{Context, Result, anyhow, bail, ensure};
use objects::{parse_yaml, render};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use structural::Violation;

fn istio_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../envoy/istio")
}

fn schemas() -> Result<Value> {
    let path = istio_dir().join("schema/istio-crd-openapi.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Every manifest shipped in `envoy/istio/*.yaml`, with its file name.
fn shipped() -> Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(istio_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        // The Kustomize base of envoy/kustomize/, not a Kubernetes object.
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for doc in parse_yaml(&text).with_context(|| format!("parsing {name}"))? {
            out.push((name.clone(), doc));
        }
    }
    Ok(out)
}

/// The API group each kind lives in.
fn group_of(kind: &str) -> Option<&'static str> {
    match kind {
        "WasmPlugin" => Some("extensions.istio.io"),
        "DestinationRule" | "EnvoyFilter" => Some("networking.istio.io"),
        _ => None,
    }
}

/// Validates one Kubernetes object: envelope (`apiVersion`, `kind`, `metadata`)
/// and the rest against the CRD schema of its kind and version.
fn validate_manifest(doc: &Value, schemas: &Value) -> Vec<Violation> {
    let bad = objects::violation;
    let Some(obj) = doc.as_object() else {
        return bad("<root>", "a manifest must be an object".into());
    };
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let Some(group) = group_of(kind) else {
        return bad(".kind", format!("unknown kind {kind:?}"));
    };
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(version) = api_version
        .strip_prefix(group)
        .and_then(|v| v.strip_prefix('/'))
    else {
        return bad(
            ".apiVersion",
            format!("{api_version:?} is not in group {group}"),
        );
    };
    let Some(schema) = schemas.get(kind).and_then(|k| k.get(version)) else {
        return bad(".apiVersion", format!("{kind} has no version {version:?}"));
    };
    objects::validate_object(doc, schema)
}

fn assert_valid(doc: &Value, schemas: &Value) -> Result<()> {
    let violations = validate_manifest(doc, schemas);
    ensure!(violations.is_empty(), "violations: {}", render(&violations));
    Ok(())
}

/// Asserts that `doc` is rejected with a violation at `path` whose message contains `needle`.
fn assert_rejected(doc: &Value, schemas: &Value, path: &str, needle: &str) -> Result<()> {
    objects::expect_violation(&validate_manifest(doc, schemas), path, needle)
}

fn manifest(kind: &str) -> Result<Value> {
    shipped()?
        .into_iter()
        .map(|(_, doc)| doc)
        .find(|d| d["kind"] == kind)
        .ok_or_else(|| anyhow!("no {kind} manifest in envoy/istio"))
}

/// Sets `value` at a `/`-separated pointer, creating nothing: the parent must exist.
fn set(doc: &mut Value, pointer: &str, value: Value) -> Result<()> {
    let (parent, key) = pointer.rsplit_once('/').context("pointer without /")?;
    let target = doc
        .pointer_mut(parent)
        .with_context(|| format!("no {parent}"))?;
    match target {
        Value::Object(map) => {
            map.insert(key.to_owned(), value);
        }
        Value::Array(items) => {
            let i: usize = key.parse()?;
            *items.get_mut(i).context("index out of range")? = value;
        }
        _ => bail!("{parent} is not a container"),
    }
    Ok(())
}

#[test]
fn every_shipped_manifest_is_valid_and_all_three_kinds_are_there() -> Result<()> {
    let schemas = schemas()?;
    let docs = shipped()?;
    for (file, doc) in &docs {
        assert_valid(doc, &schemas).with_context(|| file.to_string())?;
    }
    for kind in ["WasmPlugin", "DestinationRule", "EnvoyFilter"] {
        ensure!(
            docs.iter().any(|(_, d)| d["kind"] == kind),
            "no {kind} in envoy/istio"
        );
    }
    Ok(())
}

#[test]
fn a_misspelt_field_is_rejected_where_it_is() -> Result<()> {
    let schemas = schemas()?;
    let mut dr = manifest("DestinationRule")?;
    let hash = dr
        .pointer_mut("/spec/trafficPolicy/loadBalancer/consistentHash")
        .and_then(Value::as_object_mut)
        .context("consistentHash")?;
    let header = hash.remove("httpHeaderName").context("httpHeaderName")?;
    hash.insert("httpHeadrName".into(), header);
    assert_rejected(
        &dr,
        &schemas,
        ".spec.trafficPolicy.loadBalancer.consistentHash.httpHeadrName",
        "unknown field",
    )?;

    let mut wp = manifest("WasmPlugin")?;
    set(&mut wp, "/spec/pluginConfg", json!({"mode": "hash"}))?;
    assert_rejected(&wp, &schemas, ".spec.pluginConfg", "unknown field")?;

    let mut ef = manifest("EnvoyFilter")?;
    set(
        &mut ef,
        "/spec/configPatches/0/match/listener/filterChain/filter/subFiltr",
        json!({"name": "x"}),
    )?;
    assert_rejected(
        &ef,
        &schemas,
        ".spec.configPatches[0].match.listener.filterChain.filter.subFiltr",
        "unknown field",
    )
}

#[test]
fn a_wrong_type_or_value_is_rejected() -> Result<()> {
    let schemas = schemas()?;
    let mut wp = manifest("WasmPlugin")?;
    set(&mut wp, "/spec/priority", json!("high"))?;
    assert_rejected(
        &wp,
        &schemas,
        ".spec.priority",
        "expected integer, found string",
    )?;

    let mut wp = manifest("WasmPlugin")?;
    set(&mut wp, "/spec/phase", json!("BEFORE_ROUTER"))?;
    assert_rejected(&wp, &schemas, ".spec.phase", "is not one of")?;

    let mut wp = manifest("WasmPlugin")?;
    set(&mut wp, "/spec/match/0/ports/0/number", json!(70000))?;
    assert_rejected(
        &wp,
        &schemas,
        ".spec.match[0].ports[0].number",
        "above the maximum",
    )?;

    let mut dr = manifest("DestinationRule")?;
    set(
        &mut dr,
        "/spec/trafficPolicy/loadBalancer/consistentHash/maglev",
        json!({"tableSize": "big"}),
    )?;
    assert_rejected(
        &dr,
        &schemas,
        ".spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize",
        "expected integer",
    )?;

    let mut ef = manifest("EnvoyFilter")?;
    set(
        &mut ef,
        "/spec/configPatches/0/patch/operation",
        json!("INSERT_SOMEWHERE"),
    )?;
    assert_rejected(
        &ef,
        &schemas,
        ".spec.configPatches[0].patch.operation",
        "is not one of",
    )
}

#[test]
fn mutually_exclusive_and_required_fields_are_enforced() -> Result<()> {
    let schemas = schemas()?;
    let mut dr = manifest("DestinationRule")?;
    set(
        &mut dr,
        "/spec/trafficPolicy/loadBalancer/consistentHash/ringHash",
        json!({"minimumRingSize": 1024}),
    )?;
    assert_rejected(
        &dr,
        &schemas,
        ".spec.trafficPolicy.loadBalancer.consistentHash",
        "exactly one oneOf",
    )?;

    let mut dr = manifest("DestinationRule")?;
    set(
        &mut dr,
        "/spec/trafficPolicy/loadBalancer/simple",
        json!("ROUND_ROBIN"),
    )?;
    assert_rejected(
        &dr,
        &schemas,
        ".spec.trafficPolicy.loadBalancer",
        "exactly one oneOf",
    )?;

    let mut wp = manifest("WasmPlugin")?;
    wp["spec"].as_object_mut().context("spec")?.remove("url");
    assert_rejected(&wp, &schemas, ".spec", "required field \"url\"")?;

    let mut wp = manifest("WasmPlugin")?;
    let port = wp
        .pointer("/spec/match/0/ports/0")
        .cloned()
        .context("a port")?;
    wp.pointer_mut("/spec/match/0/ports")
        .and_then(Value::as_array_mut)
        .context("ports")?
        .push(port);
    assert_rejected(
        &wp,
        &schemas,
        ".spec.match[0].ports[1]",
        "duplicate list entry",
    )
}

#[test]
fn the_envelope_is_checked_too() -> Result<()> {
    let schemas = schemas()?;
    let mut wp = manifest("WasmPlugin")?;
    set(&mut wp, "/spce", json!({}))?;
    assert_rejected(&wp, &schemas, ".spce", "unknown field")?;

    let mut wp = manifest("WasmPlugin")?;
    set(&mut wp, "/metadata/lables", json!({"a": "b"}))?;
    assert_rejected(&wp, &schemas, ".metadata.lables", "unknown field")?;

    let mut wp = manifest("WasmPlugin")?;
    set(
        &mut wp,
        "/apiVersion",
        json!("networking.istio.io/v1alpha3"),
    )?;
    assert_rejected(
        &wp,
        &schemas,
        ".apiVersion",
        "not in group extensions.istio.io",
    )?;

    let mut dr = manifest("DestinationRule")?;
    set(&mut dr, "/apiVersion", json!("networking.istio.io/v2"))?;
    assert_rejected(&dr, &schemas, ".apiVersion", "no version")
}

#[test]
fn open_fields_stay_open() -> Result<()> {
    // pluginConfig and patch.value are x-kubernetes-preserve-unknown-fields: the API
    // server keeps whatever is there, so the validator must not reject new keys.
    let schemas = schemas()?;
    let mut wp = manifest("WasmPlugin")?;
    set(
        &mut wp,
        "/spec/pluginConfig/some_future_field",
        json!({"nested": [1, "two"]}),
    )?;
    assert_valid(&wp, &schemas)?;
    let mut ef = manifest("EnvoyFilter")?;
    set(
        &mut ef,
        "/spec/configPatches/0/patch/value/anything",
        json!(true),
    )?;
    assert_valid(&ef, &schemas)
}

/// The three manifests name the same filter, headers, limits and workloads.
#[test]
fn the_manifests_agree_with_each_other_and_the_filter_contract() -> Result<()> {
    let wp = manifest("WasmPlugin")?;
    let dr = manifest("DestinationRule")?;
    let ef = manifest("EnvoyFilter")?;

    let config = &wp["spec"]["pluginConfig"];
    ensure!(
        config["mode"] == "hash",
        "the Istio setup is hash mode (DestinationRule consistentHash)"
    );
    ensure!(
        dr.pointer("/spec/trafficPolicy/loadBalancer/consistentHash/httpHeaderName")
            == Some(&json!("x-tether-key")),
        "DestinationRule must hash on x-tether-key"
    );
    let selector = wp
        .pointer("/spec/selector/matchLabels")
        .context("WasmPlugin selector")?;
    ensure!(
        ef.pointer("/spec/workloadSelector/labels") == Some(selector),
        "EnvoyFilter and WasmPlugin must select the same workloads"
    );
    ensure!(
        wp.pointer("/spec/match/0/mode") == Some(&json!("CLIENT")),
        "gateway listeners are CLIENT traffic in Istio"
    );

    let patches = ef["spec"]["configPatches"]
        .as_array()
        .context("configPatches")?;
    let filter_patch = |name: &str| {
        patches
            .iter()
            .find(|p| p.pointer("/patch/value/name") == Some(&json!(name)))
    };
    // buffer right after the wasm filter Istio names `<namespace>.<name>`.
    let wasm_name = format!(
        "{}.{}",
        wp["metadata"]["namespace"].as_str().context("namespace")?,
        wp["metadata"]["name"].as_str().context("name")?
    );
    let buffer = filter_patch("envoy.filters.http.buffer").context("no buffer filter patch")?;
    ensure!(buffer["patch"]["operation"] == "INSERT_AFTER");
    ensure!(
        buffer.pointer("/match/listener/filterChain/filter/subFilter/name")
            == Some(&json!(wasm_name)),
        "the buffer filter must follow the wasm filter {wasm_name}"
    );
    let max_body = config["max_body_bytes"]
        .as_u64()
        .context("pluginConfig.max_body_bytes")?;
    ensure!(
        buffer.pointer("/patch/value/typed_config/max_request_bytes") == Some(&json!(max_body)),
        "buffer max_request_bytes must equal the filter's max_body_bytes"
    );
    let listener = patches
        .iter()
        .find(|p| p["applyTo"] == "LISTENER")
        .context("no listener buffer-limit patch")?;
    ensure!(
        listener.pointer("/patch/value/per_connection_buffer_limit_bytes")
            == Some(&json!(max_body)),
        "the per-connection buffer limit must admit max_body_bytes"
    );

    // header_mutation right after buffer, copying wasm.tether.<h> into <h>.
    let mutation =
        filter_patch("envoy.filters.http.header_mutation").context("no header_mutation patch")?;
    ensure!(
        mutation.pointer("/match/listener/filterChain/filter/subFilter/name")
            == Some(&json!("envoy.filters.http.buffer"))
            && mutation["patch"]["operation"] == "INSERT_AFTER",
        "header_mutation must follow the buffer filter"
    );
    let copied = header_mutation::copied(mutation)?;
    // Exactly what the plugin configuration's outputs set on the body path:
    // an entry for a header never set, or a set header nobody copies, is an error.
    let want = tether_envoy::outputs::Expect::from_plugin_config(&config.to_string())
        .map_err(|e| anyhow!("{e}"))?;
    for h in &copied {
        ensure!(
            want.copied.contains(&h.as_str()),
            "header_mutation copies {h}, which the filter's outputs never set"
        );
    }
    for h in &want.copied {
        ensure!(
            copied.iter().any(|c| c == h),
            "the filter sets {h} on the body path but no header_mutation entry copies it"
        );
    }
    // What the DestinationRule hashes is set on both paths, and the
    // header-path route (README: VirtualService route `tether-header-path`
    // matching x-tether-key) matches a header the header path sets.
    ensure!(
        want.headers.contains(&"x-tether-key"),
        "the outputs must set x-tether-key"
    );
    ensure!(
        want.header_path.contains(&"x-tether-key"),
        "the header path must set x-tether-key"
    );

    // The header path disables the buffer per route.
    let route = patches
        .iter()
        .find(|p| p["applyTo"] == "HTTP_ROUTE")
        .context("no per-route buffer patch")?;
    ensure!(
        route.pointer("/patch/value/typed_per_filter_config/envoy.filters.http.buffer/disabled")
            == Some(&json!(true)),
        "the header-path route must disable the buffer"
    );
    Ok(())
}

/// `pluginConfig` is opaque to Kubernetes (preserve-unknown-fields), so the
/// filter's own parser is what rejects a bad one: at `on_configure`, in the
/// gateway, after the rollout. Check it here instead.
#[test]
fn the_plugin_config_is_accepted_by_the_filter_itself() -> Result<()> {
    use tether_filter::config::{Config, Mode};
    let wp = manifest("WasmPlugin")?;
    let raw = serde_json::to_vec(&wp["spec"]["pluginConfig"])?;
    let config =
        Config::parse(&raw).map_err(|e| anyhow!("the filter rejects pluginConfig: {e}"))?;
    ensure!(
        config.mode == Mode::Hash,
        "hash mode expected, got {:?}",
        config.mode
    );
    ensure!(config.tenant_header.as_deref() == Some("x-auth-tenant"));
    ensure!(
        config.max_body_bytes as u64
            == wp["spec"]["pluginConfig"]["max_body_bytes"]
                .as_u64()
                .unwrap_or(0)
    );

    let mut bad = wp["spec"]["pluginConfig"].clone();
    set(&mut bad, "/max_body_byte", json!(1024))?;
    ensure!(
        Config::parse(&serde_json::to_vec(&bad)?).is_err(),
        "a misspelt pluginConfig field must be rejected by the filter"
    );
    Ok(())
}
