//! The manifests a user applies beyond `envoy/istio/`: the Kustomize overlays
//! (`envoy/kustomize/`, rendered by `kubectl kustomize`), Envoy Gateway
//! (`envoy/envoy-gateway/`) and llm-d (`envoy/llm-d/`). Each object is valid
//! for the API server against the CRD schema vendored in `envoy/k8s-schema/`
//! (or Istio's, `envoy/istio/schema/`), unknown fields rejected; each filter
//! configuration passes the filter's own parser; and what the filter's outputs
//! set is what the objects around it read.

#[path = "k8s_manifests/envoy_gateway.rs"]
mod envoy_gateway;
#[path = "istio_manifests/header_mutation.rs"]
mod header_mutation;
#[path = "istio_manifests/objects.rs"]
mod objects;
#[path = "istio_manifests/structural.rs"]
mod structural;

use anyhow::{Context, Result, anyhow, bail, ensure};
use objects::{parse_yaml, render, violation};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use structural::Violation;
use tether_envoy::outputs::Expect;

fn envoy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../envoy")
}

/// Body schemas by `(group, version, kind)`: the vendored CRDs (every served
/// version) and Istio's schemas.
struct Schemas(BTreeMap<(String, String, String), Value>);

impl Schemas {
    fn load() -> Result<Schemas> {
        let mut map = BTreeMap::new();
        let dir = envoy_dir().join("k8s-schema");
        let mut crds: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        crds.sort();
        ensure!(!crds.is_empty(), "no CRDs in {}", dir.display());
        for path in crds {
            let text = std::fs::read_to_string(&path)?;
            for crd in parse_yaml(&text).with_context(|| format!("parsing {}", path.display()))? {
                let group = crd["spec"]["group"].as_str().context("spec.group")?;
                let kind = crd["spec"]["names"]["kind"]
                    .as_str()
                    .context("spec.names.kind")?;
                let versions = crd["spec"]["versions"].as_array().context("versions")?;
                for v in versions.iter().filter(|v| v["served"] == true) {
                    let name = v["name"].as_str().context("version name")?;
                    let mut schema = v["schema"]["openAPIV3Schema"].clone();
                    let props = schema
                        .get_mut("properties")
                        .and_then(Value::as_object_mut)
                        .with_context(|| format!("{kind} {name}: no properties"))?;
                    // The envelope is checked by objects::validate_object.
                    for envelope in ["apiVersion", "kind", "metadata"] {
                        props.remove(envelope);
                    }
                    map.insert((group.into(), name.into(), kind.into()), schema);
                }
            }
        }
        let istio = envoy_dir().join("istio/schema/istio-crd-openapi.json");
        let istio: Value = serde_json::from_str(&std::fs::read_to_string(&istio)?)?;
        for (kind, group) in [
            ("WasmPlugin", "extensions.istio.io"),
            ("DestinationRule", "networking.istio.io"),
            ("EnvoyFilter", "networking.istio.io"),
        ] {
            for (version, schema) in istio[kind].as_object().context("istio kind")? {
                map.insert((group.into(), version.clone(), kind.into()), schema.clone());
            }
        }
        Ok(Schemas(map))
    }

    fn validate(&self, doc: &Value) -> Vec<Violation> {
        let api_version = doc["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let kind = doc["kind"].as_str().unwrap_or_default();
        match self.0.get(&(group.into(), version.into(), kind.into())) {
            Some(schema) => objects::validate_object(doc, schema),
            None => violation(
                ".apiVersion",
                format!("no schema for {kind} in {api_version:?}"),
            ),
        }
    }
}

fn assert_valid(schemas: &Schemas, doc: &Value) -> Result<()> {
    let violations = schemas.validate(doc);
    ensure!(violations.is_empty(), "violations: {}", render(&violations));
    Ok(())
}

fn assert_rejected(schemas: &Schemas, doc: &Value, path: &str, needle: &str) -> Result<()> {
    objects::expect_violation(&schemas.validate(doc), path, needle)
}

/// The objects of every `*.yaml` in `envoy/<folder>`.
fn folder(name: &str) -> Result<Vec<Value>> {
    let dir = envoy_dir().join(name);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        // A Kustomize base's own file is not a Kubernetes object.
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)?;
        out.extend(parse_yaml(&text).with_context(|| format!("parsing {}", path.display()))?);
    }
    Ok(out)
}

