//! The hops a body takes, each timed: synthesis (the `tether` binaries), the
//! rank's reading (in process), one exchange with a rank process and through
//! Envoy, and the load polls of an idle gateway.

use crate::{Args, Body};
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tether_bench::{median, root};
use tether_e2e::stack::rank_args;
use tether_e2e::{Connection, Envoy, HttpClient, Request, Stack, StackSpec};
use tether_envoy::{GatewaySpec, Mode, Timeouts, render};
use tether_rank::request::parse;
use tether_wire::Api;

#[allow(dead_code)]
#[path = "../gateway-bench/cpu.rs"]
mod cpu;

/// CPU seconds of this process' waited-for children so far (`/proc/self/stat`
/// cutime + cstime, 10 ms ticks).
fn children_cpu_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("bad stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f[13].parse::<f64>()? + f[14].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// A binary next to this one (the release build's `tether`, `tether-rank`).
fn sibling(name: &str) -> Result<PathBuf> {
    let p = std::env::current_exe()?.with_file_name(name);
    if !p.exists() {
        bail!(
            "{} not found: build it (cargo build --release)",
            p.display()
        );
    }
    Ok(p)
}

/// Synthesis of the whole corpus by each `tether` binary, interleaved.
pub fn client(a: &Args, corpus: &Path) -> Result<()> {
    let mut bins = vec![("current", sibling("tether")?)];
    if let Some(b) = &a.tether_before {
        bins.insert(0, ("before", b.clone()));
    }
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); bins.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); bins.len()];
    let mut summary = String::new();
    for _ in 0..a.rounds {
        for (i, (_, bin)) in bins.iter().enumerate() {
            let c0 = children_cpu_s()?;
            let t = Instant::now();
            let out = Command::new(bin)
                .args(["trace", "synth"])
                .arg(corpus)
                .args(["--identity", "claude-code", "--summary"])
                .output()
                .with_context(|| format!("running {}", bin.display()))?;
            if !out.status.success() {
                bail!(
                    "{} trace synth: {}",
                    bin.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            wall[i].push(t.elapsed().as_secs_f64());
            cpu[i].push(children_cpu_s()? - c0);
            summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        }
    }
    // "N requests, X MB of bodies in …"
    let requests: f64 = summary
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("no request count in the summary")?;
    println!("client: `tether trace synth CORPUS --identity claude-code --summary` ({summary})");
    for (i, (name, bin)) in bins.iter().enumerate() {
        let (w, c) = (median(wall[i].clone()), median(cpu[i].clone()));
        println!(
            "  {name:<8} {:>6.2} s wall, {:>6.2} s CPU: {:>5.2} ms CPU per request  ({})",
            w,
            c,
            c * 1e3 / requests,
            bin.display()
        );
    }
    if bins.len() == 2 {
        let pairs: Vec<f64> = wall[0].iter().zip(&wall[1]).map(|(b, c)| b / c).collect();
        println!(
            "  current is {:.2}x faster (median of per-round wall ratios)",
            median(pairs)
        );
    }
    Ok(())
}

/// The rank's reading of each body in process (`tether_rank::request::parse`:
/// JSON, the simulated tokenizer, the field checks), for its share of the
/// rank's CPU per request.
pub fn read(a: &Args, bodies: &[Body]) -> Result<()> {
    let mut ms = Vec::new();
    let mut tokens = 0usize;
    for _ in 0..a.rounds {
        for b in bodies {
            let api = Api::from_path(b.path.as_bytes()).context("unknown path")?;
            let start = Instant::now();
            let p = parse(api, &b.bytes).map_err(|r| anyhow::anyhow!("{}", r.message))?;
            ms.push(start.elapsed().as_secs_f64() * 1e3);
            tokens = tokens.max(p.tokens.len());
        }
    }
    let mb = bodies.iter().map(|b| b.bytes.len()).sum::<usize>() as f64 / 1e6 / bodies.len() as f64;
    let m = median(ms);
    println!(
        "rank reading (tether_rank::request::parse in process, one thread: wall = CPU): {m:.2} ms per body (mean {mb:.2} MB, up to {tokens} tokens; {:.0} MB/s)",
        mb / m * 1e3
    );
    Ok(())
}

/// A `tether-rank` process, killed on drop.
struct Rank {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The rank arguments of resident-bench's corpus replay, at a speedup that
/// makes simulated time vanish (what is timed is the body's handling).
fn rank_flags() -> Vec<String> {
    let profile = root().join("examples/profiles/qwen3-coder-next-fp8-h200-tp1.json");
    let mut args = rank_args(1e6, "retention-host", 1_600_000, 146.48);
    if let Some(i) = args.iter().position(|x| x == "--profile") {
        args[i + 1] = profile.display().to_string();
    }
    args.extend(["--threads".into(), "1".into()]);
    args
}

fn start_rank(bin: &Path) -> Result<Rank> {
    use std::io::BufRead;
    let mut child = Command::new(bin)
        .args(["--listen", "127.0.0.1:0"])
        .args(rank_flags())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix("READY ")
        .with_context(|| format!("{}: no READY line", bin.display()))?
        .parse()?;
    Ok(Rank { child, addr })
}

/// `bytes` with its first `"max_tokens":N` set to 1: the answer's decode
/// steps are not what is timed.
fn one_token(bytes: &[u8]) -> Vec<u8> {
    let key = b"\"max_tokens\":";
    let Some(at) = bytes.windows(key.len()).position(|w| w == key) else {
        return bytes.to_vec();
    };
    let digits = bytes[at + key.len()..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let mut out = bytes[..at + key.len()].to_vec();
    out.push(b'1');
    out.extend_from_slice(&bytes[at + key.len() + digits..]);
    out
}

/// Where one variant's requests go and which processes serve them.
struct Variant {
    name: &'static str,
    addr: SocketAddr,
    /// Send the identity header (Envoy's header path) or not (its body path).
    identity: bool,
    /// The processes serving it, by name.
    pids: Vec<(&'static str, u32)>,
    /// Per request, in the order sent (the same bodies in every variant).
    wall_ms: Vec<f64>,
    /// Per process of `pids`.
    cpu_ns: Vec<u64>,
}

fn envoy_for(rank: &Rank) -> Result<Envoy> {
    let wasm = tether_e2e::paths::require_filter_wasm()?;
    let yaml = render(&GatewaySpec {
        mode: Mode::Pick,
        ranks: vec![rank.addr],
        dp_size: 1,
        plugin_config: serde_json::Map::new(),
        filter_wasm: wasm.display().to_string(),
        listen: "127.0.0.1:0".parse()?,
        admin: "127.0.0.1:0".parse()?,
        retries: 0,
        hash_balance_factor: None,
        rank_names: Vec::new(),
        timeouts: Timeouts::default(),
        eject_after: 5,
        eject_for_s: 30,
    })?;
    Ok(Envoy::builder()
        .concurrency(1)
        .log_level("warning")
        .start(&yaml)?)
}

/// CPU nanoseconds of each of `pids` once they are idle: read every 5 ms
/// until two readings agree (at most 0.5 s).
async fn settled(pids: &[(&str, u32)]) -> Vec<u64> {
    let read = || -> Vec<u64> {
        pids.iter()
            .map(|&(_, p)| cpu::process_ns(p).unwrap_or(0))
            .collect()
    };
    let mut last = read();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = read();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// One request of `b` to `v` on `conn`, timed, with the CPU of `v`'s processes.
async fn exchange(conn: &mut Connection, v: &mut Variant, b: &Body, body: &[u8]) -> Result<()> {
    let mut req = Request::post_bytes(b.path, "application/json", body.to_vec());
    for (k, val) in &b.headers {
        let identity = k.starts_with("x-claude-code-");
        if k != "content-type" && (v.identity || !identity) {
            req = req.header(k, val);
        }
    }
    let cpu0 = settled(&v.pids).await;
    let t = Instant::now();
    let resp = conn.send(req).await?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    // A rank finishes a request after its answer (the engine's last step,
    // freeing the prompt's buffers): wait for that work to show here rather
    // than in the next request's window.
    let cpu1 = settled(&v.pids).await;
    if resp.status != 200 {
        bail!("{}: status {}", v.name, resp.status);
    }
    v.wall_ms.push(ms);
    for (i, (a, b)) in cpu0.iter().zip(&cpu1).enumerate() {
        v.cpu_ns[i] += b.saturating_sub(*a);
    }
    Ok(())
}

/// One request at a time per body: to a before rank (if given), the current
/// rank, and through Envoy to the current rank on the header and the body
/// path; all interleaved body by body.
pub fn exchanges(a: &Args, bodies: &[Body], skip: &[&str]) -> Result<()> {
    let current = start_rank(&sibling("tether-rank")?)?;
    let before = match &a.rank_before {
        Some(p) if !skip.contains(&"rank") => Some(start_rank(p)?),
        _ => None,
    };
    let envoy = if skip.contains(&"envoy") {
        None
    } else {
        Some(envoy_for(&current)?)
    };
    let mut vs = Vec::new();
    let mut add = |name, addr, identity, pids: Vec<(&'static str, u32)>| {
        vs.push(Variant {
            name,
            addr,
            identity,
            cpu_ns: vec![0; pids.len()],
            pids,
            wall_ms: Vec::new(),
        });
    };
    if let Some(r) = &before {
        add("rank, before", r.addr, true, vec![("rank", r.child.id())]);
    }
    let rank_pid = ("rank", current.child.id());
    add("rank", current.addr, true, vec![rank_pid]);
    if let Some(e) = &envoy {
        let pids = vec![("Envoy", e.pid()), rank_pid];
        add("Envoy header path", e.listen_addr(), true, pids.clone());
        add("Envoy body path", e.listen_addr(), false, pids);
    }
    let bodies1: Vec<Vec<u8>> = bodies.iter().map(|b| one_token(&b.bytes)).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = HttpClient::new().timeout(Duration::from_secs(60));
        let mut conns = Vec::new();
        for v in &vs {
            conns.push(client.connect(v.addr).await?);
        }
        // Round 0 warms every cache (the rank's prefix cache included) and is not counted.
        for round in 0..=a.rounds {
            for (b, body) in bodies.iter().zip(&bodies1) {
                for (v, conn) in vs.iter_mut().zip(conns.iter_mut()) {
                    exchange(conn, v, b, body).await?;
                }
            }
            if round == 0 {
                for v in vs.iter_mut() {
                    v.wall_ms.clear();
                    v.cpu_ns.iter_mut().for_each(|c| *c = 0);
                }
            }
        }
        anyhow::Ok(())
    })?;
    report(&vs);
    Ok(())
}

fn report(vs: &[Variant]) {
    println!(
        "one request at a time (each body once per round, interleaved; ranks at --speedup 1e6 and max_tokens 1, so the simulated engine takes ~0 wall time; Envoy 1 worker, pick mode, no load polls): wall per request (client side, the median and the median of per-request differences to the rank alone) and CPU per request of each process serving it"
    );
    let base = vs.iter().find(|v| v.name == "rank");
    for v in vs {
        let w = median(v.wall_ms.clone());
        let over = base.map_or(String::new(), |b| {
            let d = v.wall_ms.iter().zip(&b.wall_ms).map(|(x, y)| x - y);
            format!(" ({:+.2} ms)", median(d.collect()))
        });
        let n = v.wall_ms.len().max(1) as f64;
        let cpu: Vec<String> = v
            .pids
            .iter()
            .zip(&v.cpu_ns)
            .map(|((name, _), ns)| format!("{name} {:.2} ms", *ns as f64 / 1e6 / n))
            .collect();
        println!(
            "  {:<18} {w:>6.2} ms wall{over}; CPU: {}",
            v.name,
            cpu.join(", ")
        );
    }
}

/// An idle gateway's load polls: Envoy with the filter's `load` (and
/// residency) polling 8 ranks, nothing sent, CPU per second of Envoy and of
/// the ranks, at the poll interval resident-bench uses from 20× on (10 ms) and
/// at the simulations' 200 ms.
pub fn poll() -> Result<()> {
    println!(
        "idle gateway, 8 ranks, pick + load + residency, Envoy 2 workers: CPU per second of wall time"
    );
    for poll_ms in [10u64, 200] {
        let mut spec = StackSpec::new(8, Mode::Pick, &[]);
        spec.rank_args = rank_flags();
        spec.concurrency = 2;
        let cfg =
            json!({"load": {"poll_ms": poll_ms}, "residency": {}, "outputs": ["pick", "retain"]});
        if let serde_json::Value::Object(m) = cfg {
            spec.plugin_config = m;
        }
        let stack = Stack::start(&spec)?;
        std::thread::sleep(Duration::from_secs(2));
        let pids: Vec<u32> = stack.ranks.iter().map(|r| r.pid()).collect();
        let sum = |ps: &[u32]| ps.iter().filter_map(|&p| cpu::process_ns(p)).sum::<u64>();
        let (e0, r0, t) = (
            cpu::process_ns(stack.envoy.pid()),
            sum(&pids),
            Instant::now(),
        );
        std::thread::sleep(Duration::from_secs(5));
        let (e1, r1) = (cpu::process_ns(stack.envoy.pid()), sum(&pids));
        let s = t.elapsed().as_secs_f64();
        let envoy = e1
            .zip(e0)
            .map_or(f64::NAN, |(b, a)| (b - a) as f64 / 1e9 / s);
        println!(
            "  poll every {poll_ms:>3} ms: Envoy {:>5.1} % of a core, the 8 ranks {:>5.1} %",
            envoy * 100.0,
            (r1 - r0) as f64 / 1e9 / s * 100.0
        );
    }
    Ok(())
}
