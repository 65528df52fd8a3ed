//! `tether-oci`: writes the filter module as an OCI image layout in Istio's
//! Wasm image format (`make oci`; docs/gateway.md, "Deploying").

use std::path::PathBuf;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: tether-oci --wasm FILE --out DIR [--tag TAG]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut wasm, mut out, mut tag) = (None, None, env!("CARGO_PKG_VERSION").to_owned());
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--wasm", Some(v)) => wasm = Some(PathBuf::from(v)),
            ("--out", Some(v)) => out = Some(PathBuf::from(v)),
            ("--tag", Some(v)) => tag = v,
            _ => return usage(),
        }
    }
    let (Some(wasm), Some(out)) = (wasm, out) else {
        return usage();
    };
    let module = match std::fs::read(&wasm) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("--wasm {}: {e} (build it with `make wasm`)", wasm.display());
            return ExitCode::FAILURE;
        }
    };
    match tether_envoy::oci::Layout::wasm_plugin(&module, &tag).and_then(|l| {
        l.write(&out)?;
        Ok(l)
    }) {
        Ok(l) => {
            for m in l.index()["manifests"].as_array().into_iter().flatten() {
                println!(
                    "{}:{}  {}",
                    out.display(),
                    m["annotations"][tether_envoy::oci::REF_NAME]
                        .as_str()
                        .unwrap_or_default(),
                    m["digest"].as_str().unwrap_or_default()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tether-oci: {e}");
            ExitCode::FAILURE
        }
    }
}
