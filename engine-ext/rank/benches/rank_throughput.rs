//! How many requests per second one `tether-rank` process sustains, and how
//! much CPU it spends per request, on agent-shaped traffic at high `--speedup`.
//!
//! Each variant starts the real release binary (`--threads 1`), drives it with
//! C keep-alive connections, each replaying agent sessions (a system prompt
//! shared by every session, a session-unique task, then turns that grow the
//! prompt; half the requests stream), and reads the rank's CPU time from
//! `/proc/<pid>/stat`. Variants run round-robin, medians over rounds.
//!
//! Target: the replay issue wants 10,000 requests through Envoy + 8 ranks in
//! under 5 minutes on this 2-core machine (33.3 req/s for the whole fleet). A
//! rank is "not the bottleneck" when one core of it serves ≥ 10× that rate
//! (≥ 333 req/s per core, ≤ 3 ms of CPU per request) at 16 K-token prompts, so
//! eight ranks together spend ≤ 10 % of the machine on the replay's requests.
//!
//! Run: `cargo bench -p tether-rank --bench rank-throughput [-- --quick]`.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The replay target's fleet-wide rate: 10,000 requests in 300 s.
const REPLAY_RATE: f64 = 10_000.0 / 300.0;
/// A rank core must serve this many times the replay's whole rate.
const HEADROOM: f64 = 10.0;
/// Linux USER_HZ: `/proc/<pid>/stat` CPU times are in these ticks.
const TICKS_PER_SEC: f64 = 100.0;

#[derive(Debug, Clone)]
struct Variant {
    name: &'static str,
    /// Tokens of the last turn's prompt.
    prompt: usize,
    cache: &'static str,
    speedup: &'static str,
    target: bool,
}

struct Rank {
    child: Child,
    addr: String,
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(v: &Variant) -> Result<Rank> {
    let profile = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"
    );
    let mut args = vec![
        "--profile",
        profile,
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--speedup",
        v.speedup,
        "--cache",
        v.cache,
    ];
    if v.cache == "retention-host" {
        args.extend(["--host-gib", "8"]);
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether-rank"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting tether-rank")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("READY ")
        .context("no READY line")?
        .to_owned();
    Ok(Rank { child, addr })
}

fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesized command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("bad stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / TICKS_PER_SEC)
}

/// Words of text: `tag` makes them unique to a session (one token each).
fn words(out: &mut String, tag: &str, n: usize) {
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(tag);
        out.push_str(&i.to_string());
    }
}

