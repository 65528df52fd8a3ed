//! GPU profiles as the fleet tools read them: tether's JSON
//! (`tether_rank_engine::profile`, `docs/profile.md`) or NVIDIA Dynamo's
//! pre-deployment profiling output ([`dynamo`]), both into the one
//! `tether_rank_engine::profile::Profile` every latency model reads.

pub mod dynamo;

use std::path::Path;
use tether_rank_engine::profile::{Profile, ProfileError};

/// Reads the profile at `path`: a tether JSON profile, or a JSON file with a
/// `dynamo` member naming Dynamo's NPZ files (`docs/profile.md`). A bare
/// `.npz` is refused with what to write instead: the NPZ files carry the
/// curves, not the model, GPU, price and KV size.
pub fn load(path: &Path) -> Result<Profile, ProfileError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|e| ProfileError::Read {
            path: p.display().to_string(),
            why: e.to_string(),
        })
    };
    if path.is_dir() || path.extension().is_some_and(|e| e == "npz") {
        return Err(ProfileError::Parse(format!(
            "{} is Dynamo profiling output: the NPZ files hold the curves but not the model, GPU, price and KV bytes per token; write a profile JSON with a `dynamo` member naming them (docs/profile.md, \"Dynamo profiles\")",
            path.display()
        )));
    }
    let bytes = read(path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| ProfileError::Parse(format!("{} is not UTF-8 text", path.display())))?;
    let is_dynamo = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .is_some_and(|v| v.get("dynamo").is_some());
    if is_dynamo {
        dynamo::from_json(&text, path.parent().unwrap_or(Path::new(".")))
    } else {
        Profile::from_json(&text)
    }
}
