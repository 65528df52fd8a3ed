//! The replay's HTTP/1.1 client (hyper): sends one synthesized request,
//! reads the answer as it streams, and turns it into an [`Outcome`] — never
//! a panic, never a hang (every exchange runs under a timeout).

use super::response::{ClientTimes, Headers, SseParser, StreamReader, body_usage, served};
use crate::report::observe::{ErrorKind, Outcome};
use crate::synth::HttpRequest;
use crate::trace::Api;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::Client as Legacy;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, Instant};

/// A base URL requests are sent to (`http://host:port[/prefix]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `http://host:port`.
    pub origin: String,
    /// Path prefix without a trailing `/` (usually empty).
    pub prefix: String,
}

/// A `GET` of a configuration or metrics document that gave nothing usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{url}: {why}")]
pub struct FetchError {
    /// What was fetched.
    pub url: String,
    /// Why it is unusable (I/O, status, timeout, parse).
    pub why: String,
}

/// A target that is not a plain-HTTP URL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadTarget {
    /// Not a URL at all.
    #[error("`{0}` is not a URL: {1}")]
    NotUrl(String, String),
    /// HTTPS or another scheme.
    #[error("`{0}`: scheme {1} is not supported (plain http only)")]
    Scheme(String, String),
    /// No `http://`.
    #[error("`{0}`: no scheme (write http://{0})")]
    NoScheme(String),
    /// No host.
    #[error("`{0}`: no host")]
    NoHost(String),
    /// A port that is no number from 0 to 65535.
    #[error("`{0}`: the port is not a number from 0 to 65535")]
    Port(String),
}

impl Target {
    /// Parses `http://host:port[/prefix]`; only plain HTTP is spoken.
    pub fn parse(s: &str) -> Result<Target, BadTarget> {
        let uri: Uri = s.parse().map_err(|e: hyper::http::uri::InvalidUri| {
            BadTarget::NotUrl(s.to_owned(), e.to_string())
        })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => return Err(BadTarget::Scheme(s.to_owned(), other.to_owned())),
            None => return Err(BadTarget::NoScheme(s.to_owned())),
        }
        let auth = uri
            .authority()
            .ok_or_else(|| BadTarget::NoHost(s.to_owned()))?;
        if auth.host().is_empty() {
            return Err(BadTarget::NoHost(s.to_owned()));
        }
        // `host:port`, or `[v6]:port`: a `:` whose right side is no bracket.
        let port = auth.as_str().rsplit_once(':').map(|(_, p)| p);
        if port.is_some_and(|p| !p.contains(']')) && auth.port_u16().is_none() {
            return Err(BadTarget::Port(s.to_owned()));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(Target {
            origin: format!("http://{auth}"),
            prefix,
        })
    }

    /// The URL of `path` on this target.
    pub fn url(&self, path: &str) -> String {
        format!("{}{}{}", self.origin, self.prefix, path)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.origin, self.prefix)
    }
}

/// A pooled keep-alive client.
#[derive(Clone, Debug)]
pub struct Client {
    inner: Legacy<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn failed(kind: ErrorKind, message: impl Into<String>, h: Option<&Headers>) -> Outcome {
    Outcome::Failed {
        kind,
        message: message.into(),
        attempts: h.and_then(|h| h.attempts).unwrap_or(1),
        rank: h.and_then(|h| h.rank.clone()),
    }
}

impl Client {
    /// A client whose exchanges each end within `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(Duration::from_secs(10)));
        let inner = Legacy::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(conn);
        Self { inner, timeout }
    }

    /// Sends `req` to `target` and reads the answer of `api`. The request is
    /// taken, so its body (up to MBs) goes out without a copy.
    pub async fn exchange(&self, target: &Target, api: Api, req: HttpRequest) -> Outcome {
        match tokio::time::timeout(self.timeout, self.exchange_inner(target, api, req)).await {
            Ok(o) => o,
            Err(_) => failed(
                ErrorKind::Timeout,
                format!(
                    "no complete answer within {:.0} s",
                    self.timeout.as_secs_f64()
                ),
                None,
            ),
        }
    }

