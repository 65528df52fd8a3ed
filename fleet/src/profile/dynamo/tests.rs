//! NPZ fixtures written byte by byte from the published layout (numpy's
//! `.npy` v1.0 format inside a stored zip, as `numpy.savez` writes them), so
//! the reader is checked against the format, not against its own library's
//! writer.

use super::*;
use std::io::Write;

/// A `.npy` v1.0 file of a one-dimensional array.
fn npy(descr: &str, n: usize, data: &[u8]) -> Vec<u8> {
    npy_shaped(descr, &format!("({n},)"), data)
}

/// A `.npy` v1.0 file of any shape (`"(1, 1)"`).
fn npy_shaped(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // numpy pads with spaces so that magic (6) + version (2) + length (2) + header is a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn f8(v: &[f64]) -> Vec<u8> {
    npy(
        "<f8",
        v.len(),
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
}

fn i8(v: &[i64]) -> Vec<u8> {
    npy(
        "<i8",
        v.len(),
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
}

/// An `.npz`: the arrays as `NAME.npy` entries of a stored (uncompressed) zip.
pub(crate) fn npz(path: &Path, arrays: &[(&str, Vec<u8>)]) {
    let f = std::fs::File::create(path).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let opts =
        zip::write::FileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in arrays {
        z.start_file(format!("{name}.npy"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

fn llama() -> Profile {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"
    );
    Profile::from_file(Path::new(p)).unwrap()
}

/// Dynamo's two files describing the same engine as a tether profile.
pub(crate) fn write_pair(dir: &Path, p: &Profile) {
    let pre = p.prefill_ttft_ms.points();
    let isl: Vec<i64> = pre.iter().map(|(x, _)| *x as i64).collect();
    let ttft: Vec<f64> = pre.iter().map(|(_, y)| *y).collect();
    let thpt: Vec<f64> = pre
        .iter()
        .map(|(x, y)| x / (y / 1000.0) / f64::from(p.gpus_per_engine))
        .collect();
    npz(
        &dir.join("prefill.npz"),
        &[
            ("prefill_isl", i8(&isl)),
            ("prefill_ttft", f8(&ttft)),
            ("prefill_thpt_per_gpu", f8(&thpt)),
        ],
    );
    let (mut x, mut y, mut z, mut t) = (vec![], vec![], vec![], vec![]);
    for (c, curve) in p.decode_itl_ms.curves() {
        for (b, itl) in curve.points() {
            x.push(c * b / p.max_kv_tokens as f64);
            y.push(*c);
            z.push(*itl);
            t.push(b * 1000.0 / itl / f64::from(p.gpus_per_engine));
        }
    }
    npz(
        &dir.join("decode.npz"),
        &[
            ("x_kv_usage", f8(&x)),
            ("y_context_length", f8(&y)),
            ("z_itl", f8(&z)),
            ("z_thpt_per_gpu", f8(&t)),
            ("max_kv_tokens", i8(&[p.max_kv_tokens as i64])),
        ],
    );
}

const META: &str = r#"{"dynamo": {"prefill": "prefill.npz", "decode": "decode.npz"},
  "name": "llama-dynamo", "model": "nvidia/Llama-3.1-8B-Instruct-FP8", "gpu": "H200",
  "gpu_hour_usd": 3.5, "kv_bytes_per_token": 131072, "host_restore_gbps": 50.0}"#;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tether-dynamo-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn dynamo_output_reads_as_the_profile_it_was_measured_from() {
    let dir = tmp("same");
    let json = llama();
    write_pair(&dir, &json);
    let p = from_json(META, &dir).unwrap();
    assert_eq!(p.max_kv_tokens, json.max_kv_tokens);
    assert_eq!(p.gpus_per_engine, 1, "derived from the throughputs");
    assert_eq!(p.prefill_ttft_ms, json.prefill_ttft_ms);
    for b in [1.0, 30.0, 100.0, 200.0] {
        for c in [1024.0, 3075.0, 5000.0, 20000.0] {
            let (a, e) = (
                p.decode_itl_ms.itl_ms(b, c),
                json.decode_itl_ms.itl_ms(b, c),
            );
            assert!((a - e).abs() < 1e-9, "b {b} c {c}: {a} vs {e}");
        }
    }
    assert!(p.sources.last().unwrap().contains("Dynamo"));
    // Through the loader, with the paths relative to the JSON file.
    std::fs::write(dir.join("p.json"), META).unwrap();
    assert_eq!(
        crate::profile::load(&dir.join("p.json"))
            .unwrap()
            .decode_itl_ms,
        p.decode_itl_ms
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_missing_curve_or_bad_value_is_named() {
    let dir = tmp("bad");
    let json = llama();
    write_pair(&dir, &json);
    // Decode file without z_itl.
    npz(
        &dir.join("decode.npz"),
        &[
            ("x_kv_usage", f8(&[0.1])),
            ("y_context_length", f8(&[1000.0])),
            ("z_thpt_per_gpu", f8(&[100.0])),
            ("max_kv_tokens", i8(&[100_000])),
        ],
    );
    let e = from_json(META, &dir).unwrap_err().to_string();
    assert!(e.contains("decode.z_itl") && e.contains("missing"), "{e}");
    // Mismatched lengths, a negative TTFT, a 2-D array, a string dtype.
    npz(
        &dir.join("prefill.npz"),
        &[
            ("prefill_isl", i8(&[100, 200])),
            ("prefill_ttft", f8(&[1.0])),
            ("prefill_thpt_per_gpu", f8(&[1.0, 2.0])),
        ],
    );
    let e = from_json(META, &dir).unwrap_err().to_string();
    assert!(e.contains("prefill_ttft") && e.contains("1 values"), "{e}");
    npz(
        &dir.join("prefill.npz"),
        &[
            ("prefill_isl", i8(&[100])),
            ("prefill_ttft", f8(&[-1.0])),
            ("prefill_thpt_per_gpu", f8(&[1.0])),
        ],
    );
    let e = from_json(META, &dir).unwrap_err().to_string();
    assert!(e.contains("prefill.prefill_ttft[0]"), "{e}");
    let two_d = npy_shaped("<f8", "(1, 1)", &1.0f64.to_le_bytes());
    npz(
        &dir.join("prefill.npz"),
        &[
            ("prefill_isl", two_d),
            ("prefill_ttft", f8(&[1.0])),
            ("prefill_thpt_per_gpu", f8(&[1.0])),
        ],
    );
    assert!(
        from_json(META, &dir)
            .unwrap_err()
            .to_string()
            .contains("one-dimensional")
    );
    npz(
        &dir.join("prefill.npz"),
        &[
            ("prefill_isl", npy("<U3", 1, b"a\0\0\0b\0\0\0c\0\0\0")),
            ("prefill_ttft", f8(&[1.0])),
            ("prefill_thpt_per_gpu", f8(&[1.0])),
        ],
    );
    assert!(
        from_json(META, &dir)
            .unwrap_err()
            .to_string()
            .contains("dtype")
    );
    // Not a zip at all, a missing file, a missing metadata field.
    std::fs::write(dir.join("prefill.npz"), b"not a zip").unwrap();
    assert!(
        from_json(META, &dir)
            .unwrap_err()
            .to_string()
            .contains("prefill NPZ")
    );
    std::fs::remove_file(dir.join("prefill.npz")).unwrap();
    assert!(from_json(META, &dir).is_err());
    let e = from_json(r#"{"dynamo": {"prefill": "a", "decode": "b"}}"#, &dir)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing field"), "{e}");
    // A bare NPZ is refused with what to do.
    let e = crate::profile::load(&dir.join("decode.npz"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("dynamo") && e.contains("docs/profile.md"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gpus_per_engine_follow_from_throughput_or_must_be_given() {
    let dir = tmp("tp");
    let mut json = llama();
    json.gpus_per_engine = 4;
    write_pair(&dir, &json);
    assert_eq!(from_json(META, &dir).unwrap().gpus_per_engine, 4);
    let meta = META.replace(
        "\"gpu_hour_usd\"",
        "\"gpus_per_engine\": 2, \"gpu_hour_usd\"",
    );
    assert_eq!(from_json(&meta, &dir).unwrap().gpus_per_engine, 2);
    let mut est = vec![2.5, 2.5, 2.5];
    assert!(
        derive_gpus(&mut est)
            .unwrap_err()
            .to_string()
            .contains("whole number")
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The committed example (`examples/profiles/dynamo/`) is what this writer
/// produces from the shipped Llama profile; `TETHER_WRITE_FIXTURES=1` rewrites it.
#[test]
fn the_shipped_dynamo_example_is_reproducible() {
    let dir = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/profiles/dynamo"
    ));
    let fresh = tmp("fixture");
    write_pair(&fresh, &llama());
    if std::env::var_os("TETHER_WRITE_FIXTURES").is_some() {
        std::fs::create_dir_all(dir).unwrap();
        for f in ["prefill.npz", "decode.npz"] {
            std::fs::copy(fresh.join(f), dir.join(f)).unwrap();
        }
    }
    for f in ["prefill.npz", "decode.npz"] {
        // Zip entries carry a timestamp: compare the arrays, not the bytes.
        let read = |p: &Path| {
            let mut z = NpzArchive::open(p).unwrap();
            let names: Vec<String> = z.array_names().map(String::from).collect();
            let mut out = Vec::new();
            for n in names {
                let npy = z.by_name(&n).unwrap().unwrap();
                out.push((n, npy.dtype().descr(), npy.shape().to_vec()));
            }
            out.sort();
            out
        };
        assert_eq!(read(&fresh.join(f)), read(&dir.join(f)));
    }
    let p = crate::profile::load(&dir.join("llama-3.1-8b-fp8-h200-tp1.dynamo.json")).unwrap();
    assert_eq!(p.decode_itl_ms, llama().decode_itl_ms);
    std::fs::remove_dir_all(&fresh).ok();
}