/// The kubectl that renders the overlays (`TETHER_KUBECTL`, else `kubectl` on
/// the PATH; its built-in Kustomize, v5 here). Missing, the test fails: the
/// overlays are what users apply.
fn kubectl() -> String {
    std::env::var("TETHER_KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

/// What `kubectl kustomize DIR` renders.
fn kustomize(dir: &Path) -> Result<Vec<Value>> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| {
            format!(
                "running {} kustomize (set TETHER_KUBECTL to a kubectl with Kustomize)",
                kubectl()
            )
        })?;
    ensure!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_yaml(&String::from_utf8(out.stdout)?)
}

fn overlay(name: &str) -> Result<Vec<Value>> {
    kustomize(&envoy_dir().join("kustomize").join(name))
}

fn find<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .ok_or_else(|| anyhow!("no {kind}"))
}

/// The filter's configuration inside a `WasmPlugin` or an `EnvoyExtensionPolicy`.
fn plugin_config(doc: &Value) -> Result<&Value> {
    match doc["kind"].as_str() {
        Some("WasmPlugin") => Ok(&doc["spec"]["pluginConfig"]),
        Some("EnvoyExtensionPolicy") => Ok(&doc["spec"]["wasm"][0]["config"]),
        other => bail!("{other:?} carries no filter configuration"),
    }
}

/// Parses a filter configuration with the filter's own parser (what
/// `on_configure` does in the gateway, after the rollout) and returns what its
/// outputs set.
fn accepted(config: &Value) -> Result<Expect> {
    ensure!(config.is_object(), "no filter configuration");
    tether_filter::config::Config::parse(&serde_json::to_vec(config)?)
        .map_err(|e| anyhow!("the filter rejects its configuration: {e}"))?;
    Expect::from_plugin_config(&config.to_string()).map_err(|e| anyhow!("{e}"))
}

/// The headers an EnvoyFilter's `header_mutation` patch copies from filter state.
fn copied_headers(envoy_filter: &Value) -> Result<Vec<String>> {
    let patch = envoy_filter["spec"]["configPatches"]
        .as_array()
        .context("configPatches")?
        .iter()
        .find(|p| {
            p.pointer("/patch/value/name") == Some(&json!("envoy.filters.http.header_mutation"))
        })
        .context("no header_mutation patch")?;
    header_mutation::copied(patch)
}

/// The body-path chain matches the outputs: header_mutation copies exactly the
/// headers the filter hands over, and the buffer follows the wasm filter
/// Istio names `<namespace>.<name>`.
fn body_path_agrees(wasm_plugin: &Value, envoy_filter: &Value) -> Result<()> {
    let want = accepted(plugin_config(wasm_plugin)?)?;
    let mut copied = copied_headers(envoy_filter)?;
    copied.sort();
    let mut expected: Vec<String> = want.copied.iter().map(|h| h.to_string()).collect();
    expected.sort();
    ensure!(
        copied == expected,
        "header_mutation copies {copied:?}, the outputs hand over {expected:?}"
    );
    let wasm_name = format!(
        "{}.{}",
        wasm_plugin["metadata"]["namespace"]
            .as_str()
            .context("namespace")?,
        wasm_plugin["metadata"]["name"].as_str().context("name")?
    );
    let buffer = envoy_filter["spec"]["configPatches"]
        .as_array()
        .context("configPatches")?
        .iter()
        .find(|p| p.pointer("/patch/value/name") == Some(&json!("envoy.filters.http.buffer")))
        .context("no buffer patch")?;
    ensure!(
        buffer.pointer("/match/listener/filterChain/filter/subFilter/name")
            == Some(&json!(wasm_name)),
        "the buffer must follow the wasm filter {wasm_name}"
    );
    ensure!(
        buffer.pointer("/patch/value/typed_config/max_request_bytes")
            == plugin_config(wasm_plugin)?.get("max_body_bytes"),
        "buffer max_request_bytes must equal the filter's max_body_bytes"
    );
    ensure!(
        wasm_plugin["spec"]
            .get("selector")
            .map(|s| &s["matchLabels"])
            == envoy_filter["spec"]
                .get("workloadSelector")
                .map(|s| &s["labels"]),
        "WasmPlugin and EnvoyFilter must select the same workloads"
    );
    Ok(())
}

