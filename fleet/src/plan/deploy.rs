//! The chosen configuration as manifests an operator applies: a Dynamo
//! `DynamoGraphDeployment` (prefill and decode workers with replicas and
//! engine arguments) and llm-d-style `LeaderWorkerSet`s labelled
//! `llm-d.ai/role: prefill|decode` — both valid against the CRDs vendored in
//! `envoy/k8s-schema/` (`docs/planning.md`, "Deployable output").

use super::{PlanReport, Settings, Variant};
use crate::sim::CacheMode;
use serde_json::{Value, json};

/// What the manifests need beyond the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct DeployOptions {
    /// Object name prefix (a DNS label).
    pub name: String,
    /// The model served (`--model`).
    pub model: String,
    /// The engine image.
    pub image: String,
    /// GPUs per engine (`--tensor-parallel-size`, the GPU limit).
    pub gpus_per_engine: u32,
    /// The profile's context window (`--max-model-len`), if any.
    pub max_model_len: Option<u64>,
    /// Host-tier bytes per engine for the retention connector.
    pub host_bytes: u64,
}

/// One pool of the chosen configuration.
struct Pool {
    role: &'static str,
    replicas: usize,
    schedule: String,
    prefill_worker: bool,
}

fn pools(v: &Variant) -> Vec<Pool> {
    let schedule = |f: &dyn Fn(&crate::sim::Step) -> usize| {
        v.steps
            .iter()
            .map(|s| format!("{}s={}", (s.start_ms / 1000.0).round(), f(s)))
            .collect::<Vec<_>>()
            .join(",")
    };
    let peak = |f: &dyn Fn(&crate::sim::Step) -> usize| v.steps.iter().map(f).max().unwrap_or(0);
    let mut out = Vec::new();
    if v.disaggregated {
        out.push(Pool {
            role: "prefill",
            replicas: peak(&|s| s.prefill),
            schedule: schedule(&|s| s.prefill),
            prefill_worker: true,
        });
    }
    out.push(Pool {
        role: "decode",
        replicas: peak(&|s| s.decode),
        schedule: schedule(&|s| s.decode),
        prefill_worker: false,
    });
    out
}

/// vLLM's `--kv-transfer-config` for a pool: NIXL between P/D pools, tether's
/// retention connector where turns are retained (both through vLLM's
/// `MultiConnector` on a P/D decode pool).
fn kv_transfer(s: &Settings, pool: &Pool, host_bytes: u64) -> Option<String> {
    let nixl = json!({"kv_connector": "NixlConnector", "kv_role": "kv_both"});
    let mut tether = json!({
        "kv_connector": "TetherConnector",
        "kv_connector_module_path": "tether_vllm",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute"
    });
    if s.cache == CacheMode::RetentionHost {
        tether["kv_connector_extra_config"] = json!({ "host_bytes": host_bytes });
    }
    let retain = s.cache != CacheMode::Lru && !pool.prefill_worker;
    let c = match (s.disaggregated, retain) {
        (true, true) => json!({
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [nixl, tether]}
        }),
        (true, false) => nixl,
        (false, true) => tether,
        (false, false) => return None,
    };
    Some(c.to_string())
}

/// vLLM engine arguments of a pool.
fn engine_args(v: &Variant, pool: &Pool, o: &DeployOptions) -> Vec<String> {
    let s = &v.settings;
    let mut a = vec![
        "--model".to_owned(),
        o.model.clone(),
        "--tensor-parallel-size".into(),
        o.gpus_per_engine.to_string(),
        "--max-num-seqs".into(),
        s.max_num_seqs.to_string(),
        "--max-num-batched-tokens".into(),
        s.max_num_batched_tokens.to_string(),
        "--enable-prefix-caching".into(),
    ];
    if let Some(m) = o.max_model_len {
        a.extend(["--max-model-len".into(), m.to_string()]);
    }
    if let Some(kv) = kv_transfer(s, pool, o.host_bytes) {
        a.extend(["--kv-transfer-config".into(), kv]);
    }
    a
}

