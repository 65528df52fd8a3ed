//! The echo rank's server: answers any request with JSON naming the rank and
//! echoing the headers and body it received (used by `tether-echo-rank`).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Bodies up to this size (and valid UTF-8) are echoed back verbatim.
pub const ECHO_BODY_LIMIT: usize = 64 * 1024;

/// A request header asking the rank to wait this many milliseconds (≤ 10 s)
/// before answering.
pub const DELAY_HEADER: &str = "x-echo-delay-ms";

/// What an echo rank answers. Header names are lower-case; a repeated header
/// is joined with `", "` in arrival order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EchoReply {
    pub rank: String,
    pub port: u16,
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body_bytes: usize,
    pub body: Option<String>,
}

impl EchoReply {
    /// A received header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Serves until the listener fails; each connection on its own task.
pub async fn serve(listener: TcpListener, name: String) -> std::io::Result<()> {
    let port = listener.local_addr()?.port();
    let name = Arc::new(name);
    loop {
        let (stream, _) = listener.accept().await?;
        let name = Arc::clone(&name);
        tokio::spawn(async move {
            let svc = service_fn(move |req| answer(req, Arc::clone(&name), port));
            // A client that goes away mid-request is not the rank's problem.
            let _ = http1::Builder::new()
                .max_buf_size(1 << 20)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    name: Arc<String>,
    port: u16,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in req.headers() {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        headers
            .entry(k.as_str().to_owned())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&v)
            })
            .or_insert(v);
    }
    // Lets tests hold a request in flight (bounded-load hashing needs that).
    let delay = headers
        .get(DELAY_HEADER)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        .min(10_000);
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await?.to_bytes();
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    let text = if body.len() <= ECHO_BODY_LIMIT {
        std::str::from_utf8(&body).ok().map(str::to_owned)
    } else {
        None
    };
    let reply = EchoReply {
        rank: name.to_string(),
        port,
        method,
        path,
        headers,
        body_bytes: body.len(),
        body: text,
    };
    let json = serde_json::to_vec(&reply).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(json)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
