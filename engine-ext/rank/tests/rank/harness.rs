//! An in-process rank on an ephemeral port, a small HTTP client, and parsers
//! for SSE and the Prometheus text format.

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use tether_rank::config::{Args, RankConfig};
use tether_rank::server::{Rank, serve};

pub fn profile_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/profiles/llama-3.1-8b-fp8-h200-tp1.json")
}

/// A rank serving on loopback until the test's runtime ends.
pub struct Server {
    pub addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A response, read whole.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

impl Server {
    /// Starts a rank with the Llama profile, `--speedup 1000` and `extra` flags.
    pub async fn start(extra: &[&str]) -> Server {
        let profile = profile_path();
        let mut argv = vec![
            "tether-rank".to_owned(),
            "--profile".to_owned(),
            profile.display().to_string(),
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--speedup".to_owned(),
            "1000".to_owned(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        let args = Args::try_parse_from(argv).expect("flags parse");
        let cfg = RankConfig::from_args(args).expect("config");
        let listener = tokio::net::TcpListener::bind(cfg.args.listen)
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let rank = Rank::new(cfg).unwrap();
        tokio::spawn(serve(listener, rank));
        Server {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("http://{}{}", self.addr, path))
            .header("content-type", "application/json");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let resp = self
            .client
            .request(b.body(Full::new(body.into())).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> Reply {
        self.send("POST", path, headers, serde_json::to_vec(body).unwrap())
            .await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, &[], Bytes::new()).await
    }

    pub async fn metrics(&self) -> Vec<Sample> {
        let r = self.get("/metrics").await;
        assert_eq!(r.status, 200);
        parse_prometheus(r.text())
    }
}

/// `n` words of text unique to `seed` (one token each under the prompt contract).
pub fn words(seed: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{seed}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// (event name, data) of every SSE frame.
pub fn sse(body: &[u8]) -> Vec<(Option<String>, String)> {
    tether_rank::reply::parse_sse(std::str::from_utf8(body).unwrap()).unwrap()
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses every sample line strictly: a malformed line fails the test.
pub fn parse_prometheus(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((n, rest)) => {
                let rest = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels {line:?}"));
                let mut labels = BTreeMap::new();
                let mut s = rest;
                while !s.is_empty() {
                    let (k, v) = s
                        .split_once("=\"")
                        .unwrap_or_else(|| panic!("bad label {line:?}"));
                    let mut end = 0;
                    let b = v.as_bytes();
                    while b[end] != b'"' || (end > 0 && b[end - 1] == b'\\') {
                        end += 1;
                    }
                    labels.insert(k.to_owned(), v[..end].to_owned());
                    s = v[end + 1..].trim_start_matches(',');
                }
                (n.to_owned(), labels)
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name {name:?}"
        );
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// Sum of the samples named `name` whose labels include `with`.
pub fn total(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && with
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Whether any sample is named `name`.
pub fn has(samples: &[Sample], name: &str) -> bool {
    samples.iter().any(|s| s.name == name)
}

/// A chat body with a system prompt and turns.
pub fn chat(system: &str, turns: &[&str], max_tokens: u64) -> Value {
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for (i, t) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": t}));
    }
    serde_json::json!({"model": "sim", "messages": messages, "max_tokens": max_tokens})
}
