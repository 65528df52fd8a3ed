//! A validator for Kubernetes *structural* openAPIV3 schemas (the CRD schemas
//! the API server enforces), with strict field validation: unknown fields are
//! errors, as with `kubectl apply --validate=strict`.
//!
//! Why not the `jsonschema` crate: CRD schemas are openAPIV3, not JSON Schema.
//! `nullable`, `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-int-or-string`
//! and list-type uniqueness have Kubernetes meanings, and unknown fields are
//! rejected by default (JSON Schema allows them). Rewriting the schema to fit
//! would be as long as this and harder to read.
//!
//! Covered: `type`, `nullable`, `properties`, `additionalProperties`,
//! `x-kubernetes-preserve-unknown-fields`, `items`, `required`, `enum`,
//! `minimum`/`maximum`, `minLength`/`maxLength`, `pattern`, `minItems`/`maxItems`,
//! `maxProperties`, `x-kubernetes-int-or-string`, `x-kubernetes-list-type`
//! (`map` keys and `set` unique), and the value-validation junctors `oneOf`,
//! `anyOf`, `allOf`, `not`. Not evaluated: CEL rules (`x-kubernetes-validations`)
//! and string `format`s.

use regex::Regex;
use serde_json::{Map, Value};

/// One violation, with the JSON path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Validates `value` against the structural schema `schema`; returns every violation.
pub fn validate(value: &Value, schema: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    check(value, schema, "", Unknown::Reject, &mut out);
    out
}

/// Whether fields a schema does not declare are errors. Inside `oneOf` / `anyOf` /
/// `allOf` / `not` a structural schema may not declare fields (it only adds value
/// checks such as `required`), so there they are allowed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unknown {
    Reject,
    Allow,
}

fn push(out: &mut Vec<Violation>, path: &str, message: impl Into<String>) {
    let path = if path.is_empty() { "<root>" } else { path };
    out.push(Violation {
        path: path.to_owned(),
        message: message.into(),
    });
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn check(value: &Value, schema: &Value, path: &str, unknown: Unknown, out: &mut Vec<Violation>) {
    if value.is_null() {
        if !flag(schema, "nullable") && schema.get("type").is_some() {
            push(out, path, "null is not allowed (the field is not nullable)");
        }
        return;
    }
    if !check_type(value, schema, path, out) {
        return;
    }
    check_enum(value, schema, path, out);
    check_bounds(value, schema, path, out);
    match value {
        Value::Object(map) => check_object(map, schema, path, unknown, out),
        Value::Array(items) => check_array(items, schema, path, unknown, out),
        _ => {}
    }
    check_junctors(value, schema, path, out);
}

/// Returns false when the type is wrong (nothing below it is worth checking).
fn check_type(value: &Value, schema: &Value, path: &str, out: &mut Vec<Violation>) -> bool {
    let actual = type_name(value);
    if flag(schema, "x-kubernetes-int-or-string") {
        if actual == "integer" || actual == "string" {
            return true;
        }
        push(
            out,
            path,
            format!("expected an integer or a string, found {actual}"),
        );
        return false;
    }
    let Some(expected) = schema.get("type").and_then(Value::as_str) else {
        return true;
    };
    let ok = expected == actual || (expected == "number" && actual == "integer");
    if !ok {
        push(out, path, format!("expected {expected}, found {actual}"));
    }
    ok
}

fn check_enum(value: &Value, schema: &Value, path: &str, out: &mut Vec<Violation>) {
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        push(
            out,
            path,
            format!("{value} is not one of {}", Value::Array(allowed.clone())),
        );
    }
}