#[test]
fn every_manifest_is_valid_against_its_crd_schema() -> Result<()> {
    let schemas = Schemas::load()?;
    let mut kinds = Vec::new();
    let sets = [
        ("kustomize/istio-hash", overlay("istio-hash")?),
        ("kustomize/istio-vllm", overlay("istio-vllm")?),
        ("kustomize/istio-pick", overlay("istio-pick")?),
        ("envoy-gateway", folder("envoy-gateway")?),
        ("llm-d", folder("llm-d")?),
    ];
    for (set, docs) in &sets {
        for doc in docs {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let name = doc["metadata"]["name"].as_str().unwrap_or_default();
            // A core ConfigMap (the EPP's configuration) has no CRD to check against.
            if kind == "ConfigMap" && doc["apiVersion"] == "v1" {
                continue;
            }
            assert_valid(&schemas, doc).with_context(|| format!("{set}: {kind} {name}"))?;
            kinds.push(format!("{set}/{kind}"));
        }
    }
    for want in [
        "kustomize/istio-hash/WasmPlugin",
        "kustomize/istio-hash/DestinationRule",
        "kustomize/istio-hash/EnvoyFilter",
        "kustomize/istio-vllm/WasmPlugin",
        "kustomize/istio-pick/WasmPlugin",
        "kustomize/istio-pick/EnvoyFilter",
        "envoy-gateway/EnvoyExtensionPolicy",
        "envoy-gateway/HTTPRoute",
        "envoy-gateway/BackendTrafficPolicy",
        "envoy-gateway/EnvoyProxy",
        "envoy-gateway/Gateway",
        "llm-d/InferencePool",
        "llm-d/HTTPRoute",
        "llm-d/WasmPlugin",
        "llm-d/EnvoyFilter",
    ] {
        ensure!(kinds.iter().any(|k| k == want), "no {want}");
    }
    Ok(())
}