    async fn exchange_inner(&self, target: &Target, api: Api, req: HttpRequest) -> Outcome {
        let mut b = hyper::Request::builder()
            .method(req.method)
            .uri(target.url(req.path));
        for (k, v) in &req.headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let request = match b.body(Full::new(Bytes::from(req.body))) {
            Ok(r) => r,
            Err(e) => {
                return failed(
                    ErrorKind::BadResponse,
                    format!("request not built: {e}"),
                    None,
                );
            }
        };
        let start = Instant::now();
        let resp = match self.inner.request(request).await {
            Ok(r) => r,
            Err(e) if e.is_connect() => return failed(ErrorKind::Connect, e.to_string(), None),
            Err(e) => {
                let mut why = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    why = format!("{why}: {s}");
                    src = s.source();
                }
                return failed(ErrorKind::Reset, why, None);
            }
        };
        let status = resp.status();
        let headers = Headers::from_pairs(
            resp.headers()
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_bytes())),
        );
        let sse = resp
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut body = resp.into_body();
        if !status.is_success() {
            let mut text = Vec::new();
            while let Some(Ok(f)) = body.frame().await {
                if let Some(d) = f.data_ref() {
                    text.extend_from_slice(d);
                }
                if text.len() > 2048 {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&text[..text.len().min(300)]).into_owned();
            return failed(
                ErrorKind::Status(status.as_u16()),
                format!("{status}: {text}"),
                Some(&headers),
            );
        }
        if sse {
            let mut parser = SseParser::default();
            let mut reader = StreamReader::new(api);
            loop {
                match body.frame().await {
                    None => break,
                    Some(Err(e)) => {
                        return failed(
                            ErrorKind::Reset,
                            format!("stream cut: {e}"),
                            Some(&headers),
                        );
                    }
                    Some(Ok(f)) => {
                        if let Some(d) = f.data_ref() {
                            let at = ms(start);
                            for ev in parser.push(d) {
                                reader.event(&ev, at);
                            }
                        }
                    }
                }
            }
            if let Some(ev) = parser.finish() {
                reader.event(&ev, ms(start));
            }
            reader.times.end_ms = ms(start);
            if !reader.finished {
                return failed(
                    ErrorKind::Reset,
                    "stream ended before its final event",
                    Some(&headers),
                );
            }
            match reader.usage {
                Some(u) => Outcome::Served(served(u, &headers, &reader.times)),
                None => failed(
                    ErrorKind::BadResponse,
                    "stream carried no usage",
                    Some(&headers),
                ),
            }
        } else {
            let bytes = match body.collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return failed(ErrorKind::Reset, format!("body cut: {e}"), Some(&headers));
                }
            };
            let end = ms(start);
            let times = ClientTimes {
                first_ms: None,
                last_ms: None,
                deltas: 0,
                end_ms: end,
            };
            match body_usage(api, &bytes) {
                Some(u) => Outcome::Served(served(u, &headers, &times)),
                None => failed(
                    ErrorKind::BadResponse,
                    format!(
                        "no usage in the answer: {}",
                        String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                    ),
                    Some(&headers),
                ),
            }
        }
    }

    /// `GET url` → body text (status must be 2xx), for scraping ranks and Envoy's admin.
    pub async fn get_text(&self, url: &str) -> Result<String, FetchError> {
        let err = |why: String| FetchError {
            url: url.to_owned(),
            why,
        };
        let uri: Uri = url.parse().map_err(|e| err(format!("{e}")))?;
        let req = hyper::Request::get(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| err(e.to_string()))?;
        let fut = async {
            let resp = self
                .inner
                .request(req)
                .await
                .map_err(|e| err(e.to_string()))?;
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| err(e.to_string()))?
                .to_bytes();
            if !status.is_success() {
                return Err(err(status.to_string()));
            }
            Ok(String::from_utf8_lossy(&body).into_owned())
        };
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .map_err(|_| err("no answer within 10 s".to_owned()))?
    }
}

#[cfg(test)]
mod tests;
