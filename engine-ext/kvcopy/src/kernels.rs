//! The CUDA C kernel sources (embedded from `kernels/*.cu`) and their NVRTC compilation to PTX.

use crate::CopyError;
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx, compile_ptx_with_opts};

/// One `kernels/*.cu` file and the `extern "C"` entry points it must export.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// File name under `kernels/`.
    pub file: &'static str,
    /// CUDA C source text.
    pub source: &'static str,
    /// Kernels the backend loads from it.
    pub entry_points: &'static [&'static str],
}

/// Entry point names of the gather and scatter kernels.
pub const KERNEL_ENTRY_POINTS: [&str; 2] = [GATHER_KERNEL, SCATTER_KERNEL];
pub(crate) const GATHER_KERNEL: &str = "tether_kv_gather";
pub(crate) const SCATTER_KERNEL: &str = "tether_kv_scatter";

/// Every kernel source file, embedded at build time so binaries carry their kernels.
pub const KERNEL_SOURCES: &[KernelSource] = &[KernelSource {
    file: "kv_copy.cu",
    source: include_str!("../../../kernels/kv_copy.cu"),
    entry_points: &KERNEL_ENTRY_POINTS,
}];

/// True when an NVRTC library can be loaded (NVRTC calls panic inside `cudarc` without it).
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the NVRTC library; calls no NVRTC function.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles one source to PTX for `arch` (a virtual architecture such as `compute_90`).
///
/// Fails with [`CopyError::Compile`] (never panics) when no NVRTC library can be loaded.
pub fn compile_kernels_ptx(kernel: &KernelSource, arch: &str) -> Result<String, CopyError> {
    if !nvrtc_present() {
        return Err(CopyError::Compile(
            "no NVRTC library found (libnvrtc.so.12 on LD_LIBRARY_PATH; `make nvrtc` installs one)"
                .into(),
        ));
    }
    let opts = CompileOptions {
        name: Some(kernel.file.to_string()),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..Default::default()
    };
    let ptx: Ptx = compile_ptx_with_opts(kernel.source, opts).map_err(|e| match e {
        CompileError::CompileError { log, options, .. } => CopyError::Compile(format!(
            "{} ({}): {}",
            kernel.file,
            options.join(" "),
            log.to_string_lossy()
        )),
        other => CopyError::Compile(format!("{}: {other}", kernel.file)),
    })?;
    Ok(ptx.to_src())
}
