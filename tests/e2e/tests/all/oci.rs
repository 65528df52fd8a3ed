//! `make oci`'s image layout, read back the way a registry client would
//! (index → manifest → layer, every digest and size checked), in both
//! variants: the module taken from it loads in Envoy and routes.

use crate::support::*;
use serde_json::{Value, json};
use std::io::Read;
use std::path::Path;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::bootstrap;
use tether_envoy::oci::{Layout, media};

/// A blob of the layout, its digest checked.
fn blob(dir: &Path, desc: &Value) -> Vec<u8> {
    let digest = desc["digest"].as_str().expect("digest");
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let bytes = std::fs::read(dir.join("blobs/sha256").join(hex)).expect("blob present");
    assert_eq!(tether_envoy::oci::digest(&bytes), digest, "blob content");
    assert_eq!(desc["size"].as_u64(), Some(bytes.len() as u64), "blob size");
    bytes
}

/// The module a puller finds under `tag`.
fn module(dir: &Path, tag: &str) -> Vec<u8> {
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).expect("index.json"))
            .expect("index is JSON");
    assert_eq!(index["schemaVersion"], 2);
    let desc = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("no tag {tag}"));
    let manifest: Value = serde_json::from_slice(&blob(dir, desc)).expect("manifest JSON");
    assert_eq!(manifest["mediaType"], media::MANIFEST);
    serde_json::from_slice::<Value>(&blob(dir, &manifest["config"])).expect("config JSON");
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "Istio wants exactly one layer");
    let layer = blob(dir, &layers[0]);
    if layers[0]["mediaType"] == media::WASM_LAYER {
        return layer;
    }
    assert_eq!(layers[0]["mediaType"], media::TAR_GZIP);
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(&layer[..])
        .read_to_end(&mut tar)
        .expect("gzip");
    // One ustar entry named plugin.wasm.
    let name_end = tar[..100].iter().position(|b| *b == 0).unwrap_or(100);
    assert_eq!(&tar[..name_end], b"plugin.wasm");
    let size = usize::from_str_radix(std::str::from_utf8(&tar[124..135]).expect("octal size"), 8)
        .expect("octal size");
    tar[512..512 + size].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_loads_the_module_taken_from_the_oci_layout() {
    need_envoy_and_filter();
    let wasm = need(tether_e2e::paths::require_filter_wasm());
    let original = std::fs::read(&wasm).expect("filter module");
    let dir = tempfile::tempdir().expect("temp dir");
    let layout = dir.path().join("layout");
    Layout::wasm_plugin(&original, "0.1.0")
        .expect("layout")
        .write(&layout)
        .expect("written");
    assert_eq!(
        std::fs::read_to_string(layout.join("oci-layout")).expect("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#
    );
    for tag in ["0.1.0", "0.1.0-compat"] {
        let m = module(&layout, tag);
        assert_eq!(m, original, "{tag}: the module itself");
        let file = dir.path().join(format!("{tag}.wasm"));
        std::fs::write(&file, &m).expect("module written");
        // demo.yaml has four rank slots.
        let ranks = ranks(4);
        let cfg = json!({"mode": "pick", "endpoints": endpoints(&ranks, &[])});
        let fleet = Fleet::start(
            ranks,
            bootstrap::DEMO,
            &cfg,
            &[("FILTER_WASM", file.to_str().expect("utf-8 path"))],
        );
        let conv = Conversation::new(Api::Chat, "sys", &[], "hi");
        let e = fleet.echo(header_turn(&conv, "oci", None)).await;
        assert!(
            e.header("x-gateway-destination-endpoint").is_some(),
            "{tag}: the filter from the image routed: {e:?}"
        );
    }
}
