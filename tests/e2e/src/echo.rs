//! The echo rank's server: answers any request with JSON naming the rank and
//! echoing the headers and body it received (used by `tether-echo-rank`);
//! on request it answers late, streams, or fails like a sick rank.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Bodies up to this size (and valid UTF-8) are echoed back verbatim.
pub const ECHO_BODY_LIMIT: usize = 64 * 1024;

/// A request header asking the rank to wait this many milliseconds (≤ 60 s)
/// before answering.
pub const DELAY_HEADER: &str = "x-echo-delay-ms";

/// A request header asking for a server-sent-event answer that lasts this
/// many milliseconds (≤ 60 s): the echo as the first event, then one event a
/// second, then `data: [DONE]` — an LLM stream's shape.
pub const STREAM_HEADER: &str = "x-echo-stream-ms";

/// `POST` here with body `ok`, `503` or `hang` (sent to the rank directly,
/// not through Envoy) switches how the rank answers everything else: normally,
/// with `503 Service Unavailable`, or never (health checks included).
pub const FAULT_PATH: &str = "/echo/fault";

/// How the rank answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    None = 0,
    Unavailable = 1,
    Hang = 2,
}

impl Fault {
    /// The body that selects it at [`FAULT_PATH`].
    pub fn word(self) -> &'static str {
        match self {
            Fault::None => "ok",
            Fault::Unavailable => "503",
            Fault::Hang => "hang",
        }
    }

    fn from_word(w: &[u8]) -> Option<Fault> {
        [Fault::None, Fault::Unavailable, Fault::Hang]
            .into_iter()
            .find(|f| f.word().as_bytes() == w)
    }

    fn from_u8(v: u8) -> Fault {
        match v {
            1 => Fault::Unavailable,
            2 => Fault::Hang,
            _ => Fault::None,
        }
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

/// A response body fed by a channel (the streamed answer).
struct Channel(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

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
    let fault = Arc::new(AtomicU8::new(Fault::None as u8));
    loop {
        let (stream, _) = listener.accept().await?;
        let name = Arc::clone(&name);
        let fault = Arc::clone(&fault);
        tokio::spawn(async move {
            let svc =
                service_fn(move |req| answer(req, Arc::clone(&name), port, Arc::clone(&fault)));
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
    fault: Arc<AtomicU8>,
) -> Result<Response<Body>, hyper::Error> {
    if req.uri().path() == FAULT_PATH {
        let body = req.into_body().collect().await?.to_bytes();
        let Some(f) = Fault::from_word(body.trim_ascii()) else {
            let mut r = Response::new(full("fault: ok, 503 or hang"));
            *r.status_mut() = hyper::StatusCode::BAD_REQUEST;
            return Ok(r);
        };
        fault.store(f as u8, Ordering::SeqCst);
        return Ok(Response::new(full(f.word())));
    }
    match Fault::from_u8(fault.load(Ordering::SeqCst)) {
        Fault::None => {}
        Fault::Unavailable => {
            let mut r = Response::new(full(format!("{name}: unavailable")));
            *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
            return Ok(r);
        }
        Fault::Hang => std::future::pending::<()>().await,
    }
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
    let ms = |h: &str| {
        headers
            .get(h)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            .min(60_000)
    };
    let (delay, stream_ms) = (ms(DELAY_HEADER), ms(STREAM_HEADER));
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
    if stream_ms > 0 {
        return Ok(stream(json, stream_ms));
    }
    let mut resp = Response::new(full(json));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// The echo as the first server-sent event, then `data: <n>` once a second
/// until `ms` have passed, then `data: [DONE]`.
fn stream(json: Vec<u8>, ms: u64) -> Response<Body> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut first = b"data: ".to_vec();
        first.extend(json);
        first.extend(b"\n\n");
        if tx.send(Bytes::from(first)).await.is_err() {
            return;
        }
        let start = tokio::time::Instant::now();
        let mut n = 0u64;
        while start.elapsed().as_millis() < u128::from(ms) {
            tokio::time::sleep(std::time::Duration::from_millis(1000.min(ms))).await;
            n += 1;
            if tx
                .send(Bytes::from(format!("data: {n}\n\n")))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let mut resp = Response::new(Channel(rx).boxed());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    resp
}
