//! `tether simulate` and `tether plan` as a user runs them: outputs written,
//! and bad input — an empty trace, a profile missing a curve, an objective no
//! fleet meets — answered clearly, never with a panic.

use super::{TempDir, tether, text};

fn example(p: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(p)
        .display()
        .to_string()
}

const TRACE: &str = "examples/traces/agent-tenants.jsonl";
const PROFILE: &str = "examples/profiles/llama-3.1-8b-fp8-h200-tp1.json";

#[test]
fn simulate_writes_its_table_json_and_chart() {
    let dir = TempDir::new("simulate");
    let o = tether(&[
        "simulate",
        &example(TRACE),
        "--profile",
        &example(PROFILE),
        "--ranks",
        "4",
        "--policy",
        "tether-bounded,client-hash,oracle",
        "--cache",
        "retention",
        "--quiet",
        "--json",
        &dir.path("s.json"),
        "--svg",
        &dir.path("s.svg"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("tether-bounded / retention") && out.contains("oracle / lru"),
        "{out}"
    );
    assert!(out.contains("peak memory"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("s.json")).unwrap()).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 3);
    assert!(
        std::fs::read_to_string(dir.path("s.svg"))
            .unwrap()
            .contains("<svg")
    );
    // The Dynamo example profile works wherever a profile does.
    let o = tether(&[
        "simulate",
        &example(TRACE),
        "--profile",
        &example("examples/profiles/dynamo/llama-3.1-8b-fp8-h200-tp1.dynamo.json"),
        "--ranks",
        "2",
        "--policy",
        "tether",
        "--cache",
        "lru",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn plan_writes_replicas_manifests_and_chart_and_gives_a_verdict() {
    let dir = TempDir::new("plan");
    let o = tether(&[
        "plan",
        &example(TRACE),
        "--profile",
        &example(PROFILE),
        "--ttft-p99-ms",
        "2000",
        "--min-interactivity",
        "40",
        "--target",
        "1,4",
        "--api-price",
        "3,0.3,3.75,15",
        "--spend-headroom",
        "interactivity",
        "--interval-s",
        "120",
        "--rounds",
        "3",
        "--replicas",
        &dir.path("r.json"),
        "--dynamo",
        &dir.path("dgd.yaml"),
        "--llm-d",
        &dir.path("lws.yaml"),
        "--image",
        "vllm/vllm-openai:v0.11.0",
        "--json",
        &dir.path("p.json"),
        "--svg",
        &dir.path("p.svg"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("verdict: target met"), "{out}");
    assert!(out.contains("an API would charge"), "{out}");
    assert!(
        out.contains("waterfall") && out.contains("search ("),
        "{out}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path("r.json")).unwrap()).unwrap();
    assert_eq!(r["variants"][0]["name"], "plan");
    assert!(
        r["variants"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["chosen"] == true)
    );
    assert!(
        std::fs::read_to_string(dir.path("p.svg"))
            .unwrap()
            .contains("<svg")
    );
    assert!(
        std::fs::read_to_string(dir.path("dgd.yaml"))
            .unwrap()
            .contains("kind: DynamoGraphDeployment")
    );
    assert!(
        std::fs::read_to_string(dir.path("lws.yaml"))
            .unwrap()
            .contains("kind: LeaderWorkerSet")
    );
}

#[test]
fn bad_input_gets_a_clear_answer() {
    let dir = TempDir::new("plan-bad");
    // A trace with no requests.
    let empty = dir.path("empty.jsonl");
    let profile = example(PROFILE);
    std::fs::write(
        &empty,
        "{\"type\":\"trace\",\"format\":\"tether-trace\",\"version\":1,\"block_size\":16}\n",
    )
    .unwrap();
    for args in [
        vec!["simulate", empty.as_str(), "--profile", profile.as_str()],
        vec![
            "plan",
            empty.as_str(),
            "--profile",
            profile.as_str(),
            "--ttft-p99-ms",
            "100",
        ],
    ] {
        let o = tether(&args);
        let out = text(&o);
        assert!(!o.status.success() && out.contains("no requests"), "{out}");
        assert!(!out.contains("panicked"), "{out}");
    }
    // A profile missing its decode curve.
    let prof: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(example(PROFILE)).unwrap()).unwrap();
    let mut no_decode = prof.clone();
    no_decode.as_object_mut().unwrap().remove("decode");
    let p = dir.path("p.json");
    std::fs::write(&p, no_decode.to_string()).unwrap();
    let o = tether(&[
        "plan",
        &example(TRACE),
        "--profile",
        &p,
        "--ttft-p99-ms",
        "100",
    ]);
    assert!(
        !o.status.success() && text(&o).contains("decode"),
        "{}",
        text(&o)
    );
    // An objective no configuration meets: an answer naming what binds, no
    // inf or NaN, and a failing exit status.
    let o = tether(&[
        "plan",
        &example(TRACE),
        "--profile",
        &example(PROFILE),
        "--itl-p99-ms",
        "0.5",
        "--rounds",
        "1",
        "--no-search",
    ]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("verdict: cannot meet the objectives"), "{out}");
    assert!(out.contains("ITL p99 <= 0.5 ms"), "{out}");
    let bad = out
        .split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .any(|w| ["nan", "inf", "-inf"].contains(&w.to_lowercase().as_str()));
    assert!(!bad, "{out}");
    // No objective at all, a bad target, a bare NPZ.
    let o = tether(&["plan", &example(TRACE), "--profile", &example(PROFILE)]);
    assert!(!o.status.success() && text(&o).contains("at least one objective"));
    let o = tether(&[
        "plan",
        &example(TRACE),
        "--profile",
        &example(PROFILE),
        "--ttft-p99-ms",
        "1",
        "--target",
        "a,b",
    ]);
    assert!(
        !o.status.success() && text(&o).contains("--target"),
        "{}",
        text(&o)
    );
    let o = tether(&[
        "simulate",
        &example(TRACE),
        "--profile",
        &example("examples/profiles/dynamo/decode.npz"),
    ]);
    assert!(
        !o.status.success() && text(&o).contains("dynamo"),
        "{}",
        text(&o)
    );
}