/// The body of turn `t` of session `s`: shared system prompt (half the final
/// size), a session task, then `t` exchanges of prompt/16 tokens each.
fn body(system: &str, prompt: usize, s: u64, t: usize, turns: usize) -> Bytes {
    let step = prompt / 2 / turns;
    let mut msgs = String::with_capacity(prompt * 8);
    msgs.push_str(r#"{"model":"bench","max_tokens":64,"stream":"#);
    msgs.push_str(if (s + t as u64).is_multiple_of(2) {
        "true"
    } else {
        "false"
    });
    msgs.push_str(
        r#","stream_options":{"include_usage":true},"messages":[{"role":"system","content":""#,
    );
    msgs.push_str(system);
    msgs.push_str(r#""},{"role":"user","content":""#);
    words(&mut msgs, &format!("task{s}w"), 32);
    msgs.push('"');
    msgs.push('}');
    for i in 0..t {
        msgs.push_str(r#",{"role":"assistant","content":""#);
        words(&mut msgs, &format!("s{s}a{i}w"), step / 4);
        msgs.push_str(r#""},{"role":"user","content":""#);
        words(&mut msgs, &format!("s{s}u{i}w"), step - step / 4);
        msgs.push_str(r#""}"#);
    }
    msgs.push_str("]}");
    Bytes::from(msgs)
}

struct Totals {
    requests: AtomicU64,
    prompt: AtomicU64,
    cached: AtomicU64,
}

async fn client(
    addr: String,
    v: Variant,
    first: u64,
    sessions: u64,
    totals: Arc<Totals>,
) -> Result<()> {
    let stream = tokio::net::TcpStream::connect(&addr).await?;
    stream.set_nodelay(true)?;
    let (mut send, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let turns = 8;
    let mut system = String::new();
    words(&mut system, "sys", v.prompt / 2);
    for s in first..first + sessions {
        for t in 0..turns {
            let req = hyper::Request::builder()
                .method("POST")
                .uri("/v1/chat/completions")
                .header("host", "bench")
                .header("content-type", "application/json")
                .header("x-tether-session", format!("{s:x}"))
                .header("x-tether-prompt-end", "1")
                .header("x-tether-turn-kind", "tool")
                .body(Full::new(body(&system, v.prompt, s, t, turns)))?;
            let resp = send.send_request(req).await?;
            if resp.status() != 200 {
                bail!("status {}", resp.status());
            }
            let bytes = resp.into_body().collect().await?.to_bytes();
            // The usage is in the last JSON object (non-streaming body or last data chunk).
            let text = std::str::from_utf8(&bytes)?;
            let usage_at = text.rfind("\"usage\":{").context("no usage")?;
            let usage: serde_json::Value =
                serde_json::Deserializer::from_str(&text[usage_at + 8..])
                    .into_iter::<serde_json::Value>()
                    .next()
                    .context("no usage object")??;
            totals.requests.fetch_add(1, Ordering::Relaxed);
            totals.prompt.fetch_add(
                usage["prompt_tokens"].as_u64().unwrap_or(0),
                Ordering::Relaxed,
            );
            totals.cached.fetch_add(
                usage["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0),
                Ordering::Relaxed,
            );
        }
    }
    Ok(())
}

struct RoundResult {
    rps: f64,
    cpu_ms_per_req: f64,
    mean_prompt: f64,
    hit: f64,
}

fn round(v: &Variant, conns: u64, sessions_per_conn: u64) -> Result<RoundResult> {
    let rank = start(v)?;
    let pid = rank.child.id();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let totals = Arc::new(Totals {
        requests: AtomicU64::new(0),
        prompt: AtomicU64::new(0),
        cached: AtomicU64::new(0),
    });
    let cpu0 = cpu_secs(pid)?;
    let t0 = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..conns {
            tasks.push(tokio::spawn(client(
                rank.addr.clone(),
                v.clone(),
                c * sessions_per_conn,
                sessions_per_conn,
                totals.clone(),
            )));
        }
        for t in tasks {
            t.await??;
        }
        anyhow::Ok(())
    })?;
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid)? - cpu0;
    let n = totals.requests.load(Ordering::Relaxed) as f64;
    let prompt = totals.prompt.load(Ordering::Relaxed) as f64;
    Ok(RoundResult {
        rps: n / wall,
        cpu_ms_per_req: cpu * 1000.0 / n,
        mean_prompt: prompt / n,
        hit: totals.cached.load(Ordering::Relaxed) as f64 / prompt,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, conns, sessions) = if quick { (1, 8, 2) } else { (3, 16, 6) };
    let variants = [
        Variant {
            name: "2K prompts, retention+host, 1000x",
            prompt: 2_048,
            cache: "retention-host",
            speedup: "1000",
            target: false,
        },
        Variant {
            name: "16K prompts, retention+host, 1000x",
            prompt: 16_384,
            cache: "retention-host",
            speedup: "1000",
            target: true,
        },
        Variant {
            name: "16K prompts, LRU, 1000x",
            prompt: 16_384,
            cache: "lru",
            speedup: "1000",
            target: false,
        },
        Variant {
            name: "16K prompts, retention+host, 100x",
            prompt: 16_384,
            cache: "retention-host",
            speedup: "100",
            target: false,
        },
        Variant {
            name: "64K prompts, retention+host, 1000x",
            prompt: 65_536,
            cache: "retention-host",
            speedup: "1000",
            target: false,
        },
    ];
    println!(
        "tether-rank throughput: {rounds} round(s) × {} requests per variant ({conns} connections × {sessions} sessions × 8 turns; 64 output tokens; half streaming); rank --threads 1",
        conns * sessions * 8
    );
    let mut results: Vec<Vec<RoundResult>> = variants.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (i, v) in variants.iter().enumerate() {
            results[i].push(round(v, conns, sessions)?);
        }
    }
    println!();
    println!(
        "| variant | mean prompt tokens | hit ratio | req/s (wall) | rank CPU ms/req | req/s per rank core | × replay rate (33.3/s) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut verdict = None;
    for (v, r) in variants.iter().zip(results) {
        let rps = median(r.iter().map(|x| x.rps).collect());
        let cpu = median(r.iter().map(|x| x.cpu_ms_per_req).collect());
        let per_core = 1000.0 / cpu;
        let prompt = median(r.iter().map(|x| x.mean_prompt).collect());
        let hit = median(r.iter().map(|x| x.hit).collect());
        println!(
            "| {} | {prompt:.0} | {hit:.3} | {rps:.0} | {cpu:.2} | {per_core:.0} | {:.1}× |",
            v.name,
            per_core / REPLAY_RATE
        );
        if v.target {
            verdict = Some((v.name, per_core));
        }
    }
    if let Some((name, per_core)) = verdict {
        let need = REPLAY_RATE * HEADROOM;
        let pass = per_core >= need;
        println!();
        println!(
            "target: one rank core serves ≥ {need:.0} req/s ({HEADROOM}× the replay's fleet-wide {REPLAY_RATE:.1} req/s) on {name}: {:.0} req/s per core → {}",
            per_core,
            if pass { "PASS" } else { "MISS" }
        );
    }
    Ok(())
}