/// Each vendored schema rejects what the API server rejects: a misspelt field
/// where it is, a wrong type, a value outside an enum or a bound.
#[test]
fn the_vendored_schemas_reject_what_the_api_server_rejects() -> Result<()> {
    let schemas = Schemas::load()?;
    let eg = folder("envoy-gateway")?;
    let llm_d = folder("llm-d")?;

    let mut route = find(&eg, "HTTPRoute")?.clone();
    route["spec"]["rules"][0]["timeouts"]["requst"] = json!("600s");
    assert_rejected(
        &schemas,
        &route,
        ".spec.rules[0].timeouts.requst",
        "unknown field",
    )?;

    let mut eep = find(&eg, "EnvoyExtensionPolicy")?.clone();
    eep["spec"]["wasm"][0]["code"]["imag"] = json!({"url": "x"});
    assert_rejected(&schemas, &eep, ".spec.wasm[0].code.imag", "unknown field")?;
    let mut eep = find(&eg, "EnvoyExtensionPolicy")?.clone();
    eep["spec"]["wasm"][0]["code"]["type"] = json!("OCI");
    assert_rejected(&schemas, &eep, ".spec.wasm[0].code.type", "is not one of")?;

    let mut btp = find(&eg, "BackendTrafficPolicy")?.clone();
    btp["spec"]["loadBalancer"]["type"] = json!("Maglev");
    assert_rejected(&schemas, &btp, ".spec.loadBalancer.type", "is not one of")?;
    let mut btp = find(&eg, "BackendTrafficPolicy")?.clone();
    btp["spec"]["loadBalancer"]["consistentHash"]["tableSize"] = json!(6_000_000);
    assert_rejected(
        &schemas,
        &btp,
        ".spec.loadBalancer.consistentHash.tableSize",
        "above the maximum",
    )?;

    let mut proxy = find(&eg, "EnvoyProxy")?.clone();
    proxy["spec"]["filterOrder"][0]["name"] = json!("envoy.filters.http.bufer");
    assert_rejected(
        &schemas,
        &proxy,
        ".spec.filterOrder[0].name",
        "is not one of",
    )?;
    let mut gateway = find(&eg, "Gateway")?.clone();
    gateway["spec"]["infrastructure"]["parametersRef"]["nme"] = json!("tether");
    assert_rejected(
        &schemas,
        &gateway,
        ".spec.infrastructure.parametersRef.nme",
        "unknown field",
    )?;
    let mut btp = find(&eg, "BackendTrafficPolicy")?.clone();
    btp["spec"]["requestBuffer"]["limit"] = json!("16 MiB");
    assert_rejected(
        &schemas,
        &btp,
        ".spec.requestBuffer.limit",
        "does not match the pattern",
    )?;

    let mut pool = find(&llm_d, "InferencePool")?.clone();
    pool["spec"]["targetPorts"][0]["number"] = json!(70000);
    assert_rejected(
        &schemas,
        &pool,
        ".spec.targetPorts[0].number",
        "above the maximum",
    )?;
    let mut pool = find(&llm_d, "InferencePool")?.clone();
    pool["spec"]["endpointPickerRef"]
        .as_object_mut()
        .context("endpointPickerRef")?
        .remove("name");
    assert_rejected(
        &schemas,
        &pool,
        ".spec.endpointPickerRef",
        "required field \"name\"",
    )?;

    let mut route = find(&llm_d, "HTTPRoute")?.clone();
    route["apiVersion"] = json!("gateway.networking.k8s.io/v2");
    assert_rejected(&schemas, &route, ".apiVersion", "no schema")?;
    let mut route = find(&llm_d, "HTTPRoute")?.clone();
    route["metadata"]["nmespace"] = json!("llm-d");
    assert_rejected(&schemas, &route, ".metadata.nmespace", "unknown field")
}

