//! `tether gateway`: a ready Envoy bootstrap (the tether filter in front of
//! the given ranks) written to a file, optionally validated by Envoy or run.

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use tether_envoy::{GatewaySpec, Mode, render};

/// `tether gateway`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// The ranks, `ip:port` (comma-separated, or repeat the flag).
    #[arg(long, required = true, value_delimiter = ',')]
    pub ranks: Vec<SocketAddr>,
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
    /// The filter module.
    #[arg(
        long,
        default_value = "target/wasm32-wasip1/wasm-release/tether_filter.wasm"
    )]
    pub filter_wasm: PathBuf,
    /// Upstream attempts after a failed connection (pick mode: on the fallback endpoints).
    #[arg(long, default_value_t = 2)]
    pub retries: u32,
    /// MAGLEV `hash_balance_factor` in hash mode (bounded load; 150 = 1.5× the mean).
    #[arg(long)]
    pub hash_balance_factor: Option<u32>,
    /// Where the bootstrap is written.
    #[arg(long, default_value = "tether-envoy.yaml")]
    pub output: PathBuf,
    /// Check the bootstrap with `envoy --mode validate`.
    #[arg(long)]
    pub validate: bool,
    /// Then run Envoy on it (this process becomes Envoy).
    #[arg(long)]
    pub start: bool,
    /// The Envoy binary (default: `$TETHER_ENVOY`, else `.venv/bin/envoy`, else `envoy` on PATH).
    #[arg(long)]
    pub envoy: Option<PathBuf>,
    /// Envoy worker threads (`--concurrency`) when started.
    #[arg(long, default_value_t = 1)]
    pub concurrency: u32,
}

/// The Envoy binary to use.
pub fn envoy_bin(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(v) = std::env::var_os("TETHER_ENVOY").filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    let venv = PathBuf::from(".venv/bin/envoy");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("envoy")
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
                "running {} (install it with `make envoy-install`)",
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
    let plugin_config = match &a.plugin_config {
        Some(p) => read_plugin_config(p)?,
        None => Default::default(),
    };
    if !a.filter_wasm.is_file() {
        eprintln!(
            "warning: --filter-wasm {} does not exist yet (build it with `make wasm`)",
            a.filter_wasm.display()
        );
    }
    let wasm = std::fs::canonicalize(&a.filter_wasm).unwrap_or_else(|_| a.filter_wasm.clone());
    let spec = GatewaySpec {
        mode: a.mode,
        ranks: a.ranks.clone(),
        dp_size: a.dp_size,
        plugin_config,
        filter_wasm: wasm.display().to_string(),
        listen: a.listen,
        admin: a.admin,
        retries: a.retries,
        hash_balance_factor: a.hash_balance_factor,
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
    if a.validate || a.start {
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
        cmd.args(["--concurrency", &a.concurrency.to_string(), "-c"])
            .arg(&a.output);
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
