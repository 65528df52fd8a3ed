//! Kubernetes objects read from YAML and validated as the API server does:
//! the envelope (`apiVersion`, `kind`, `metadata`) and the rest against the
//! structural schema of the object's kind and version.

use super::structural::{self, Violation};
use anyhow::Result;
use serde::Deserialize;
use serde_json::{Value, json};

/// Every document of a (possibly multi-document) YAML text, as JSON values.
pub fn parse_yaml(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = Value::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The part of `ObjectMeta` a manifest may set (server-filled fields excluded).
fn object_meta_schema() -> Value {
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    json!({
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "maxLength": 253,
                     "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
            "namespace": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
            "labels": string_map,
            "annotations": string_map,
        }
    })
}

/// One violation at `path`.
pub fn violation(path: &str, message: String) -> Vec<Violation> {
    vec![Violation {
        path: path.to_owned(),
        message,
    }]
}

/// Validates `metadata` and everything but the envelope against `schema`, the
/// schema of the object's kind and version without `apiVersion`, `kind` and
/// `metadata`.
pub fn validate_object(doc: &Value, schema: &Value) -> Vec<Violation> {
    let Some(obj) = doc.as_object() else {
        return violation("<root>", "a manifest must be an object".into());
    };
    let mut violations = Vec::new();
    match obj.get("metadata") {
        Some(meta) => {
            for mut v in structural::validate(meta, &object_meta_schema()) {
                v.path = format!(".metadata{}", v.path.trim_start_matches("<root>"));
                violations.push(v);
            }
        }
        None => violations.push(Violation {
            path: ".metadata".into(),
            message: "missing".into(),
        }),
    }
    let body: serde_json::Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    violations.extend(structural::validate(&Value::Object(body), schema));
    violations
}

/// The violations, one line.
pub fn render(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Fails unless one of `violations` is at `path` and its message contains `needle`.
pub fn expect_violation(violations: &[Violation], path: &str, needle: &str) -> Result<()> {
    anyhow::ensure!(
        violations
            .iter()
            .any(|v| v.path == path && v.message.contains(needle)),
        "expected a violation at {path} containing {needle:?}, got: [{}]",
        render(violations)
    );
    Ok(())
}
