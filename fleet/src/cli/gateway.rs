//! `tether gateway`: a ready Envoy bootstrap (the tether filter in front of
//! the given ranks) written to a file, optionally validated by Envoy or run.

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use tether_envoy::{GatewaySpec, Mode, Timeouts, render};

/// Parses `ip:port` or `name=ip:port`.
fn parse_rank(s: &str) -> Result<(Option<String>, SocketAddr), String> {
    let (name, addr) = match s.split_once('=') {
        Some((n, a)) => (Some(n.to_owned()), a),
        None => (None, s),
    };
    let addr = addr
        .parse()
        .map_err(|_| format!("{addr:?} is not ip:port (a rank is ip:port or name=ip:port)"))?;
    Ok((name, addr))
}

/// `tether gateway`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The ranks, `ip:port` or `name=ip:port` (comma-separated, or repeat the
    /// flag); a name is the rank's stable identity for placement.
    #[arg(long, required = true, value_delimiter = ',', value_parser = parse_rank)]
    pub ranks: Vec<(Option<String>, SocketAddr)>,
    /// `pick` (the filter picks endpoint + DP rank), `hash` (Envoy's MAGLEV with
    /// bounded load on the filter's key) or `round-robin` (the baseline).
    #[arg(long, default_value = "pick", value_parser = Mode::parse)]
    pub mode: Mode,
    /// The filter's plugin configuration (JSON, docs/gateway.md) without `mode`
    /// and `endpoints`, which come from --mode and --ranks.
    #[arg(long)]
    pub plugin_config: Option<PathBuf>,
    /// Data-parallel ranks behind each address (`tether-rank --dp-size`, vLLM `--data-parallel-size`).
    #[arg(long, default_value_t = 1)]
    pub dp_size: u32,
    /// Where Envoy listens.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Envoy's admin address.
    #[arg(long, default_value = "127.0.0.1:9901")]
    pub admin: SocketAddr,
    /// The filter module (default: `$TETHER_FILTER_WASM`, else the module `make
    /// wasm` builds in the checkout this `tether` binary was built in, else
    /// that path under the current directory).
    #[arg(long)]
    pub filter_wasm: Option<PathBuf>,
    /// Upstream attempts after a 5xx, a reset or a failed connection (pick
    /// mode: on the fallback endpoints).
    #[arg(long, default_value_t = 2)]
    pub retries: u32,
    /// Seconds a whole request may take (route timeout; 0: none).
    #[arg(long, default_value_t = Timeouts::default().request_s)]
    pub request_timeout: u64,
    /// Seconds without a byte before a stream ends (0: none).
    #[arg(long, default_value_t = Timeouts::default().stream_idle_s)]
    pub stream_idle_timeout: u64,
    /// Seconds one attempt may wait for response headers before the next
    /// endpoint is tried (0: none; only for streamed or short answers).
    #[arg(long, default_value_t = Timeouts::default().attempt_s)]
    pub attempt_timeout: u64,
    /// Consecutive 5xx / resets after which a rank is ejected.
    #[arg(long, default_value_t = 5)]
    pub eject_after: u32,
    /// Seconds an ejected rank stays out.
    #[arg(long, default_value_t = 30)]
    pub eject_for: u64,
    /// MAGLEV `hash_balance_factor` in hash mode (bounded load; 150 = 1.5× the mean).
    #[arg(long)]
    pub hash_balance_factor: Option<u32>,
    /// Where the bootstrap is written.
    #[arg(long, default_value = "tether-envoy.yaml")]
    pub output: PathBuf,
    /// Skip the `envoy --mode validate` check of the bootstrap (on by default).
    #[arg(long)]
    pub no_validate: bool,
    /// Envoy's `--base-id` when started: a second Envoy on one host needs its own.
    #[arg(long)]
    pub base_id: Option<u32>,
    /// Then run Envoy on it (this process becomes Envoy).
    #[arg(long)]
    pub start: bool,
    /// The Envoy binary (default: `$TETHER_ENVOY`, else `.venv/bin/envoy` of the checkout this
    /// binary was built in, else of the current directory, else `envoy` on PATH).
    #[arg(long)]
    pub envoy: Option<PathBuf>,
    /// Envoy worker threads (`--concurrency`) when started.
    #[arg(long, default_value_t = 1)]
    pub concurrency: u32,
}

/// Where `make` puts the filter module, relative to a checkout.
const FILTER_WASM: &str = "target/wasm32-wasip1/wasm-release/tether_filter.wasm";
/// Where `make envoy-install` puts Envoy, relative to a checkout.
const VENV_ENVOY: &str = ".venv/bin/envoy";

/// The checkout this binary was built in (`<root>/target/<profile>/tether`),
/// so the defaults work from any directory.
fn build_root() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let root = exe.parent()?.parent()?.parent()?;
    root.join("Cargo.toml")
        .is_file()
        .then(|| root.to_path_buf())
}

