//! `tether-wasm-host`: dry-run any proxy-wasm HTTP filter against a request.
//!
//! Loads the module as Envoy would, configures it with the plugin
//! configuration, sends the described request through it and prints what
//! would go upstream (headers, body), the filter state it set, a local
//! response, logs and metrics, as JSON. Exit status 0 when the exchange ran
//! (even if the filter stalled it), 1 when the module failed or trapped.

use anyhow::{Context, Result};
use clap::Parser;
use std::path::PathBuf;
use tether_wasm_host::{HostOptions, LogLevel, Plugin, RequestDescription};

#[derive(Parser, Debug)]
#[command(
    name = "tether-wasm-host",
    version,
    about = "Dry-run a proxy-wasm HTTP filter against a request, print the outcome as JSON"
)]
struct Args {
    /// The filter module (.wasm).
    #[arg(long)]
    module: PathBuf,
    /// Plugin configuration file (bytes handed to proxy_on_configure).
    #[arg(long, conflicts_with = "config_json")]
    config: Option<PathBuf>,
    /// Plugin configuration given inline.
    #[arg(long)]
    config_json: Option<String>,
    /// VM configuration file (bytes handed to proxy_on_vm_start).
    #[arg(long)]
    vm_config: Option<PathBuf>,
    /// Request description (JSON; see docs/wasm-host.md). `-` reads stdin.
    #[arg(long)]
    request: PathBuf,
    /// Level the module sees from proxy_get_log_level.
    #[arg(long, default_value = "info", value_parser = parse_level)]
    log_level: LogLevel,
    /// Filter-state keys set_envoy_filter_state accepts (repeatable; default: Envoy's three tether uses).
    #[arg(long = "accept-filter-state-key")]
    accepted_keys: Vec<String>,
    /// Instruction budget (wasmtime fuel) per callback.
    #[arg(long)]
    fuel: Option<u64>,
    /// Send the same request this many times through one VM (sessions, counters).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
}

fn parse_level(s: &str) -> Result<LogLevel, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("unknown log level {s:?}"))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let plugin_config = match (&args.config, &args.config_json) {
        (Some(path), _) => {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?
        }
        (None, Some(json)) => json.clone().into_bytes(),
        (None, None) => Vec::new(),
    };
    let vm_config = match &args.vm_config {
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        None => Vec::new(),
    };
    let (raw, base) = if args.request.as_os_str() == "-" {
        (
            std::io::read_to_string(std::io::stdin()).context("reading stdin")?,
            PathBuf::from("."),
        )
    } else {
        let text = std::fs::read_to_string(&args.request)
            .with_context(|| format!("reading {}", args.request.display()))?;
        (
            text,
            args.request.parent().map(PathBuf::from).unwrap_or_default(),
        )
    };
    let description: RequestDescription =
        serde_json::from_str(&raw).context("parsing the request description")?;
    let request = description.into_request(&base)?;

    let mut options = HostOptions {
        plugin_config,
        vm_config,
        log_level: args.log_level,
        fuel_per_callback: args.fuel,
        ..HostOptions::default()
    };
    if !args.accepted_keys.is_empty() {
        options.accepted_filter_state_keys = args.accepted_keys.clone();
    }
    let plugin = Plugin::from_file(&args.module)?;
    let mut vm = plugin.start(options)?;
    let mut outcomes = Vec::new();
    for _ in 0..args.repeat {
        outcomes.push(vm.run(&request)?);
    }
    let json = if outcomes.len() == 1 {
        serde_json::to_string_pretty(&outcomes[0])?
    } else {
        serde_json::to_string_pretty(&outcomes)?
    };
    println!("{json}");
    Ok(())
}
