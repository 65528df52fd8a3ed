//! `get_property` paths: the ones a routing filter reads (request, source,
//! destination, plugin, metadata) derived from the stream, plus explicit ones.
//!
//! Values are encoded as Envoy does for the common leaves: strings as raw
//! bytes, integers as 8-byte little-endian, booleans as one byte. Non-leaf
//! metadata values are returned as JSON text (Envoy returns protobuf there).

use crate::state::HostState;

/// Splits a serialized property path (segments separated by NUL).
pub fn parse_path(raw: &[u8]) -> Vec<String> {
    raw.split(|&b| b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// Resolves a property for the current context.
pub fn lookup(state: &HostState, path: &[String]) -> Option<Vec<u8>> {
    let stream = state.streams.get(&state.current_context);
    if let Some(v) = stream
        .and_then(|s| s.set_properties.get(path))
        .or_else(|| state.set_properties.get(path))
    {
        return Some(v.clone());
    }
    if let Some(v) = stream.and_then(|s| s.properties.get(path)) {
        return Some(v.clone());
    }
    if let Some(v) = state.options.properties.get(path) {
        return Some(v.clone());
    }
    let segs: Vec<&str> = path.iter().map(String::as_str).collect();
    match segs.as_slice() {
        ["plugin_name"] => Some(state.options.plugin_name.clone().into_bytes()),
        ["plugin_root_id"] => Some(Vec::new()),
        ["plugin_vm_id"] => Some(state.options.vm_id.clone().into_bytes()),
        ["request", rest @ ..] => {
            let headers = &stream?.request_headers;
            let header = |n: &str| headers.get(n.as_bytes()).map(<[u8]>::to_vec);
            match rest {
                ["path"] => header(":path"),
                ["url_path"] => header(":path")
                    .map(|p| p.split(|&b| b == b'?').next().unwrap_or_default().to_vec()),
                ["method"] => header(":method"),
                ["host"] => header(":authority"),
                ["scheme"] => header(":scheme"),
                ["id"] => header("x-request-id"),
                ["headers", name] => header(name),
                _ => None,
            }
        }
        ["response", "code"] => {
            let status = stream?
                .response_headers
                .get_str(":status")?
                .parse::<i64>()
                .ok()?;
            Some(status.to_le_bytes().to_vec())
        }
        ["response", "code_details"] => stream?
            .response_code_details
            .as_ref()
            .map(|d| d.clone().into_bytes()),
        ["metadata", "filter_metadata", ns, rest @ ..] | ["metadata", ns, rest @ ..] => {
            let meta = stream?.properties.get(&vec!["$metadata".to_owned()])?;
            let root: serde_json::Value = serde_json::from_slice(meta).ok()?;
            let mut node = root.get(*ns)?;
            for seg in rest {
                node = node.get(*seg)?;
            }
            Some(encode_json_leaf(node))
        }
        _ => None,
    }
}

fn encode_json_leaf(v: &serde_json::Value) -> Vec<u8> {
    match v {
        serde_json::Value::String(s) => s.clone().into_bytes(),
        serde_json::Value::Bool(b) => vec![u8::from(*b)],
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => i.to_le_bytes().to_vec(),
            None => n.as_f64().unwrap_or_default().to_le_bytes().to_vec(),
        },
        other => other.to_string().into_bytes(),
    }
}
