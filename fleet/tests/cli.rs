//! The `tether` binary as a user runs it: import, stats, synth, generate,
//! replay and compare, and how it refuses bad input.

#[path = "cli/plan.rs"]
mod plan;
#[path = "cli/replay.rs"]
mod replay;

use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tether(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .output()
        .expect("run tether")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("tether-cli-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&p).expect("temp dir");
        Self(p)
    }
    fn path(&self, f: &str) -> String {
        self.0.join(f).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn data(f: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(f)
        .display()
        .to_string()
}

#[test]
fn import_then_stats_then_synth() -> Result<()> {
    let dir = TempDir::new("import");
    let out = dir.path("t.jsonl");
    let o = tether(&[
        "trace",
        "import",
        "--format",
        "mooncake",
        "--input",
        &data("mooncake_head400.jsonl"),
        "--output",
        &out,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("400 requests") && t.contains("derived") && t.contains("content hash xxh3-128:"),
        "{t}"
    );
    let o = tether(&["trace", "stats", &out]);
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("requests     400") && t.contains("ideal hit"),
        "{t}"
    );
    let o = tether(&["trace", "stats", &out, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["requests"], 400);
    assert!(
        v["source"]["derivation"]["conversations"]
            .as_u64()
            .unwrap_or(0)
            > 1
    );
    let o = tether(&[
        "trace",
        "synth",
        &out,
        "--limit",
        "3",
        "--identity",
        "dynamo",
        "--api",
        "messages",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["path"], "/v1/messages");
    assert!(lines[0]["headers"]["x-dynamo-session-id"].is_string());
    assert!(lines[0]["body"]["messages"].is_array());
    Ok(())
}

#[test]
fn generate_is_reproducible() {
    let dir = TempDir::new("gen");
    let (a, b) = (dir.path("a.jsonl"), dir.path("b.jsonl"));
    for out in [&a, &b] {
        let o = tether(&[
            "trace",
            "generate",
            "--seed",
            "9",
            "--sessions",
            "3",
            "--output",
            out,
        ]);
        assert!(o.status.success(), "{}", text(&o));
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}

/// The coding-agent corpus as the benchmarks make it: generated at a chosen
/// size and span, then served by `tether simulate` on a model whose window
/// holds its prompts (up to 190 K tokens), nothing refused.
#[test]
fn a_coding_agent_corpus_generates_and_simulates() {
    let dir = TempDir::new("corpus");
    let trace = dir.path("c.jsonl");
    let o = tether(&[
        "trace",
        "generate",
        "--preset",
        "coding-agent",
        "--sessions",
        "4",
        "--span-s",
        "60",
        "--output",
        &trace,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let profile = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/profiles/qwen3-coder-next-fp8-h200-tp1.json")
        .display()
        .to_string();
    let o = tether(&[
        "simulate",
        &trace,
        "--profile",
        &profile,
        "--ranks",
        "2",
        "--policy",
        "tether",
        "--cache",
        "retention",
        "--quiet",
        "--threads",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let row = out
        .lines()
        .find(|l| l.starts_with("tether / retention"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.ends_with(" 0"), "refused requests: {row}");
    let refused = |flags: &[&str], says: &str| {
        let args = [&["trace", "generate", "--output", trace.as_str()], flags].concat();
        let o = tether(&args);
        assert!(
            !o.status.success() && text(&o).contains(says),
            "{}",
            text(&o)
        );
    };
    // Turns and subagent calls follow from the session's size in this preset.
    refused(
        &["--preset", "coding-agent", "--user-turns", "3"],
        "--user-turns does not apply",
    );
    refused(
        &["--subagent-share", "2"],
        "--subagent-share must be a share",
    );
}

/// `tether simulate --prefetch` turns prefetch on in every rank's engine: the
/// report counts prefetches (and none without the flag).
#[test]
fn simulate_prefetch_reaches_the_engines() {
    let dir = TempDir::new("prefetch");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let at = |p: &str| root.join(p).display().to_string();
    let (trace, profile) = (
        at("examples/traces/agent-demo.jsonl"),
        at("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"),
    );
    let prefetched = |extra: &[&str]| {
        let json = dir.path("sim.json");
        let args = [
            &[
                "simulate",
                &trace,
                "--profile",
                &profile,
                "--kv-tokens",
                "49152",
                "--policy",
                "tether",
                "--cache",
                "retention-host",
                "--quiet",
                "--threads",
                "1",
                "--json",
                &json,
            ][..],
            extra,
        ]
        .concat();
        let o = tether(&args);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
        v["runs"][0]["retention"]["prefetched"]
            .as_u64()
            .expect("counted")
    };
    assert_eq!(prefetched(&[]), 0);
    assert!(prefetched(&["--prefetch"]) > 0);
}

#[test]
fn bad_input_is_refused_by_name() {
    let dir = TempDir::new("bad");
    let o = tether(&[
        "trace", "import", "--format", "sharegpt", "--input", "x", "--output", "y",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "unknown trace format `sharegpt` (known: tether, mooncake, bailian, agentx, tracelab)"
        ),
        "{}",
        text(&o)
    );
    // A Mooncake file read as a tether trace: pointed to the importer.
    let o = tether(&["trace", "stats", &data("mooncake_head400.jsonl")]);
    assert!(!o.status.success());
    assert!(text(&o).contains("--format mooncake"), "{}", text(&o));
    // A malformed line names file and line.
    let bad = dir.path("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\":0,\"input_length\":5,\"output_length\":1,\"hash_ids\":[1]}\n{\"timestamp\":1,\n").unwrap();
    let o = tether(&["trace", "stats", "--format", "mooncake", &bad]);
    assert!(!o.status.success());
    assert!(text(&o).contains(&format!("{bad}:2: ")), "{}", text(&o));
    let o = tether(&[
        "trace",
        "synth",
        &data("mooncake_head400.jsonl"),
        "--format",
        "mooncake",
        "--identity",
        "cookie",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("unknown identity `cookie`"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_directory_and_a_byte_order_mark_are_named_not_line_one() {
    let dir = TempDir::new("bom");
    let bom = dir.path("bom.jsonl");
    std::fs::write(
        &bom,
        b"\xEF\xBB\xBF{\"timestamp\":0,\"input_length\":10,\"output_length\":2,\"hash_ids\":[1]}\n",
    )
    .unwrap();
    for format in ["tether", "mooncake", "bailian", "agentx"] {
        let o = tether(&["trace", "stats", "--format", format, &bom]);
        assert!(!o.status.success(), "{format}");
        assert!(
            text(&o).contains(&format!("{bom}:1: starts with a UTF-8 byte-order mark")),
            "{format}: {}",
            text(&o)
        );
    }
    let d = dir.0.display().to_string();
    for format in ["tether", "mooncake", "bailian"] {
        let o = tether(&["trace", "stats", "--format", format, &d]);
        assert!(!o.status.success(), "{format}");
        let t = text(&o);
        assert!(t.contains(&format!("{d}: is a directory")), "{format}: {t}");
        assert_eq!(t.lines().count(), 1, "one line, no backtrace: {t}");
    }
}
