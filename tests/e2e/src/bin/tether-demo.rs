//! `tether-demo`: a scripted multi-turn agent run through real Envoy and the
//! tether filter, printed turn by turn. Run with `make demo`.
//!
//! Four echo ranks (one a data-parallel server with two DP ranks) sit behind
//! Envoy in pick mode (`envoy/demo.yaml`). A planner (Anthropic Messages,
//! Claude Code headers), a tool caller (OpenAI Chat Completions with tool
//! calls, its own agent id) and a verifier (OpenAI Responses, identity only in
//! the body: `prompt_cache_key`) work on one task: tool calls, subagent
//! handoffs, a retried request and a client IP change half way. Every agent
//! must stay on one rank; the exit status says whether it did.

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::IpAddr;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::{EchoRank, Envoy, HttpClient, Request, bootstrap, paths};

#[derive(Parser)]
#[command(about = "Play a scripted planner / tool caller / verifier run through Envoy + tether")]
struct Args {
    /// Also print Envoy's log tail at the end.
    #[arg(long)]
    envoy_log: bool,
}

/// The three agents of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Agent {
    Planner,
    ToolCaller,
    Verifier,
}

impl Agent {
    fn label(self) -> &'static str {
        match self {
            Agent::Planner => "planner",
            Agent::ToolCaller => "tool-caller",
            Agent::Verifier => "verifier",
        }
    }
}

const SESSION: &str = "7f3a9c2e-5b1d-4e8f-a0c4-demo-session";
const TOOL_CALLER_ID: &str = "agent-tool-caller-01";

/// One routed request as the rank saw it.
struct Row {
    agent: Agent,
    api: Api,
    client: IpAddr,
    source: String,
    key: String,
    rank: String,
    /// `x-tether-prompt-end` (the header path sends it without a kind).
    end: String,
    kind: String,
    turn: String,
    note: &'static str,
}

struct Run {
    envoy: Envoy,
    ip: IpAddr,
    rows: Vec<Row>,
    last: Option<(Agent, Request)>,
    planner: Conversation,
    tool_caller: Conversation,
    verifier: Conversation,
}

impl Run {
    fn conv(&mut self, a: Agent) -> &mut Conversation {
        match a {
            Agent::Planner => &mut self.planner,
            Agent::ToolCaller => &mut self.tool_caller,
            Agent::Verifier => &mut self.verifier,
        }
    }

    /// The request the agent harness sends for the conversation as it is now.
    fn request(&self, a: Agent) -> Request {
        match a {
            Agent::Planner => {
                let user_id = format!("user_8d1e_account__session_{SESSION}");
                let body = self
                    .planner
                    .body(&[("metadata", json!({"user_id": user_id}))]);
                Request::post_bytes(Api::Messages.path(), "application/json", body)
                    .header("x-claude-code-session-id", SESSION)
                    .header("anthropic-version", "2023-06-01")
            }
            Agent::ToolCaller => Request::post_bytes(
                Api::Chat.path(),
                "application/json",
                self.tool_caller.body(&[]),
            )
            .header("x-claude-code-session-id", SESSION)
            .header("x-claude-code-agent-id", TOOL_CALLER_ID)
            .header("x-claude-code-parent-agent-id", "main"),
            Agent::Verifier => {
                let body = self.verifier.body(&[
                    ("prompt_cache_key", json!(SESSION)),
                    ("store", json!(false)),
                ]);
                Request::post_bytes(Api::Responses.path(), "application/json", body)
            }
        }
    }

    async fn send(&mut self, a: Agent, note: &'static str) -> Result<()> {
        let req = self.request(a);
        self.last = Some((a, req.clone()));
        self.exchange(a, req, note).await
    }

    async fn retry(&mut self) -> Result<()> {
        let (a, req) = self.last.clone().context("nothing to retry")?;
        self.exchange(a, req, "retry (same request)").await
    }

