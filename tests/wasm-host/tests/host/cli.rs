//! The `tether-wasm-host` command on a module that is not tether's (the floor filter).

use std::process::Command;

fn floor() -> std::path::PathBuf {
    tether_wasm_host::module_path("TETHER_FLOOR_WASM", "tether_floor_filter.wasm")
        .unwrap_or_else(|e| panic!("{e}"))
}

fn run(config: &str, request: &str) -> (bool, serde_json::Value, String) {
    let dir = std::env::temp_dir().join(format!(
        "tether-cli-{}-{}",
        std::process::id(),
        config.len() + request.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("body.json"), br#"{"model":"m","messages":[]}"#).unwrap();
    let req = dir.join("req.json");
    std::fs::write(&req, request).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tether-wasm-host"))
        .args(["--module"])
        .arg(floor())
        .args(["--config-json", config, "--request"])
        .arg(&req)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.success(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn prints_upstream_headers_as_json() {
    let (ok, json, err) = run(
        r#"{"mode":"header"}"#,
        r#"{"headers":{":method":"GET",":path":"/"}}"#,
    );
    assert!(ok, "{err}");
    let headers = json["upstream"]["headers"].as_array().unwrap();
    assert!(
        headers.iter().any(|h| h[0] == "x-floor" && h[1] == "1"),
        "{json}"
    );
}

#[test]
fn prints_filter_state_for_a_body_file_in_chunks() {
    let (ok, json, err) = run(
        r#"{"mode":"body","dst":"10.0.0.5:8000"}"#,
        r#"{"headers":[[":method","POST"],[":path","/v1/chat/completions"]],"body_file":"body.json","chunk_size":7}"#,
    );
    assert!(ok, "{err}");
    assert_eq!(json["filter_state"][0]["value"], "10.0.0.5:8000", "{json}");
    assert_eq!(json["upstream"]["body"], r#"{"model":"m","messages":[]}"#);
    let body_calls = json["callbacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["callback"] == "proxy_on_request_body")
        .count();
    assert_eq!(body_calls, 4, "27 bytes in 7-byte chunks");
}

#[test]
fn bad_configuration_fails_with_the_module_message() {
    let (ok, _, err) = run(r#"{"mode":"body"}"#, r#"{"headers":{}}"#);
    assert!(!ok);
    assert!(err.contains("`dst`"), "{err}");
}