fn annotations(r: &PlanReport, v: &Variant, pool: &Pool) -> Value {
    json!({
        "tether.dev/replica-schedule": pool.schedule,
        "tether.dev/configuration": v.settings.describe(),
        "tether.dev/verdict": r.verdict,
    })
}

fn to_yaml(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| format!("---\n{}", serde_yaml_ng::to_string(d).unwrap_or_default()))
        .collect()
}

/// A `DynamoGraphDeployment` (nvidia.com/v1alpha1) of the chosen
/// configuration: a frontend, and a vLLM worker per pool (`subComponentType`
/// prefill/decode, `--is-prefill-worker` on the prefill pool) at its peak
/// replicas; `None` when nothing was chosen.
pub fn dynamo(r: &PlanReport, o: &DeployOptions) -> Option<String> {
    let v = r.chosen()?;
    let ns = o.name.clone();
    let mut services = serde_json::Map::new();
    services.insert(
        "Frontend".into(),
        json!({
            "dynamoNamespace": ns,
            "componentType": "frontend",
            "replicas": 1,
            "extraPodSpec": {"mainContainer": {"image": o.image}}
        }),
    );
    for pool in pools(v) {
        let mut args = engine_args(v, &pool, o);
        if pool.prefill_worker {
            args.push("--is-prefill-worker".into());
        }
        let name = if pool.prefill_worker {
            "VllmPrefillWorker"
        } else {
            "VllmDecodeWorker"
        };
        let mut svc = json!({
            "dynamoNamespace": ns,
            "componentType": "worker",
            "replicas": pool.replicas,
            "annotations": annotations(r, v, &pool),
            "resources": {"limits": {"gpu": o.gpus_per_engine.to_string()}},
            "extraPodSpec": {"mainContainer": {
                "image": o.image,
                "command": ["python3", "-m", "dynamo.vllm"],
                "args": args
            }}
        });
        if v.disaggregated {
            svc["subComponentType"] = json!(pool.role);
        }
        services.insert(name.into(), svc);
    }
    Some(to_yaml(&[json!({
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "DynamoGraphDeployment",
        "metadata": {"name": o.name},
        "spec": {"backendFramework": "vllm", "services": services}
    })]))
}

/// llm-d-style Kubernetes: one `LeaderWorkerSet` (leaderworkerset.x-k8s.io/v1)
/// per pool, each group one engine (`size: 1`), pods labelled
/// `llm-d.ai/role: prefill|decode` (a coupled engine is `decode`: it serves
/// whole requests), `llm-d.ai/inferenceServing: "true"` and the model, running
/// `vllm serve` with the chosen engine arguments; `None` when nothing was chosen.
pub fn llm_d(r: &PlanReport, o: &DeployOptions) -> Option<String> {
    let v = r.chosen()?;
    let docs: Vec<Value> = pools(v)
        .iter()
        .map(|pool| {
            let labels = json!({
                "llm-d.ai/inferenceServing": "true",
                "llm-d.ai/model": o.name,
                "llm-d.ai/role": pool.role,
            });
            let mut args = vec!["serve".to_owned()];
            args.extend(engine_args(v, pool, o).into_iter().skip(1));
            args.extend(["--port".into(), "8000".into()]);
            json!({
                "apiVersion": "leaderworkerset.x-k8s.io/v1",
                "kind": "LeaderWorkerSet",
                "metadata": {
                    "name": format!("{}-{}", o.name, pool.role),
                    "labels": labels,
                    "annotations": annotations(r, v, pool),
                },
                "spec": {
                    "replicas": pool.replicas,
                    "leaderWorkerTemplate": {
                        "size": 1,
                        "workerTemplate": {
                            "metadata": {"labels": labels},
                            "spec": {"containers": [{
                                "name": "vllm",
                                "image": o.image,
                                "command": ["vllm"],
                                "args": args,
                                "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                                "resources": {
                                    "limits": {"nvidia.com/gpu": o.gpus_per_engine.to_string()},
                                    "requests": {"nvidia.com/gpu": o.gpus_per_engine.to_string()}
                                }
                            }]}
                        }
                    }
                }
            })
        })
        .collect();
    Some(to_yaml(&docs))
}