/// Every filter configuration passes the filter's parser, and the objects
/// around the filter read what its outputs set.
#[test]
fn the_filter_accepts_each_configuration_and_its_outputs_are_read() -> Result<()> {
    // Istio hash overlays: DestinationRule hashes x-tether-key, header_mutation
    // copies exactly the body-path headers.
    for name in ["istio-hash", "istio-vllm"] {
        let docs = overlay(name)?;
        let wp = find(&docs, "WasmPlugin")?;
        let want = accepted(plugin_config(wp)?).context(name)?;
        ensure!(
            want.headers.contains(&"x-tether-key"),
            "{name}: no x-tether-key"
        );
        ensure!(
            find(&docs, "DestinationRule")?
                .pointer("/spec/trafficPolicy/loadBalancer/consistentHash/httpHeaderName")
                == Some(&json!("x-tether-key"))
        );
        body_path_agrees(wp, find(&docs, "EnvoyFilter")?).context(name)?;
    }
    // Pick mode: the filter's ranks come from the parameters, the ranks'
    // cluster follows the header the filter sets, nothing hashes.
    let pick = overlay("istio-pick")?;
    let wp = find(&pick, "WasmPlugin")?;
    let want = accepted(plugin_config(wp)?)?;
    body_path_agrees(wp, find(&pick, "EnvoyFilter")?)?;
    ensure!(plugin_config(wp)?["endpoints"][1]["name"] == "rank-1");
    let cluster = find(&pick, "EnvoyFilter")?["spec"]["configPatches"]
        .as_array()
        .context("configPatches")?
        .iter()
        .find(|p| p["applyTo"] == "CLUSTER")
        .context("no cluster patch")?;
    let source = cluster
        .pointer("/patch/value/load_balancing_policy/policies/0/typed_extension_config/typed_config/override_host_sources/0/header")
        .and_then(Value::as_str)
        .context("override_host source")?;
    ensure!(
        want.headers.contains(&source),
        "override_host reads {source}, which the outputs do not set"
    );
    ensure!(
        find(&pick, "DestinationRule")?
            .pointer("/spec/trafficPolicy/loadBalancer")
            .is_none(),
        "pick mode: no consistent hash in the DestinationRule"
    );

    // In front of vLLM: x-session-id and the kv_transfer_params rewrite.
    let vllm = overlay("istio-vllm")?;
    let config = tether_filter::config::Config::parse(&serde_json::to_vec(plugin_config(find(
        &vllm,
        "WasmPlugin",
    )?)?)?)
    .map_err(|e| anyhow!("{e}"))?;
    ensure!(
        config.rewrites_body(),
        "the vllm overlay must rewrite kv_transfer_params"
    );
    ensure!(
        accepted(plugin_config(find(&vllm, "WasmPlugin")?)?)?
            .headers
            .contains(&"x-session-id")
    );

    // Envoy Gateway: both paths. The route's header modifier copies exactly
    // the headers the body path hands over, the hash reads one the filter
    // sets on both paths, the buffer is as large as the largest body the
    // filter reads and runs after it, and the Gateway carries that order.
    let eg = folder("envoy-gateway")?;
    let eep = find(&eg, "EnvoyExtensionPolicy")?;
    let want = accepted(plugin_config(eep)?)?;
    let hashed = find(&eg, "BackendTrafficPolicy")?
        .pointer("/spec/loadBalancer/consistentHash/headers/0/name")
        .and_then(Value::as_str)
        .context("hashed header")?;
    ensure!(
        want.headers.contains(&hashed),
        "Envoy Gateway hashes {hashed}, which the filter does not set ({:?})",
        want.headers
    );
    let route = find(&eg, "HTTPRoute")?;
    let mut set = envoy_gateway::header_sets(&route["spec"]["rules"][0]);
    set.sort();
    let mut expected: Vec<(String, String)> = want
        .copied
        .iter()
        .map(|h| {
            (
                h.to_string(),
                format!("%FILTER_STATE(wasm.tether.{h}:PLAIN)%"),
            )
        })
        .collect();
    expected.sort();
    ensure!(
        set == expected,
        "the HTTPRoute sets {set:?}, the outputs hand over {expected:?}"
    );
    ensure!(
        envoy_gateway::quantity_bytes(
            &find(&eg, "BackendTrafficPolicy")?["spec"]["requestBuffer"]["limit"]
        )? == plugin_config(eep)?["max_body_bytes"]
            .as_u64()
            .context("max_body_bytes")?,
        "requestBuffer.limit must equal the filter's max_body_bytes"
    );
    let proxy = find(&eg, "EnvoyProxy")?;
    ensure!(
        proxy["spec"]["filterOrder"]
            == json!([{"name": "envoy.filters.http.buffer", "after": "envoy.filters.http.wasm"}]),
        "the EnvoyProxy must move the buffer after the wasm filter"
    );
    let gateway = find(&eg, "Gateway")?;
    ensure!(
        gateway.pointer("/spec/infrastructure/parametersRef")
            == Some(
                &json!({"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": proxy["metadata"]["name"]})
            ),
        "the Gateway must carry the EnvoyProxy"
    );
    ensure!(
        route.pointer("/spec/parentRefs/0/name") == Some(&gateway["metadata"]["name"]),
        "the HTTPRoute must attach to the Gateway"
    );
    let route_name = &route["metadata"]["name"];
    for kind in ["EnvoyExtensionPolicy", "BackendTrafficPolicy"] {
        ensure!(
            find(&eg, kind)?.pointer("/spec/targetRefs/0/name") == Some(route_name),
            "{kind} must target the HTTPRoute"
        );
    }

    // llm-d: the EPP's plugins read headers the filter hands over.
    let llm_d = folder("llm-d")?;
    let wp = find(&llm_d, "WasmPlugin")?;
    let want = accepted(plugin_config(wp)?)?;
    body_path_agrees(wp, find(&llm_d, "EnvoyFilter")?)?;
    let epp_text = find(&llm_d, "ConfigMap")?["data"]["config.yaml"]
        .as_str()
        .context("data.config.yaml")?;
    let epp = parse_yaml(epp_text)?
        .into_iter()
        .next()
        .context("EPP config")?;
    ensure!(epp["kind"] == "EndpointPickerConfig");
    let plugin = |ty: &str| {
        epp["plugins"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["type"] == ty))
            .with_context(|| format!("no {ty} plugin"))
    };
    let affinity = plugin("session-affinity-scorer")?;
    ensure!(affinity["parameters"]["strategy"] == "session_id");
    let mut read = vec![
        affinity
            .pointer("/parameters/sessionIdConfig/sources/0/header")
            .and_then(Value::as_str)
            .context("session source header")?,
    ];
    read.extend(
        plugin("agent-identity")?
            .pointer("/parameters/additionalSessionHeaders")
            .and_then(Value::as_array)
            .context("additionalSessionHeaders")?
            .iter()
            .filter_map(Value::as_str),
    );
    for header in read {
        ensure!(
            want.copied.contains(&header),
            "the EPP reads {header}, which the filter does not hand over ({:?})",
            want.copied
        );
    }
    ensure!(
        find(&llm_d, "HTTPRoute")?.pointer("/spec/rules/0/backendRefs/0/name")
            == Some(&find(&llm_d, "InferencePool")?["metadata"]["name"]),
        "the route must send to the InferencePool"
    );
    Ok(())
}

