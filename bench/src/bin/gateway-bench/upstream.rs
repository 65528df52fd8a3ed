//! The benchmark's upstream: a minimal hyper HTTP/1.1 server on its own thread
//! that drains the request body and answers a fixed small completion, so the
//! upstream is never what the benchmark measures.
//!
//! It copies a few routing headers into the reply (`x-up-<name>`) and reports
//! the body size it received (`x-up-body-bytes`), so the benchmark can check
//! once per variant that each path really routed and forwarded the whole body.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// Request headers echoed back as `x-up-<name>`: the evidence of each routing path.
pub const ECHOED: [&str; 4] = [
    "x-floor",
    "x-tether-key",
    "x-tether-key-source",
    "x-session-id",
];

const REPLY: &str = r#"{"id":"cmpl-bench","object":"chat.completion","model":"qwen3-coder-30b","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

/// Listeners on ephemeral loopback ports, served by one current-thread runtime
/// on a dedicated OS thread (it lives as long as the process).
#[derive(Debug)]
pub struct Upstream {
    addrs: Vec<SocketAddr>,
}

impl Upstream {
    /// Starts `ports` listeners (several stand for several ranks behind a hash).
    pub fn start(ports: usize) -> anyhow::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("bench-upstream".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(anyhow::Error::from(e)));
                        return;
                    }
                };
                rt.block_on(async move {
                    let mut addrs = Vec::new();
                    for _ in 0..ports {
                        match TcpListener::bind("127.0.0.1:0")
                            .await
                            .and_then(|l| Ok((l.local_addr()?, l)))
                        {
                            Ok((addr, listener)) => {
                                addrs.push(addr);
                                tokio::spawn(accept_loop(listener));
                            }
                            Err(e) => {
                                let _ = tx.send(Err(e.into()));
                                return;
                            }
                        }
                    }
                    let _ = tx.send(Ok(addrs));
                    std::future::pending::<()>().await;
                });
            })?;
        let addrs = rx.recv()??;
        Ok(Self { addrs })
    }

    /// The listening addresses, in start order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

async fn accept_loop(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let echoed: Vec<(String, hyper::header::HeaderValue)> = ECHOED
        .iter()
        .filter_map(|name| {
            req.headers()
                .get(*name)
                .map(|v| (format!("x-up-{name}"), v.clone()))
        })
        .collect();
    let mut body = req.into_body();
    let mut bytes = 0usize;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => bytes += f.data_ref().map_or(0, |d| d.len()),
            Err(_) => break,
        }
    }
    let mut resp = Response::new(Full::new(Bytes::from_static(REPLY.as_bytes())));
    let headers = resp.headers_mut();
    headers.insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    headers.insert("x-up-body-bytes", hyper::header::HeaderValue::from(bytes));
    for (name, value) in echoed {
        if let Ok(name) = hyper::header::HeaderName::try_from(name) {
            headers.insert(name, value);
        }
    }
    Ok(resp)
}