    async fn exchange(&mut self, a: Agent, req: Request, note: &'static str) -> Result<()> {
        let api = self.conv(a).api();
        let resp = HttpClient::new()
            .bind(self.ip)
            .send(self.envoy.listen_addr(), req)
            .await?;
        if resp.status != 200 {
            bail!(
                "{} turn answered {}: {}",
                a.label(),
                resp.status,
                String::from_utf8_lossy(&resp.body)
            );
        }
        let echo = resp.echo()?;
        let h = |n: &str| echo.header(n).unwrap_or("-").to_owned();
        let rank = match echo.header("x-data-parallel-rank") {
            Some(dp) => format!("{}/dp{dp}", echo.rank),
            None => echo.rank.clone(),
        };
        let key = h("x-tether-key");
        self.rows.push(Row {
            agent: a,
            api,
            client: self.ip,
            source: h("x-tether-key-source"),
            key: key.chars().take(8).collect(),
            rank,
            end: h("x-tether-prompt-end"),
            kind: h("x-tether-turn-kind"),
            turn: h("x-tether-turn"),
            note,
        });
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    paths::require_envoy()?;
    paths::require_filter_wasm()?;
    let ranks = ["rank-a", "rank-b", "rank-c", "rank-d"]
        .iter()
        .map(|n| EchoRank::start(n))
        .collect::<Result<Vec<_>, _>>()
        .context("starting the echo ranks")?;
    // rank-d stands for one vLLM server with --data-parallel-size 2.
    let endpoints: Vec<Value> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"address": r.addr().to_string(), "weight": 1, "dp_size": if i == 3 { 2 } else { 1 }}))
        .collect();
    let config = json!({"mode": "pick", "endpoints": endpoints, "fallbacks": 2});
    let envoy = bootstrap::rank_vars(&ranks)
        .into_iter()
        .fold(Envoy::builder(), |b, (k, v)| b.var(k, v))
        .plugin_config(&config)
        .start(bootstrap::DEMO)
        .context("starting Envoy with envoy/demo.yaml")?;
    println!(
        "tether demo: Envoy {} (pick mode) in front of",
        envoy.listen_addr()
    );
    for (r, e) in ranks.iter().zip(&endpoints) {
        println!("  {} at {} (dp_size {})", r.name(), r.addr(), e["dp_size"]);
    }
    println!();

    let planner = Conversation::new(
        Api::Messages,
        "You are the planner. Break the task down and delegate with the Task tool.",
        &["Read", "Grep", "Task"],
        "The payments test suite is flaky on CI. Find out why and fix it.",
    );
    let tool_caller = Conversation::new(
        Api::Chat,
        "You are a tool caller. Run commands and edit files as asked.",
        &["bash", "edit_file"],
        "Reproduce the flaky test test_refund_race and patch it.",
    );
    let verifier = Conversation::new(
        Api::Responses,
        "You are the verifier. Check the patch and run the full suite.",
        &["bash"],
        "Verify the refund race fix: run the suite 20 times.",
    );
    let ip1: IpAddr = [127, 0, 0, 1].into();
    let ip2: IpAddr = [127, 0, 0, 2].into();
    let mut run = Run {
        envoy,
        ip: ip1,
        rows: Vec::new(),
        last: None,
        planner,
        tool_caller,
        verifier,
    };
    use Agent::*;

    run.send(Planner, "task from the user").await?;
    run.planner.tool_round(
        "toolu_01",
        "Grep",
        json!({"arg": "test_refund_race"}),
        "tests/payments/test_refund.py:88",
    );
    run.send(Planner, "tool result").await?;
    run.planner.tool_round(
        "toolu_02",
        "Read",
        json!({"arg": "tests/payments/test_refund.py"}),
        "def test_refund_race(): ...",
    );
    run.send(Planner, "tool result").await?;
    run.send(ToolCaller, "subagent starts").await?;
    run.tool_caller.tool_round(
        "call_01",
        "bash",
        json!({"arg": "pytest -k refund_race -x --count 50"}),
        "3 failed, 47 passed",
    );
    run.send(ToolCaller, "tool result").await?;
    run.tool_caller.tool_round(
        "call_02",
        "edit_file",
        json!({"arg": "lock around ledger write"}),
        "patched",
    );
    run.send(ToolCaller, "tool result").await?;
    run.retry().await?;
    run.tool_caller.tool_round(
        "call_03",
        "bash",
        json!({"arg": "pytest -k refund_race --count 50"}),
        "50 passed",
    );
    run.send(ToolCaller, "tool result").await?;
    run.tool_caller
        .assistant("Patched the ledger write with a row lock; 50/50 passes.");
    run.planner.tool_round(
        "toolu_03",
        "Task",
        json!({"arg": "reproduce and patch"}),
        "Patched the ledger write; 50/50 passes.",
    );
    run.send(Planner, "subagent handoff back").await?;
    run.planner
        .assistant("The tool caller patched it. I will have it verified.");
    run.planner
        .user("Also make sure nothing else in payments broke.");
    run.send(Planner, "user reply").await?;
    run.ip = ip2;
    run.send(Verifier, "subagent starts, client IP changed")
        .await?;
    run.verifier.tool_round(
        "fc_01",
        "bash",
        json!({"arg": "pytest tests/payments --count 20"}),
        "1 failed: test_partial_refund",
    );
    run.send(Verifier, "tool result").await?;
    run.verifier.tool_round(
        "fc_02",
        "bash",
        json!({"arg": "pytest tests/payments/test_partial_refund.py -x"}),
        "passed",
    );
    run.send(Verifier, "tool result").await?;
    run.retry().await?;
    run.verifier.tool_round(
        "fc_03",
        "bash",
        json!({"arg": "pytest tests/payments --count 20"}),
        "all passed",
    );
    run.send(Verifier, "tool result").await?;
    run.verifier
        .assistant("Suite green 20 times; the partial refund failure was a flaky fixture.");
    run.planner.tool_round(
        "toolu_04",
        "Task",
        json!({"arg": "verify"}),
        "Suite green 20/20.",
    );
    run.send(Planner, "subagent handoff back").await?;
    run.planner.tool_round(
        "toolu_05",
        "Task",
        json!({"arg": "fix the fixture too"}),
        "pending",
    );
    run.tool_caller
        .user("Now make the partial refund fixture deterministic.");
    run.send(ToolCaller, "subagent resumes").await?;
    run.tool_caller.tool_round(
        "call_04",
        "edit_file",
        json!({"arg": "seed the fixture clock"}),
        "patched",
    );
    run.send(ToolCaller, "tool result").await?;
    run.tool_caller.tool_round(
        "call_05",
        "bash",
        json!({"arg": "pytest tests/payments --count 20"}),
        "all passed",
    );
    run.send(ToolCaller, "tool result").await?;
    run.verifier.user("Re-check after the fixture change.");
    run.send(Verifier, "subagent resumes").await?;
    run.verifier.tool_round(
        "fc_04",
        "bash",
        json!({"arg": "pytest tests/payments --count 20"}),
        "all passed",
    );
    run.send(Verifier, "tool result").await?;
    run.planner.assistant("Both fixes are in and verified.");
    run.planner.user("Great, open a PR.");
    run.send(Planner, "user reply").await?;
    run.planner.tool_round(
        "toolu_06",
        "Read",
        json!({"arg": "CONTRIBUTING.md"}),
        "PR template ...",
    );
    run.send(Planner, "tool result").await?;

    print_table(&run.rows);
    let ok = print_summary(&run.rows);
    if args.envoy_log {
        println!(
            "\nEnvoy log tail:\n{}",
            tether_e2e::envoy::tail(&run.envoy.log(), 3000)
        );
    }
    if !ok {
        bail!("an agent moved between ranks");
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!(
        "{:>3}  {:<11} {:<9} {:<9} {:<32} {:<8} {:<11} {:>3} {:<7} {:>4}  note",
        "#", "agent", "api", "client", "key source", "key", "rank", "end", "kind", "turn"
    );
    for (i, r) in rows.iter().enumerate() {
        println!(
            "{:>3}  {:<11} {:<9} {:<9} {:<32} {:<8} {:<11} {:>3} {:<7} {:>4}  {}",
            i + 1,
            r.agent.label(),
            r.api.label(),
            r.client.to_string(),
            r.source,
            r.key,
            r.rank,
            r.end,
            r.kind,
            r.turn,
            r.note
        );
    }
}