/// The overlays' parameters reach every place they name, and nothing else
/// changes: with the shipped parameters the hash overlay is the base.
#[test]
fn the_overlay_parameters_reach_every_place() -> Result<()> {
    let base = folder("istio")?;
    let hash = overlay("istio-hash")?;
    ensure!(
        base.len() == hash.len() && base.iter().all(|b| hash.contains(b)),
        "with its shipped parameters the hash overlay must render the base unchanged: {}",
        base.iter()
            .filter(|b| !hash.contains(b))
            .map(|b| b["kind"].to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let tmp = tempfile::tempdir()?;
    for sub in ["istio", "kustomize"] {
        copy_dir(&envoy_dir().join(sub), &tmp.path().join(sub))?;
    }
    for name in ["istio-hash", "istio-vllm", "istio-pick"] {
        let params = tmp.path().join("kustomize").join(name).join("params.yaml");
        let text = std::fs::read_to_string(&params)?;
        let edited = text
            .replace("namespace: istio-system", "namespace: edge")
            .replace("istio: ingressgateway", "app: llm-edge")
            .replace("port: 8080", "port: 9443")
            .replace(
                "host: ranks.llm.svc.cluster.local",
                "host: vllm.serving.svc.cluster.local",
            )
            .replace("namespace: llm\n", "namespace: serving\n");
        ensure!(edited.matches("edge").count() == 2 && edited.contains("9443"));
        std::fs::write(&params, edited)?;
        let docs = kustomize(&tmp.path().join("kustomize").join(name))?;
        let text = serde_json::to_string(&docs)?;
        for old in [
            "istio-system",
            "ingressgateway",
            "8080",
            "ranks.llm",
            "\"llm\"",
        ] {
            ensure!(
                !text.contains(old),
                "{name}: {old} left after the parameters changed"
            );
        }
        let schemas = Schemas::load()?;
        for doc in &docs {
            assert_valid(&schemas, doc)?;
        }
        let wp = find(&docs, "WasmPlugin")?;
        let ef = find(&docs, "EnvoyFilter")?;
        ensure!(wp["metadata"]["namespace"] == "edge" && ef["metadata"]["namespace"] == "edge");
        ensure!(wp.pointer("/spec/match/0/ports/0/number") == Some(&json!(9443)));
        ensure!(wp.pointer("/spec/selector/matchLabels") == Some(&json!({"app": "llm-edge"})));
        let dr = find(&docs, "DestinationRule")?;
        ensure!(dr["metadata"]["namespace"] == "serving");
        ensure!(dr["spec"]["host"] == "vllm.serving.svc.cluster.local");
        let ports = text.matches("9443").count();
        ensure!(ports == 5, "{name}: the port is in 5 places, found {ports}");
        // The buffer follows the filter under its new name `edge.tether`.
        body_path_agrees(wp, ef).context(name)?;
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The Envoy configuration inside each `EnvoyFilter` (filters, cluster,
/// listener and route values) is valid for Envoy itself: schema validation
/// sees only `patch.value` as open, so the patches are put into a bootstrap
/// (filters in order before the router, cluster and listener values merged
/// into a static cluster and listener) that `envoy --mode validate` must pass;
/// a misspelt field in a patch must fail it.
#[test]
fn the_envoy_filter_patches_are_valid_envoy_configuration() -> Result<()> {
    let mut filters = Vec::new();
    for docs in [
        overlay("istio-hash")?,
        overlay("istio-pick")?,
        overlay("istio-vllm")?,
        folder("llm-d")?,
    ] {
        filters.push(find(&docs, "EnvoyFilter")?.clone());
    }
    for ef in &filters {
        let name = ef["metadata"]["name"].as_str().unwrap_or_default();
        tether_e2e::envoy::Envoy::validate(&patched_bootstrap(ef)?.to_string())
            .map_err(|e| anyhow!("{name}: {e}"))?;
    }
    let mut bad = filters[1].clone();
    let lb = bad
        .pointer_mut("/spec/configPatches/3/patch/value/load_balancing_policy/policies/0/typed_extension_config/typed_config")
        .and_then(Value::as_object_mut)
        .context("override_host typed_config")?;
    let sources = lb.remove("override_host_sources").context("sources")?;
    lb.insert("override_host_source".into(), sources);
    ensure!(
        tether_e2e::envoy::Envoy::validate(&patched_bootstrap(&bad)?.to_string()).is_err(),
        "a misspelt field in a cluster patch must fail Envoy's validation"
    );
    Ok(())
}

/// A bootstrap holding every patch value of `envoy_filter`.
fn patched_bootstrap(envoy_filter: &Value) -> Result<Value> {
    let mut http_filters = Vec::new();
    let mut cluster = json!({
        "name": "ranks", "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "ranks", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8000}}}}
        ]}]}
    });
    let mut listener = json!({"name": "gateway"});
    let mut route = json!({"match": {"prefix": "/"}, "route": {"cluster": "ranks"}});
    for patch in envoy_filter["spec"]["configPatches"]
        .as_array()
        .context("configPatches")?
    {
        let value = &patch["patch"]["value"];
        let merge = |into: &mut Value| -> Result<()> {
            let into = into.as_object_mut().context("object")?;
            for (k, v) in value.as_object().context("patch value")? {
                into.insert(k.clone(), v.clone());
            }
            Ok(())
        };
        match patch["applyTo"].as_str() {
            Some("HTTP_FILTER") => http_filters.push(value.clone()),
            Some("CLUSTER") => merge(&mut cluster)?,
            Some("LISTENER") => merge(&mut listener)?,
            Some("HTTP_ROUTE") => merge(&mut route)?,
            other => bail!("no bootstrap place for applyTo {other:?}"),
        }
    }
    http_filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));
    listener["address"] = json!({"socket_address": {"address": "127.0.0.1", "port_value": 0}});
    listener["filter_chains"] = json!([{"filters": [{
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "gateway",
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
            "http_filters": http_filters
        }
    }]}]);
    Ok(json!({"static_resources": {"listeners": [listener], "clusters": [cluster]}}))
}

