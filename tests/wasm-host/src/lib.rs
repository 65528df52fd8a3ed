//! A proxy-wasm (ABI 0.2.1) host on wasmtime for HTTP filters: load any
//! proxy-wasm module exactly as Envoy does, in-process, fast and deterministic.
//!
//! ```no_run
//! use tether_wasm_host::{HostOptions, Plugin, Request};
//! let plugin = Plugin::from_file("filter.wasm")?; // compile once
//! let mut vm = plugin.start(HostOptions { plugin_config: br#"{"mode":"header"}"#.to_vec(), ..Default::default() })?;
//! let outcome = vm.run(&Request::post("/v1/chat/completions", &[("x-session-id", "s1")], &[b"{}"]))?;
//! println!("{}", serde_json::to_string_pretty(&outcome).unwrap());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! All state lives in the wasmtime `Store` (no globals); guest memory is only
//! touched through bounds-checked copies; host calls never re-enter the guest
//! except through its allocator (callbacks they cause are queued and run after
//! the current callback, as in Envoy). A trap or panic in the module is a
//! [`HostError`] carrying the module's own message. See `docs/wasm-host.md`.

pub mod abi;
mod error;
pub mod exchange;
pub mod filter_state;
mod guest_memory;
pub mod header_map;
mod hostcalls;
mod plugin;
pub mod properties;
pub mod state;
mod vm;
mod wasi;

pub use abi::{Action, LogLevel, Status};
pub use error::HostError;
pub use exchange::{Downstream, Outcome, Request, RequestDescription, Upstream, UpstreamResponse};
pub use filter_state::FilterStateEntry;
pub use header_map::HeaderMap;
pub use plugin::Plugin;
pub use state::{HostOptions, HostState, HttpCallResponse, LocalResponse};
pub use vm::FilterVm;
pub use wasi::ProcExit;

/// Finds a module built by `make wasm`: the env var if set, else the default
/// path under the workspace `target/`. The error says how to build it.
pub fn module_path(env_var: &str, file_name: &str) -> Result<std::path::PathBuf, String> {
    let path = match std::env::var_os(env_var) {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/wasm32-wasip1/wasm-release")
            .join(file_name),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found (set {env_var} or run `make wasm` from the repository root)",
            path.display()
        ))
    }
}
