//! Every API, streaming and not, in its own wire format.

use crate::harness::{Server, sse, words};
use serde_json::{Value, json};

fn bodies(stream: bool) -> Vec<(&'static str, Value)> {
    let sys = words("sys", 300);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "sim", "messages": [{"role": "system", "content": sys}, {"role": "user", "content": "hello"}],
                   "max_tokens": 6, "stream": stream, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"model": "sim", "prompt": sys, "max_tokens": 6, "stream": stream,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/responses",
            json!({"model": "sim", "instructions": sys, "input": [{"role": "user", "content": "hello"}],
                   "max_output_tokens": 6, "stream": stream}),
        ),
        (
            "/v1/messages",
            json!({"model": "sim", "system": sys, "messages": [{"role": "user", "content": "hello"}],
                   "max_tokens": 6, "stream": stream}),
        ),
    ]
}

/// Prompt, cached and output tokens from an API's usage object.
fn counts(path: &str, u: &Value) -> (u64, u64, u64) {
    let n = |v: &Value| {
        v.as_u64()
            .unwrap_or_else(|| panic!("{path}: not a count in {u}"))
    };
    match path {
        "/v1/responses" => (
            n(&u["input_tokens"]),
            n(&u["input_tokens_details"]["cached_tokens"]),
            n(&u["output_tokens"]),
        ),
        "/v1/messages" => (
            n(&u["input_tokens"]) + n(&u["cache_read_input_tokens"]),
            n(&u["cache_read_input_tokens"]),
            n(&u["output_tokens"]),
        ),
        _ => (
            n(&u["prompt_tokens"]),
            n(&u["prompt_tokens_details"]["cached_tokens"]),
            n(&u["completion_tokens"]),
        ),
    }
}

#[tokio::test]
async fn every_api_answers_in_its_own_format_without_streaming() {
    let s = Server::start(&[]).await;
    for (path, body) in bodies(false) {
        let r = s.post(path, &[], &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = r.json();
        let text = match path {
            "/v1/chat/completions" => {
                assert_eq!(v["object"], "chat.completion");
                assert_eq!(v["choices"][0]["finish_reason"], "stop");
                v["choices"][0]["message"]["content"].clone()
            }
            "/v1/completions" => {
                assert_eq!(v["object"], "text_completion");
                v["choices"][0]["text"].clone()
            }
            "/v1/responses" => {
                assert_eq!(v["object"], "response");
                assert_eq!(v["status"], "completed");
                v["output"][0]["content"][0]["text"].clone()
            }
            _ => {
                assert_eq!(v["type"], "message");
                assert_eq!(v["stop_reason"], "end_turn");
                v["content"][0]["text"].clone()
            }
        };
        assert_eq!(text.as_str().unwrap().split(' ').count(), 6, "{path}");
        let (prompt, cached, out) = counts(path, &v["usage"]);
        assert!(prompt >= 300, "{path}");
        assert!(cached <= prompt);
        assert_eq!(out, 6);
        let t = &v["usage"]["tether"];
        assert!(t["sim_ttft_ms"].as_f64().unwrap() > 0.0, "{path}: {t}");
        assert!(t["sim_e2e_ms"].as_f64() > t["sim_ttft_ms"].as_f64());
        let ttft: f64 = r.header("x-tether-sim-ttft-ms").unwrap().parse().unwrap();
        assert!((ttft - t["sim_ttft_ms"].as_f64().unwrap()).abs() < 1e-3);
    }
}

#[tokio::test]
async fn every_api_streams_in_its_own_format() {
    let s = Server::start(&[]).await;
    for (path, body) in bodies(true) {
        let r = s.post(path, &[], &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert!(r.header("x-tether-sim-ttft-ms").is_some());
        let frames = sse(&r.body);
        let (text, usage) = match path {
            "/v1/chat/completions" | "/v1/completions" => {
                assert_eq!(frames.last().unwrap().1, "[DONE]", "{path}");
                let chunks: Vec<Value> = frames[..frames.len() - 1]
                    .iter()
                    .map(|(n, d)| {
                        assert!(n.is_none());
                        serde_json::from_str(d).unwrap()
                    })
                    .collect();
                let text: String = chunks
                    .iter()
                    .filter_map(|c| {
                        let ch = &c["choices"][0];
                        ch["delta"]["content"]
                            .as_str()
                            .or(ch["text"].as_str())
                            .map(str::to_owned)
                    })
                    .collect();
                let usage = chunks.last().unwrap()["usage"].clone();
                assert_eq!(chunks.last().unwrap()["choices"], json!([]));
                (text, usage)
            }
            "/v1/responses" => {
                assert!(
                    frames
                        .iter()
                        .all(|(n, _)| n.as_deref().is_some_and(|n| n.starts_with("response.")))
                );
                let mut text = String::new();
                let mut usage = Value::Null;
                for (i, (n, d)) in frames.iter().enumerate() {
                    let v: Value = serde_json::from_str(d).unwrap();
                    assert_eq!(v["sequence_number"], i);
                    match n.as_deref() {
                        Some("response.output_text.delta") => {
                            text.push_str(v["delta"].as_str().unwrap())
                        }
                        Some("response.completed") => usage = v["response"]["usage"].clone(),
                        _ => {}
                    }
                }
                assert_eq!(
                    frames.last().unwrap().0.as_deref(),
                    Some("response.completed")
                );
                (text, usage)
            }
            _ => {
                let first = frames.first().unwrap();
                assert_eq!(first.0.as_deref(), Some("message_start"));
                assert_eq!(frames.last().unwrap().0.as_deref(), Some("message_stop"));
                let mut text = String::new();
                let mut usage = Value::Null;
                for (n, d) in &frames {
                    let v: Value = serde_json::from_str(d).unwrap();
                    assert_eq!(v["type"], n.as_deref().unwrap());
                    match n.as_deref() {
                        Some("content_block_delta") => {
                            text.push_str(v["delta"]["text"].as_str().unwrap())
                        }
                        Some("message_delta") => usage = v["usage"].clone(),
                        _ => {}
                    }
                }
                (text, usage)
            }
        };
        assert_eq!(text.split(' ').count(), 6, "{path}: {text:?}");
        let (prompt, cached, out) = counts(path, &usage);
        assert!(
            prompt >= 300 && cached <= prompt && out == 6,
            "{path}: {usage}"
        );
        assert!(usage["tether"]["sim_itl_ms"].as_f64().unwrap() > 0.0);
    }
}

#[tokio::test]
async fn models_and_health_answer() {
    let s = Server::start(&["--served-model-name", "tether-sim"]).await;
    let m = s.get("/v1/models").await.json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "tether-sim");
    assert_eq!(s.get("/health").await.status, 200);
    let c = s.get("/tether/config").await.json();
    assert_eq!(c["serving"]["cache"], "retention");
    assert_eq!(c["profile"]["name"], "llama-3.1-8b-fp8-h200-tp1");
    assert_eq!(c["serving_hash"].as_str().unwrap().len(), 16);
}