/// The first of `candidates` that exists, else the first (made absolute), and
/// every path looked at, for the message when none exists.
fn resolve(candidates: Vec<PathBuf>) -> (PathBuf, bool, Vec<PathBuf>) {
    let cwd = std::env::current_dir().unwrap_or_default();
    let absolute: Vec<PathBuf> = candidates
        .into_iter()
        .map(|p| if p.is_absolute() { p } else { cwd.join(p) })
        .collect();
    match absolute.iter().find(|p| p.is_file()) {
        Some(p) => (
            std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()),
            true,
            absolute,
        ),
        None => (
            absolute.first().cloned().unwrap_or_default(),
            false,
            absolute,
        ),
    }
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The filter module: `--filter-wasm`, else `$TETHER_FILTER_WASM`, else the
/// build checkout's, else the current directory's (absolute, for the bootstrap).
pub fn filter_wasm(explicit: Option<&Path>) -> (PathBuf, bool, Vec<PathBuf>) {
    let mut c: Vec<PathBuf> = explicit
        .map(Path::to_path_buf)
        .or_else(|| env_path("TETHER_FILTER_WASM"))
        .into_iter()
        .collect();
    if c.is_empty() {
        c.extend(build_root().map(|r| r.join(FILTER_WASM)));
        c.push(PathBuf::from(FILTER_WASM));
    }
    resolve(c)
}

/// The Envoy binary to use: `--envoy`, else `$TETHER_ENVOY`, else the build
/// checkout's `.venv`, else the current directory's, else `envoy` on `PATH`.
pub fn envoy_bin(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit
        .map(Path::to_path_buf)
        .or_else(|| env_path("TETHER_ENVOY"))
    {
        return p;
    }
    let mut c: Vec<PathBuf> = build_root()
        .map(|r| r.join(VENV_ENVOY))
        .into_iter()
        .collect();
    c.push(PathBuf::from(VENV_ENVOY));
    match resolve(c) {
        (p, true, _) => p,
        _ => PathBuf::from("envoy"),
    }
}

/// Reads a plugin configuration file (a JSON object).
pub fn read_plugin_config(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--plugin-config {}: cannot read", path.display()))?;
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => bail!("--plugin-config {}: must be a JSON object", path.display()),
        Err(e) => bail!("--plugin-config {}: {e}", path.display()),
    }
}

/// Runs `envoy --mode validate -c file`.
pub fn validate(envoy: &Path, file: &Path) -> Result<()> {
    let out = Command::new(envoy)
        .args(["--mode", "validate", "-l", "warning", "-c"])
        .arg(file)
        .output()
        .with_context(|| {
            format!(
                "running {} (install it with `make envoy-install`, or name it with --envoy or TETHER_ENVOY)",
                envoy.display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "envoy rejected {}:\n{}{}",
            file.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Runs it.
pub fn run(a: Args) -> Result<()> {
    if a.dp_size == 0 {
        bail!("--dp-size: must be at least 1");
    }
    if !(1..=1000).contains(&a.eject_after) {
        bail!("--eject-after: must be between 1 and 1000");
    }
    if !(1..=3600).contains(&a.eject_for) {
        bail!("--eject-for: must be between 1 and 3600 seconds");
    }
    let plugin_config = match &a.plugin_config {
        Some(p) => read_plugin_config(p)?,
        None => Default::default(),
    };
    let (wasm, found, looked) = filter_wasm(a.filter_wasm.as_deref());
    if !found {
        eprintln!(
            "warning: no filter module at {} (build it with `make wasm`, or name it with --filter-wasm or TETHER_FILTER_WASM); the bootstrap points at {}",
            looked
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" or "),
            wasm.display()
        );
    }
    let spec = GatewaySpec {
        mode: a.mode,
        ranks: a.ranks.iter().map(|(_, r)| *r).collect(),
        dp_size: a.dp_size,
        plugin_config,
        filter_wasm: wasm.display().to_string(),
        listen: a.listen,
        admin: a.admin,
        retries: a.retries,
        hash_balance_factor: a.hash_balance_factor,
        rank_names: a.ranks.iter().map(|(n, _)| n.clone()).collect(),
        timeouts: Timeouts {
            request_s: a.request_timeout,
            stream_idle_s: a.stream_idle_timeout,
            attempt_s: a.attempt_timeout,
        },
        eject_after: a.eject_after,
        eject_for_s: a.eject_for,
    };
    let yaml = render(&spec)?;
    std::fs::write(&a.output, yaml)
        .with_context(|| format!("--output {}: cannot write", a.output.display()))?;
    println!(
        "wrote {} ({} mode, {} ranks; Envoy listens on {}, admin {})",
        a.output.display(),
        a.mode.name(),
        a.ranks.len(),
        a.listen,
        a.admin
    );
    let envoy = envoy_bin(a.envoy.as_deref());
    if !a.no_validate || a.start {
        validate(&envoy, &a.output)?;
        println!("envoy --mode validate: OK");
    }
    if a.start {
        println!(
            "starting {} (replay against http://{})",
            envoy.display(),
            a.listen
        );
        let mut cmd = Command::new(&envoy);
        cmd.args(["--concurrency", &a.concurrency.to_string()]);
        if let Some(id) = a.base_id {
            cmd.args(["--base-id", &id.to_string()]);
        }
        cmd.arg("-c").arg(&a.output);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            let err = cmd.exec();
            bail!("could not run {}: {err}", envoy.display());
        }
        #[cfg(not(unix))]
        {
            let status = cmd
                .status()
                .with_context(|| format!("running {}", envoy.display()))?;
            if !status.success() {
                bail!("envoy exited with {status}");
            }
        }
    }
    Ok(())
}