/// Prints, per agent, the ranks and keys it used; true if each used one of each.
fn print_summary(rows: &[Row]) -> bool {
    let mut by_agent: BTreeMap<Agent, (Vec<&str>, Vec<&str>)> = BTreeMap::new();
    for r in rows {
        let e = by_agent.entry(r.agent).or_default();
        if !e.0.contains(&r.rank.as_str()) {
            e.0.push(&r.rank);
        }
        if !e.1.contains(&r.key.as_str()) {
            e.1.push(&r.key);
        }
    }
    println!("\nsummary ({} turns):", rows.len());
    let mut ok = true;
    for (a, (ranks, keys)) in &by_agent {
        let stayed = ranks.len() == 1 && keys.len() == 1;
        ok &= stayed;
        let turns = rows.iter().filter(|r| r.agent == *a).count();
        println!(
            "  {:<11} {:>2} turns  rank {:<24} key {:<20} stayed on one rank: {}",
            a.label(),
            turns,
            ranks.join(","),
            keys.join(","),
            if stayed { "yes" } else { "NO" }
        );
    }
    let distinct_keys: std::collections::BTreeSet<&str> = by_agent
        .values()
        .flat_map(|(_, k)| k.iter().copied())
        .collect();
    println!(
        "  each agent has its own key: {}",
        if distinct_keys.len() == by_agent.len() {
            "yes"
        } else {
            "no"
        }
    );
    ok
}
