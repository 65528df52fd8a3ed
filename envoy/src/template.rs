//! Bootstrap templates: `${NAME}` and `${NAME:-default}` placeholders.
//!
//! The bootstraps in `envoy/` are real Envoy YAML with placeholders for what
//! only exists at run time (ports, module paths, the plugin configuration).
//! Substitution is plain text; values are inserted verbatim, so a value that
//! must be a YAML string is quoted by the caller (see [`yaml_string`]).

use std::collections::BTreeMap;

/// Placeholders with no value and no default, by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bootstrap template has unresolved placeholders: {0:?}")]
pub struct Unresolved(pub Vec<String>);

/// Replaces every `${NAME}` / `${NAME:-default}` in `text`. A placeholder with
/// no value and no default is an error naming it, never an empty string.
pub fn render(text: &str, vars: &BTreeMap<String, String>) -> Result<String, Unresolved> {
    let mut out = String::with_capacity(text.len());
    let mut missing = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (vars.get(name), default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                missing.push(name.to_owned());
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(Unresolved(missing))
    }
}

/// Quotes `s` as a YAML double-quoted scalar. A JSON string literal is one
/// (YAML accepts every JSON escape), so a plugin configuration in JSON can be
/// inlined as `value: ${PLUGIN_CONFIG}`.
pub fn yaml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn substitutes_values_and_defaults() {
        let out = render(
            "a ${X} b ${Y:-7} c ${Z:-9}",
            &vars(&[("X", "1"), ("Z", "3")]),
        )
        .unwrap();
        assert_eq!(out, "a 1 b 7 c 3");
    }

    #[test]
    fn names_every_missing_placeholder() {
        match render("${A} ${B} ${C:-x}", &vars(&[])) {
            Err(Unresolved(names)) => assert_eq!(names, ["A", "B"]),
            other => panic!("expected Unresolved, got {other:?}"),
        }
    }

    #[test]
    fn yaml_string_round_trips_json() {
        let q = yaml_string(r#"{"mode":"pick","x":"a\"b"}"#);
        assert!(q.starts_with('"') && q.ends_with('"'));
        let back: String = serde_json::from_str(&q).unwrap();
        assert_eq!(back, r#"{"mode":"pick","x":"a\"b"}"#);
    }
}
