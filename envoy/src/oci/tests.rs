use super::*;

const MODULE: &[u8] = b"\0asm\x01\0\0\0 a tiny stand-in module";

fn blob<'a>(l: &'a Layout, digest: &str) -> &'a Blob {
    l.blobs()
        .iter()
        .find(|b| b.digest() == digest)
        .unwrap_or_else(|| panic!("no blob {digest}"))
}

fn manifest(l: &Layout, tag: &str) -> serde_json::Value {
    let index = l.index();
    let d = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"][REF_NAME] == tag)
        .unwrap_or_else(|| panic!("no tag {tag}"));
    assert_eq!(d["mediaType"], media::MANIFEST);
    let b = blob(l, d["digest"].as_str().unwrap());
    assert_eq!(d["size"].as_u64().unwrap() as usize, b.bytes.len());
    serde_json::from_slice(&b.bytes).unwrap()
}

#[test]
fn the_oci_variant_is_one_wasm_layer_that_is_the_module() {
    let l = Layout::wasm_plugin(MODULE, "0.1.0").unwrap();
    let m = manifest(&l, "0.1.0");
    assert_eq!(m["schemaVersion"], 2);
    assert_eq!(m["config"]["mediaType"], media::WASM_CONFIG);
    let layers = m["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0]["mediaType"], media::WASM_LAYER);
    assert_eq!(layers[0]["digest"], digest(MODULE));
    assert_eq!(blob(&l, &digest(MODULE)).bytes, MODULE);
}

#[test]
fn the_compat_variant_is_an_image_whose_layer_holds_plugin_wasm() {
    use std::io::Read;
    let l = Layout::wasm_plugin(MODULE, "0.1.0").unwrap();
    let m = manifest(&l, "0.1.0-compat");
    assert_eq!(m["config"]["mediaType"], media::IMAGE_CONFIG);
    let layers = m["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0]["mediaType"], media::TAR_GZIP);
    let gz = &blob(&l, layers[0]["digest"].as_str().unwrap()).bytes;
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut tar)
        .unwrap();
    // The config's diff_id is the digest of the uncompressed layer.
    let config: serde_json::Value =
        serde_json::from_slice(&blob(&l, m["config"]["digest"].as_str().unwrap()).bytes).unwrap();
    assert_eq!(config["rootfs"]["diff_ids"][0], digest(&tar));
    // ustar: name, octal size, a valid checksum, the data, zero blocks.
    assert_eq!(&tar[..PLUGIN_FILE.len()], PLUGIN_FILE.as_bytes());
    assert_eq!(&tar[257..263], b"ustar\0");
    let size = usize::from_str_radix(std::str::from_utf8(&tar[124..135]).unwrap(), 8).unwrap();
    assert_eq!(size, MODULE.len());
    let stored = u32::from_str_radix(std::str::from_utf8(&tar[148..154]).unwrap(), 8).unwrap();
    let mut header = tar[..512].to_vec();
    header[148..156].copy_from_slice(b"        ");
    assert_eq!(stored, header.iter().map(|b| u32::from(*b)).sum::<u32>());
    assert_eq!(&tar[512..512 + size], MODULE);
    assert_eq!(tar.len() % 512, 0);
    assert!(tar[tar.len() - 1024..].iter().all(|b| *b == 0));
}

#[test]
fn the_same_module_gives_the_same_digests_and_a_written_layout_matches() {
    let a = Layout::wasm_plugin(MODULE, "v1").unwrap();
    let b = Layout::wasm_plugin(MODULE, "v1").unwrap();
    assert_eq!(a.index(), b.index());
    let dir = std::env::temp_dir().join(format!("tether-oci-test-{}", std::process::id()));
    a.write(&dir).unwrap();
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    assert_eq!(index, a.index());
    assert_eq!(
        std::fs::read_to_string(dir.join("oci-layout")).unwrap(),
        r#"{"imageLayoutVersion":"1.0.0"}"#
    );
    for blob in a.blobs() {
        let hex = blob.digest().trim_start_matches("sha256:").to_owned();
        let on_disk = std::fs::read(dir.join("blobs/sha256").join(&hex)).unwrap();
        assert_eq!(digest(&on_disk), blob.digest());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn not_wasm_and_bad_tags_are_refused() {
    assert!(matches!(
        Layout::wasm_plugin(b"MZ not wasm", "v1"),
        Err(OciError::NotWasm)
    ));
    for tag in ["", "-x", ".x", "a b", "a/b", &"x".repeat(130)] {
        assert!(
            matches!(Layout::wasm_plugin(MODULE, tag), Err(OciError::BadTag(_))),
            "{tag:?}"
        );
    }
}
