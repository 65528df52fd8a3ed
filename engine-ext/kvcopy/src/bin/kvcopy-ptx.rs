//! Compiles every `kernels/*.cu` to PTX with NVRTC and checks the expected entry points.
//!
//! Usage: `kvcopy-ptx [KERNELS_DIR] [--arch compute_90] [--out DIR]`.
//! Needs a loadable `libnvrtc.so.12` (`make nvrtc` installs the PyPI wheel into `.venv`;
//! `make test-kernels` sets `LD_LIBRARY_PATH` to it); no GPU. Any compile error exits
//! non-zero, so a kernel that does not compile fails CI.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use tether_kvcopy::{KERNEL_SOURCES, KernelSource, compile_kernels_ptx};

fn main() -> Result<()> {
    let mut dir = PathBuf::from("kernels");
    let mut arch = "compute_90".to_string();
    let mut out: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--arch" => arch = args.next().context("--arch needs a value")?,
            "--out" => out = Some(args.next().context("--out needs a value")?.into()),
            _ => dir = PathBuf::from(arg),
        }
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no .cu files in {}", dir.display());
    }
    let mut failures = 0;
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("non-UTF-8 file name")?;
        let source =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let known = KERNEL_SOURCES.iter().find(|k| k.file == name);
        if let Some(k) = known
            && k.source != source
        {
            println!("FAIL {name}: differs from the source embedded in this binary (rebuild it)");
            failures += 1;
            continue;
        }
        // KernelSource describes embedded sources (`&'static str`); this one-shot CLI leaks
        // the few files it reads to fit that shape.
        let kernel = KernelSource {
            file: Box::leak(name.to_string().into_boxed_str()),
            source: Box::leak(source.into_boxed_str()),
            entry_points: known.map_or(&[], |k| k.entry_points),
        };
        match compile_kernels_ptx(&kernel, &arch) {
            Ok(ptx) => {
                let missing: Vec<_> = kernel
                    .entry_points
                    .iter()
                    .filter(|e| !ptx.contains(&format!(".entry {e}(")))
                    .collect();
                if !missing.is_empty() {
                    println!("FAIL {name}: PTX lacks entry points {missing:?}");
                    failures += 1;
                    continue;
                }
                if let Some(out) = &out {
                    std::fs::create_dir_all(out)?;
                    let file = out.join(name.replace(".cu", ".ptx"));
                    std::fs::write(&file, &ptx)
                        .with_context(|| format!("writing {}", file.display()))?;
                }
                println!(
                    "ok   {name}: {} bytes of PTX for {arch}, entry points {:?}",
                    ptx.len(),
                    kernel.entry_points
                );
            }
            Err(e) => {
                println!("FAIL {e}");
                failures += 1;
            }
        }
    }
    if failures > 0 {
        bail!("{failures} of {} kernel files failed", files.len());
    }
    Ok(())
}
