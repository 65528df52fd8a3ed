//! OpenAI Responses chains through Envoy, answered by real `tether-rank`
//! processes: the filter learns each answer's `id` on the response path
//! (streamed and not), so every turn that continues it with
//! `previous_response_id` keeps turn 1's key and rank, and two chains with the
//! same instructions and tools stay apart (docs/gateway.md, "Responses chains").

use serde_json::{Value, json};
use tether_e2e::stack::rank_args;
use tether_e2e::{HttpClient, Request, Response, Stack, StackSpec};
use tether_envoy::Mode;

use crate::support::need_envoy_and_filter;

/// Turn `turn` of a Codex-shaped chain: turn 1 holds the first user message,
/// later turns only the new tool output and `previous_response_id`.
fn turn_body(turn: usize, first: &str, previous: Option<&str>, stream: bool) -> Value {
    let input = if turn == 1 {
        json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": first}]}])
    } else {
        json!([{"type": "function_call_output", "call_id": format!("call_{turn}"), "output": "exit status 0"}])
    };
    let mut body = json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI.",
        "input": input,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "store": true,
        "stream": stream,
        "max_output_tokens": 4,
    });
    if let Some(p) = previous {
        body["previous_response_id"] = json!(p);
    }
    body
}

/// The answer's response id: the JSON object's `id`, or the first SSE event's `response.id`.
fn response_id(r: &Response, stream: bool) -> String {
    let v: Value = if stream {
        let text = String::from_utf8_lossy(&r.body);
        let data = text
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("no SSE data: {text}"));
        let first: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        assert_eq!(first["type"], "response.created", "{data}");
        first["response"].clone()
    } else {
        r.json().unwrap_or_else(|e| panic!("{e}"))
    };
    let id = v["id"].as_str().unwrap_or_default().to_owned();
    assert!(
        id.starts_with("resp_"),
        "tether-rank answers a Responses id: {v}"
    );
    id
}

/// `source=…;key=…;endpoint=…` from `x-tether-debug`: (source, key, endpoint).
fn debug(r: &Response) -> (String, String, String) {
    let d = r
        .header("x-tether-debug")
        .unwrap_or_else(|| panic!("no debug header: {r:?}"));
    let field = |n: &str| {
        d.split(';')
            .find_map(|kv| kv.strip_prefix(&format!("{n}=")))
            .unwrap_or_default()
            .to_owned()
    };
    (field("source"), field("key"), field("endpoint"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_chains_keep_their_key_and_rank_through_envoy() {
    need_envoy_and_filter();
    let mut spec = StackSpec::new(4, Mode::Pick, &[]);
    spec.rank_args = rank_args(1000.0, "lru", 1 << 20, 0.0);
    spec.plugin_config
        .insert("outputs".into(), json!(["pick", "debug"]));
    spec.concurrency = 2;
    let stack = Stack::start(&spec).unwrap_or_else(|e| panic!("starting the stack: {e}"));
    let client = HttpClient::new();
    let addr = stack.envoy.listen_addr();
    for stream in [false, true] {
        // Two chains at once with one instructions + tools, interleaved.
        let starts = [
            "fix the failing parser test",
            "add a --json flag to the CLI",
        ];
        let mut prev: [Option<String>; 2] = [None, None];
        let mut seen: [Vec<(String, String, String)>; 2] = [Vec::new(), Vec::new()];
        for turn in 1..=4 {
            for c in 0..2 {
                let body = turn_body(turn, starts[c], prev[c].as_deref(), stream);
                let r = client
                    .send(addr, Request::post_json("/v1/responses", &body))
                    .await
                    .unwrap_or_else(|e| panic!("turn {turn}: {e}"));
                assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
                prev[c] = Some(response_id(&r, stream));
                seen[c].push(debug(&r));
            }
        }
        for chain in &seen {
            assert_eq!(chain[0].0, "head", "stream={stream}: {chain:?}");
            assert!(
                chain[1..].iter().all(|t| t.0 == "chain"),
                "stream={stream}: {chain:?}"
            );
            assert!(
                chain.iter().all(|t| t.1 == chain[0].1 && t.2 == chain[0].2),
                "stream={stream}: one key, one endpoint: {chain:?}"
            );
        }
        assert_ne!(seen[0][0].1, seen[1][0].1, "stream={stream}: chains apart");
    }
    // Two workers, one table (shared data is per Envoy process). Counts reach
    // Envoy on each VM's next tick (1 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let counts = loop {
        let m = stack.envoy.prometheus().unwrap_or_else(|e| panic!("{e}"));
        let c = |n: &str| m.get(n, &[]).unwrap_or(0.0);
        let counts = (
            c("tether_chain_learned"),
            c("tether_chain_hit"),
            c("tether_chain_unseen"),
        );
        if counts.0 >= 16.0 || std::time::Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(counts, (16.0, 12.0, 0.0), "learned, hit, unseen");
}
