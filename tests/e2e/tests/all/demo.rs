//! The demo binary runs its scripted agent run to the end and reports every
//! agent on one rank (what `make demo` shows).

use crate::support::*;
use std::process::Command;

#[test]
fn demo_runs_and_every_agent_stays_on_one_rank() {
    need_envoy_and_filter();
    let out = Command::new(env!("CARGO_BIN_EXE_tether-demo"))
        .env("TETHER_ECHO_RANK", echo_bin())
        .output()
        .expect("tether-demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let turns = stdout
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count();
    assert!(
        turns >= 20,
        "at least 20 turns printed, got {turns}:\n{stdout}"
    );
    for agent in ["planner", "tool-caller", "verifier"] {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(agent) && l.contains("stayed on one rank"))
            .unwrap_or_else(|| panic!("no summary for {agent}:\n{stdout}"));
        assert!(line.ends_with("yes"), "{line}");
    }
    for source in ["header:x-claude-code-session-id", "body:prompt_cache_key"] {
        assert!(stdout.contains(source), "demo shows key source {source}");
    }
    assert!(stdout.contains("127.0.0.2"), "demo changes the client IP");
}
