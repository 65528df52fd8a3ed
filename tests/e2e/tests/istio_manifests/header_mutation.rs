//! The headers an `EnvoyFilter`'s `header_mutation` patch copies from the
//! tether filter's filter state (`wasm.tether.<header>`) on the body path.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

/// The header names the patch copies, each checked to read
/// `wasm.tether.<header>` and to overwrite a client's value.
pub fn copied(patch: &Value) -> Result<Vec<String>> {
    let entries = patch
        .pointer("/patch/value/typed_config/mutations/request_mutations")
        .and_then(Value::as_array)
        .context("request_mutations")?;
    let mut out = Vec::new();
    for m in entries {
        let key = m
            .pointer("/append/header/key")
            .and_then(Value::as_str)
            .context("header key")?;
        let value = m
            .pointer("/append/header/value")
            .and_then(Value::as_str)
            .context("header value")?;
        ensure!(
            value == format!("%FILTER_STATE(wasm.tether.{key}:PLAIN)%"),
            "{key} must be copied from filter state wasm.tether.{key}, not {value}"
        );
        ensure!(
            m["append"]["append_action"] == "OVERWRITE_IF_EXISTS_OR_ADD",
            "{key} must overwrite client values"
        );
        out.push(key.to_owned());
    }
    Ok(out)
}
