//! The benchmark's load generator: keep-alive hyper HTTP/1.1 connections,
//! latency at concurrency 1 into an HDR histogram, and requests/s at saturation.

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::header::{HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// One kind of request sent to one Envoy: the same bytes every time.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl Target {
    fn request(&self) -> Result<hyper::Request<Full<Bytes>>> {
        let mut req = hyper::Request::builder()
            .method("POST")
            .uri("/v1/chat/completions")
            .header("host", "bench.local")
            .header("content-type", "application/json")
            .body(Full::new(self.body.clone()))?;
        for (name, value) in &self.headers {
            req.headers_mut().insert(name.clone(), value.clone());
        }
        Ok(req)
    }
}

/// What the upstream answered, for the one-off routing check.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
}

/// A keep-alive connection to the gateway.
struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { sender })
    }

    /// Sends one request and reads the whole reply.
    async fn exchange(&mut self, target: &Target) -> Result<Reply> {
        self.sender.ready().await?;
        let resp = self.sender.send_request(target.request()?).await?;
        let (parts, body) = resp.into_parts();
        body.collect().await?;
        Ok(Reply {
            status: parts.status.as_u16(),
            headers: parts.headers,
        })
    }
}

/// One request on a fresh connection (the routing check before measuring).
pub async fn probe(target: &Target) -> Result<Reply> {
    Conn::open(target.addr).await?.exchange(target).await
}

/// Latency at concurrency 1 for several targets at once: one keep-alive
/// connection each, one request at a time, taking the targets in turn (the
/// first of each cycle rotates), so whatever else the machine is doing hits
/// every target alike. Runs until each has `min_requests` and `max_time` has
/// passed. Histograms in nanoseconds, in the order of `targets`.
pub async fn latency_interleaved(
    targets: &[&Target],
    min_requests: u64,
    max_time: Duration,
) -> Result<Vec<Histogram<u64>>> {
    let mut hists = Vec::with_capacity(targets.len());
    let mut conns = Vec::with_capacity(targets.len());
    for t in targets {
        hists.push(Histogram::<u64>::new_with_bounds(
            1_000,
            120_000_000_000,
            3,
        )?);
        conns.push(Conn::open(t.addr).await?);
    }
    let start = Instant::now();
    let mut cycle = 0usize;
    while cycle < min_requests as usize || start.elapsed() < max_time {
        for k in 0..targets.len() {
            let i = (cycle + k) % targets.len();
            let t = Instant::now();
            let reply = conns[i].exchange(targets[i]).await?;
            let ns = t.elapsed().as_nanos() as u64;
            ensure!(
                reply.status == 200,
                "status {} at concurrency 1",
                reply.status
            );
            hists[i].saturating_record(ns.max(1_000));
        }
        cycle += 1;
    }
    Ok(hists)
}

/// What a saturation phase measured.
#[derive(Debug, Clone, Copy)]
pub struct Saturation {
    pub requests: u64,
    pub rps: f64,
}

/// Requests/s with `conns` keep-alive connections each sending back to back for `time`.
pub async fn saturate(target: &Target, conns: usize, time: Duration) -> Result<Saturation> {
    let target = Arc::new(target.clone());
    let mut opened = Vec::with_capacity(conns);
    for _ in 0..conns {
        opened.push(Conn::open(target.addr).await?);
    }
    let start = Instant::now();
    let deadline = start + time;
    let mut tasks = Vec::with_capacity(conns);
    for mut conn in opened {
        let target = Arc::clone(&target);
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                let reply = conn.exchange(&target).await?;
                if reply.status != 200 {
                    bail!("status {} at saturation", reply.status);
                }
                done += 1;
            }
            Ok::<u64, anyhow::Error>(done)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(Saturation {
        requests: total,
        rps: total as f64 / start.elapsed().as_secs_f64(),
    })
}
