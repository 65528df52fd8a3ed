//! A small HTTP/1.1 client on hyper for the tests and the demo: JSON posts,
//! raw or chunked bodies, arbitrary (even invalid) header bytes, and an
//! optional local source address (a real client IP change: 127.0.0.1 vs 127.0.0.2).

use crate::HarnessError;
use crate::echo::EchoReply;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpSocket;

/// A request body: sent at once with `content-length`, or as chunks with
/// `transfer-encoding: chunked`.
#[derive(Debug, Clone)]
pub enum Body {
    Full(Bytes),
    Chunked(Vec<Bytes>),
}

/// One request to send.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// Raw header bytes: values need not be UTF-8; repeated names are sent repeatedly.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Body,
}

impl Request {
    /// `POST path` with a JSON body and `content-type: application/json`.
    pub fn post_json(path: &str, body: &serde_json::Value) -> Self {
        Self::post_bytes(path, "application/json", body.to_string().into_bytes())
    }

    /// `POST path` with raw bytes and the given content type.
    pub fn post_bytes(path: &str, content_type: &str, body: impl Into<Bytes>) -> Self {
        Self {
            method: "POST".into(),
            path: path.into(),
            headers: vec![("content-type".into(), content_type.as_bytes().to_vec())],
            body: Body::Full(body.into()),
        }
    }

    /// Adds a header (repeatable).
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// Sends the body as chunks of `size` bytes instead of one piece.
    pub fn chunked(mut self, size: usize) -> Self {
        let all = match &self.body {
            Body::Full(b) => b.clone(),
            Body::Chunked(c) => c.concat().into(),
        };
        let size = size.max(1);
        let chunks = (0..all.len())
            .step_by(size)
            .map(|i| all.slice(i..(i + size).min(all.len())))
            .collect();
        self.body = Body::Chunked(chunks);
        self
    }
}

/// A response: status, headers (lower-case names), body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Response {
    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, HarnessError> {
        serde_json::from_slice(&self.body).map_err(|e| HarnessError::Protocol {
            what: "response body".into(),
            why: format!(
                "{e}; status {}, body {:?}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(300)])
            ),
        })
    }

    /// The body as an echo rank's reply.
    pub fn echo(&self) -> Result<EchoReply, HarnessError> {
        self.json()
    }
}

/// Sends requests, one fresh connection each (so a changed source address
/// takes effect at once); every exchange is bounded by a timeout.
#[derive(Debug, Clone)]
pub struct HttpClient {
    local_ip: Option<IpAddr>,
    timeout: Duration,
}

impl Default for HttpClient {
    fn default() -> Self {
        Self {
            local_ip: None,
            timeout: Duration::from_secs(30),
        }
    }
}

impl HttpClient {
    pub fn new() -> Self {
        Self::default()
    }

    /// Binds the client socket to this source IP (e.g. 127.0.0.2).
    pub fn bind(mut self, ip: IpAddr) -> Self {
        self.local_ip = Some(ip);
        self
    }

    /// Per-exchange timeout (connect + send + receive), default 30 s.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Opens a keep-alive connection for several requests.
    pub async fn connect(&self, addr: SocketAddr) -> Result<Connection, HarnessError> {
        let err = |why: String| HarnessError::Http {
            addr: addr.to_string(),
            why,
        };
        let fut = async {
            let sock = if addr.is_ipv4() {
                TcpSocket::new_v4()
            } else {
                TcpSocket::new_v6()
            }
            .map_err(|e| err(e.to_string()))?;
            if let Some(ip) = self.local_ip {
                sock.bind(SocketAddr::new(ip, 0))
                    .map_err(|e| err(format!("binding {ip}: {e}")))?;
            }
            let stream = sock.connect(addr).await.map_err(|e| err(e.to_string()))?;
            let _ = stream.set_nodelay(true);
            let (send, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| err(e.to_string()))?;
            tokio::spawn(async move {
                // The connection ends when the peer closes it; nothing to report.
                let _ = conn.await;
            });
            Ok::<_, HarnessError>(send)
        };
        let send = tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| HarnessError::Timeout {
                addr: addr.to_string(),
                secs: self.timeout.as_secs(),
            })??;
        Ok(Connection {
            addr,
            send,
            timeout: self.timeout,
        })
    }

    /// Sends one request on a fresh connection.
    pub async fn send(&self, addr: SocketAddr, req: Request) -> Result<Response, HarnessError> {
        self.connect(addr).await?.send(req).await
    }

    /// `POST path` with a JSON body and extra headers.
    pub async fn post_json(
        &self,
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Result<Response, HarnessError> {
        let req = headers
            .iter()
            .fold(Request::post_json(path, body), |r, (k, v)| r.header(k, v));
        self.send(addr, req).await
    }
}

type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// A keep-alive HTTP/1.1 connection.
#[derive(Debug)]
pub struct Connection {
    addr: SocketAddr,
    send: http1::SendRequest<BoxBody>,
    timeout: Duration,
}

impl Connection {
    /// Sends one request and reads the whole response.
    pub async fn send(&mut self, req: Request) -> Result<Response, HarnessError> {
        let addr = self.addr.to_string();
        let err = |why: String| HarnessError::Http {
            addr: addr.clone(),
            why,
        };
        let body: BoxBody = match req.body {
            Body::Full(b) => Full::new(b).boxed(),
            Body::Chunked(chunks) => {
                let frames = chunks
                    .into_iter()
                    .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(c)));
                IterBody(frames).boxed()
            }
        };
        let mut builder = hyper::Request::builder()
            .method(req.method.as_str())
            .uri(req.path.as_str());
        let has_host = req
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("host"));
        if !has_host {
            builder = builder.header("host", self.addr.to_string());
        }
        for (k, v) in &req.headers {
            let name = hyper::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| err(format!("header {k}: {e}")))?;
            let value = hyper::header::HeaderValue::from_bytes(v)
                .map_err(|e| err(format!("header {k} value: {e}")))?;
            builder = builder.header(name, value);
        }
        let request = builder.body(body).map_err(|e| err(e.to_string()))?;
        let fut = async {
            self.send.ready().await.map_err(|e| err(e.to_string()))?;
            let resp = self
                .send
                .send_request(request)
                .await
                .map_err(|e| err(e.to_string()))?;
            let status = resp.status().as_u16();
            let headers = resp
                .headers()
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| err(e.to_string()))?
                .to_bytes();
            Ok::<_, HarnessError>(Response {
                status,
                headers,
                body,
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| HarnessError::Timeout {
                addr: self.addr.to_string(),
                secs: self.timeout.as_secs(),
            })?
    }
}

/// A body of pre-cut frames with no known length, so hyper sends it chunked.
struct IterBody<I>(I);

impl<I> hyper::body::Body for IterBody<I>
where
    I: Iterator<Item = Result<Frame<Bytes>, std::convert::Infallible>> + Unpin,
{
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.next())
    }
}