/// What `tether plan --dynamo` / `--llm-d` write for a P/D plan and a coupled
/// one: valid against the vendored DynamoGraphDeployment and LeaderWorkerSet
/// CRDs, each pool with its replicas, role and engine arguments — and a
/// malformed object is rejected, so the check can fail.
#[test]
fn the_planners_manifests_are_valid_dynamo_and_leaderworkerset_objects() -> Result<()> {
    use tether_fleet::plan::{PlanConfig, deploy, plan, size::Slo};
    use tether_fleet::sim::{CacheMode, Policy, SimConfig};
    let schemas = Schemas::load()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let trace = tether_fleet::trace::read_trace(&root.join("examples/traces/agent-demo.jsonl"))?;
    let profile =
        tether_fleet::profile::load(&root.join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"))
            .map_err(|e| anyhow!("{e}"))?;
    for disaggregated in [true, false] {
        let mut sim = SimConfig {
            policy: Policy::TetherBounded,
            cache: CacheMode::RetentionHost,
            host_bytes: 1 << 34,
            ..SimConfig::default()
        };
        // Every prefill remote (P/D), or none (coupled).
        sim.pd.threshold_tokens = if disaggregated { 0 } else { 1 << 30 };
        let cfg = PlanConfig {
            sim,
            slo: Slo {
                ttft_p99_ms: Some(5000.0),
                itl_p99_ms: Some(40.0),
                ..Slo::default()
            },
            target: None,
            api_price: None,
            interval_ms: 60_000.0,
            rounds: 2,
            observed_hits: None,
            per_interval: false,
            cap_context: false,
            spend: None,
            search: false,
        };
        let mut report = plan(&trace, &profile, &cfg)?;
        // Deploy the starting configuration (P/D or coupled by the threshold).
        report.chosen = report.variants.iter().position(|v| v.name == "plan");
        let chosen = report.chosen().context("plan variant")?.clone();
        ensure!(chosen.meets(), "{}", report.verdict);
        ensure!(chosen.disaggregated == disaggregated, "{:?}", chosen.steps);
        let o = deploy::DeployOptions {
            name: "agents".into(),
            model: profile.model.clone(),
            image: "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.1".into(),
            gpus_per_engine: 1,
            max_model_len: profile.max_model_len,
            host_bytes: 1 << 34,
        };
        let dgd = parse_yaml(&deploy::dynamo(&report, &o).context("dynamo")?)?;
        let lws = parse_yaml(&deploy::llm_d(&report, &o).context("llm-d")?)?;
        for doc in dgd.iter().chain(&lws) {
            assert_valid(&schemas, doc).with_context(|| format!("{doc}"))?;
        }
        let services = dgd[0]["spec"]["services"].as_object().context("services")?;
        let decode = &services["VllmDecodeWorker"];
        let peak_decode = chosen.steps.iter().map(|s| s.decode).max().unwrap_or(0);
        ensure!(decode["replicas"] == json!(peak_decode));
        ensure!(lws.len() == if disaggregated { 2 } else { 1 });
        let roles: Vec<&str> = lws
            .iter()
            .filter_map(|d| d["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]["llm-d.ai/role"].as_str())
            .collect();
        if disaggregated {
            let prefill = &services["VllmPrefillWorker"];
            ensure!(
                prefill["subComponentType"] == "prefill" && decode["subComponentType"] == "decode"
            );
            let args = prefill["extraPodSpec"]["mainContainer"]["args"].to_string();
            ensure!(
                args.contains("--is-prefill-worker") && args.contains("NixlConnector"),
                "{args}"
            );
            ensure!(roles == ["prefill", "decode"], "{roles:?}");
        } else {
            ensure!(!services.contains_key("VllmPrefillWorker"));
            ensure!(roles == ["decode"], "{roles:?}");
            let args = lws[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"].to_string();
            ensure!(
                args.contains("TetherConnector") && args.contains("--max-num-seqs"),
                "{args}"
            );
        }
        // A misspelt field and a wrong type are rejected.
        let mut bad = dgd[0].clone();
        bad["spec"]["services"]["VllmDecodeWorker"]["replicas"] = json!("three");
        assert_rejected(
            &schemas,
            &bad,
            ".spec.services.VllmDecodeWorker.replicas",
            "",
        )?;
        let mut bad = lws[0].clone();
        bad["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["imagee"] =
            json!("x");
        assert_rejected(
            &schemas,
            &bad,
            ".spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].imagee",
            "unknown field",
        )?;
    }
    Ok(())
}