fn check_bounds(value: &Value, schema: &Value, path: &str, out: &mut Vec<Violation>) {
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
            && n < min
        {
            push(out, path, format!("{n} is below the minimum {min}"));
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            push(out, path, format!("{n} is above the maximum {max}"));
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
            && len < min
        {
            push(out, path, format!("length {len} is below minLength {min}"));
        }
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
            && len > max
        {
            push(out, path, format!("length {len} is above maxLength {max}"));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            match Regex::new(pattern) {
                Ok(re) if re.is_match(s) => {}
                Ok(_) => push(
                    out,
                    path,
                    format!("{s:?} does not match the pattern {pattern:?}"),
                ),
                Err(e) => push(
                    out,
                    path,
                    format!("schema pattern {pattern:?} does not compile: {e}"),
                ),
            }
        }
    }
}

fn check_object(
    map: &Map<String, Value>,
    schema: &Value,
    path: &str,
    unknown: Unknown,
    out: &mut Vec<Violation>,
) {
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                push(out, path, format!("required field {name:?} is missing"));
            }
        }
    }
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        push(
            out,
            path,
            format!("{} fields, more than maxProperties {max}", map.len()),
        );
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    for (name, field) in map {
        let field_path = format!("{path}.{name}");
        if let Some(sub) = properties.and_then(|p| p.get(name)) {
            check(field, sub, &field_path, unknown, out);
        } else if let Some(sub) = additional.filter(|a| a.is_object()) {
            check(field, sub, &field_path, unknown, out);
        } else if additional == Some(&Value::Bool(true)) || preserve || unknown == Unknown::Allow {
            // Declared open: anything goes below this field.
        } else {
            push(out, &field_path, "unknown field");
        }
    }
}

fn check_array(
    items: &[Value],
    schema: &Value,
    path: &str,
    unknown: Unknown,
    out: &mut Vec<Violation>,
) {
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        push(
            out,
            path,
            format!("{} items, fewer than minItems {min}", items.len()),
        );
    }
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        push(
            out,
            path,
            format!("{} items, more than maxItems {max}", items.len()),
        );
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            check(item, item_schema, &format!("{path}[{i}]"), unknown, out);
        }
    }
    check_list_type(items, schema, path, out);
}

/// `x-kubernetes-list-type: map` items are unique by their `x-kubernetes-list-map-keys`;
/// `set` items are unique as a whole.
fn check_list_type(items: &[Value], schema: &Value, path: &str, out: &mut Vec<Violation>) {
    let identity: Vec<Value> = match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            items
                .iter()
                .map(|item| {
                    Value::Array(
                        keys.iter()
                            .map(|k| item.get(k).cloned().unwrap_or(Value::Null))
                            .collect(),
                    )
                })
                .collect()
        }
        Some("set") => items.to_vec(),
        _ => return,
    };
    for (i, id) in identity.iter().enumerate() {
        if identity[..i].contains(id) {
            push(
                out,
                &format!("{path}[{i}]"),
                format!("duplicate list entry {id}"),
            );
        }
    }
}

fn holds(value: &Value, schema: &Value, path: &str) -> bool {
    let mut scratch = Vec::new();
    check(value, schema, path, Unknown::Allow, &mut scratch);
    scratch.is_empty()
}

fn check_junctors(value: &Value, schema: &Value, path: &str, out: &mut Vec<Violation>) {
    let list = |key: &str| {
        schema
            .get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    for sub in list("allOf") {
        check(value, &sub, path, Unknown::Allow, out);
    }
    let any = list("anyOf");
    if !any.is_empty() && !any.iter().any(|s| holds(value, s, path)) {
        push(out, path, "matches none of the anyOf alternatives");
    }
    let one = list("oneOf");
    if !one.is_empty() {
        let matched = one.iter().filter(|s| holds(value, s, path)).count();
        if matched != 1 {
            push(
                out,
                path,
                format!(
                    "must match exactly one oneOf alternative, matches {matched} (mutually exclusive fields set?)"
                ),
            );
        }
    }
    if let Some(not) = schema.get("not")
        && holds(value, not, path)
    {
        push(out, path, "matches a schema it must not match");
    }
}
