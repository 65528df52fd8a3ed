//! The filter module as an OCI image in Istio's Wasm image format, written as
//! an OCI image layout on disk (`oci-layout`, `index.json`,
//! `blobs/sha256/…`), which `oras cp --from-oci-layout`, `skopeo copy oci:…`
//! or `crane push` send to any registry for a `WasmPlugin`'s `oci://` URL.
//!
//! Two manifests, both understood by Istio's image fetcher:
//! - the **OCI variant** (tag `<tag>`): config media type
//!   `application/vnd.module.wasm.config.v1+json`, one layer of media type
//!   `application/vnd.module.wasm.content.layer.v1+wasm` that *is* the module;
//! - the **compat variant** (tag `<tag>-compat`): an ordinary image (OCI image
//!   config, one `tar+gzip` layer) whose only file is `plugin.wasm`, for
//!   registries and tools that only take container images.
//!
//! Everything is deterministic (no timestamps): the same module gives the
//! same digests.

use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

/// Media types (OCI image spec; Istio's Wasm image spec).
pub mod media {
    pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const WASM_CONFIG: &str = "application/vnd.module.wasm.config.v1+json";
    pub const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
}

/// The file the compat variant's layer holds (Istio looks for this name).
pub const PLUGIN_FILE: &str = "plugin.wasm";

/// Annotation naming a manifest's tag in `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A content-addressed blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub media_type: &'static str,
    pub bytes: Vec<u8>,
}

impl Blob {
    /// `sha256:<hex>`.
    pub fn digest(&self) -> String {
        digest(&self.bytes)
    }

    /// The descriptor that points at it.
    pub fn descriptor(&self) -> serde_json::Value {
        serde_json::json!({
            "mediaType": self.media_type,
            "digest": self.digest(),
            "size": self.bytes.len(),
        })
    }
}

/// `sha256:<hex>` of some bytes.
pub fn digest(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in d {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// An image layout being built: its blobs and its tagged manifests.
#[derive(Debug, Default)]
pub struct Layout {
    blobs: Vec<Blob>,
    tagged: Vec<(String, Blob)>,
}

/// Why a layout could not be made.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the module is not WebAssembly (no `\\0asm` magic)")]
    NotWasm,
    #[error("tag {0:?}: must be 1–128 of [A-Za-z0-9_.-], not starting with `.` or `-`")]
    BadTag(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OciError + '_ {
    move |source| OciError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A tag as the distribution spec allows it.
fn check_tag(tag: &str) -> Result<(), OciError> {
    let ok = (1..=128).contains(&tag.len())
        && !tag.starts_with(['.', '-'])
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(OciError::BadTag(tag.to_owned()))
    }
}

/// One-file ustar archive (deterministic: owner 0, mode 0644, mtime 0).
pub fn tar_one(name: &str, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    let put = |h: &mut [u8; 512], at: usize, s: &[u8]| {
        for (i, b) in s.iter().enumerate() {
            if let Some(slot) = h.get_mut(at + i) {
                *slot = *b;
            }
        }
    };
    put(&mut h, 0, name.as_bytes());
    put(&mut h, 100, b"0000644\0");
    put(&mut h, 108, b"0000000\0");
    put(&mut h, 116, b"0000000\0");
    put(&mut h, 124, format!("{:011o}\0", data.len()).as_bytes());
    put(&mut h, 136, b"00000000000\0");
    put(&mut h, 148, b"        ");
    put(&mut h, 156, b"0");
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

/// Gzip without a timestamp or name, so equal input gives equal bytes.
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    // Writing into a Vec cannot fail.
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

impl Layout {
    /// Both variants of the module, tagged `<tag>` (OCI) and `<tag>-compat`.
    pub fn wasm_plugin(module: &[u8], tag: &str) -> Result<Layout, OciError> {
        if !module.starts_with(b"\0asm") {
            return Err(OciError::NotWasm);
        }
        check_tag(tag)?;
        check_tag(&format!("{tag}-compat"))?;
        let mut l = Layout::default();

        // OCI variant: the module is the layer.
        let config = l.add(media::WASM_CONFIG, b"{}".to_vec());
        let layer = l.add(media::WASM_LAYER, module.to_vec());
        let title = serde_json::json!({"org.opencontainers.image.title": PLUGIN_FILE});
        let mut layer_desc = layer.descriptor();
        layer_desc["annotations"] = title;
        l.tag(tag, &config, vec![layer_desc]);

        // Compat variant: an image whose one layer holds plugin.wasm.
        let tar = tar_one(PLUGIN_FILE, module);
        let image_config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [digest(&tar)]},
        });
        let config = l.add(media::IMAGE_CONFIG, image_config.to_string().into_bytes());
        let layer = l.add(media::TAR_GZIP, gzip(&tar));
        l.tag(&format!("{tag}-compat"), &config, vec![layer.descriptor()]);
        Ok(l)
    }

    fn add(&mut self, media_type: &'static str, bytes: Vec<u8>) -> Blob {
        let b = Blob { media_type, bytes };
        self.blobs.push(b.clone());
        b
    }

    fn tag(&mut self, tag: &str, config: &Blob, layers: Vec<serde_json::Value>) {
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": media::MANIFEST,
            "config": config.descriptor(),
            "layers": layers,
        });
        let m = self.add(media::MANIFEST, manifest.to_string().into_bytes());
        self.tagged.push((tag.to_owned(), m));
    }

    /// `index.json`.
    pub fn index(&self) -> serde_json::Value {
        let manifests: Vec<serde_json::Value> = self
            .tagged
            .iter()
            .map(|(tag, m)| {
                let mut d = m.descriptor();
                d["annotations"] = serde_json::json!({REF_NAME: tag});
                d
            })
            .collect();
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": media::INDEX,
            "manifests": manifests,
        })
    }

    /// Every blob (manifests included).
    pub fn blobs(&self) -> &[Blob] {
        &self.blobs
    }

    /// Writes the layout into `dir` (created; blobs already there are kept).
    pub fn write(&self, dir: &Path) -> Result<(), OciError> {
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        for b in &self.blobs {
            let d = b.digest();
            let p = blobs.join(d.trim_start_matches("sha256:"));
            std::fs::write(&p, &b.bytes).map_err(io(&p))?;
        }
        let p = dir.join("oci-layout");
        std::fs::write(&p, br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io(&p))?;
        let p = dir.join("index.json");
        std::fs::write(&p, self.index().to_string()).map_err(io(&p))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
