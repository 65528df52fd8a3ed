use super::*;
use crate::config::Mode;
use serde_json::json;

#[test]
fn the_default_is_what_the_mode_needs() {
    assert_eq!(Outputs::default_for(false), Outputs::of(&[Output::Key]));
    assert_eq!(
        Outputs::default_for(true),
        Outputs::of(&[Output::Destination, Output::DpRank])
    );
}

#[test]
fn presets_and_names_combine() {
    let o = parse(&json!(["hash", "retain", "turn"]), Mode::Hash).unwrap();
    let names: Vec<&str> = o.iter().map(Output::name).collect();
    assert_eq!(
        names,
        [
            "key",
            "tenant",
            "session",
            "subagent",
            "prompt_end",
            "turn_kind",
            "turn",
            "retention_ms"
        ]
    );
    assert_eq!(
        parse(&json!("vllm"), Mode::Hash).unwrap(),
        Outputs::of(&[Output::SessionId, Output::KvTransferParams])
    );
    assert_eq!(parse(&json!([]), Mode::Hash).unwrap(), Outputs::NONE);
}

#[test]
fn all_takes_what_the_mode_has() {
    let hash = parse(&json!("all"), Mode::Hash).unwrap();
    assert!(hash.iter().all(|o| !o.needs_pick()));
    assert!(hash.has(Output::Key) && hash.has(Output::Debug));
    assert!(
        !hash.has(Output::HashableString),
        "filter state needs its reader"
    );
    let pick = parse(&json!("all"), Mode::Pick).unwrap();
    // Everything but the body rewrites, which change the request and force the
    // body path, the prefiller, which comes with `pd`, and pull_from, which
    // comes with `residency`: those are chosen one by one.
    assert_eq!(pick.body_fields().count(), 0);
    assert!(!pick.has(Output::Prefiller) && !pick.has(Output::PullFrom));
    assert_eq!(pick.iter().count(), Output::ALL.len() - 7);
}

#[test]
fn pick_only_outputs_need_pick_mode() {
    for bad in [
        json!("pick"),
        json!(["destination"]),
        json!(["key", "routed_dp_rank"]),
    ] {
        let (field, why) = parse(&bad, Mode::Hash).unwrap_err();
        assert!(field.starts_with("outputs"), "{field}");
        assert!(why.contains("pick"), "{why}");
    }
}

#[test]
fn where_each_output_goes() {
    let o = parse(
        &json!([
            "all",
            "vllm",
            "body_session_id",
            "routed_dp_rank",
            "original_dst"
        ]),
        Mode::Pick,
    )
    .unwrap();
    let copied: Vec<&str> = o.copied_headers().collect();
    assert_eq!(copied.len(), 13, "{copied:?}");
    assert!(copied.contains(&"x-session-id"));
    let markers: Vec<&str> = o.header_path_markers().collect();
    // Internal, and set on every header-path decision: never the client's
    // `x-session-id`, never what needs the body.
    assert!(!markers.contains(&"x-session-id"));
    assert!(!markers.contains(&"x-tether-turn-kind"));
    assert!(
        markers.contains(&"x-tether-key") && markers.contains(&"x-gateway-destination-endpoint")
    );
    let body: Vec<&str> = o.body_fields().collect();
    assert_eq!(body, ["session_id", "routed_dp_rank", "kv_transfer_params"]);
    // x-tether-pull-from: copied on the body path, but set on migrated turns
    // only, so no route may key its buffering on it.
    let pull = o.with(Output::PullFrom);
    assert!(pull.copied_headers().any(|h| h == "x-tether-pull-from"));
    assert!(
        !pull
            .header_path_markers()
            .any(|h| h == "x-tether-pull-from")
    );
    assert_eq!(Output::PullFrom.sink(), Sink::Header("x-tether-pull-from"));
}

#[test]
fn names_are_unique() {
    let mut names: Vec<&str> = PRESETS
        .iter()
        .map(|p| p.name)
        .chain(Output::ALL.iter().map(|o| o.name()))
        .collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n);
}

/// `outputs` as written in the configuration (a name or a list of names).
fn parse(v: &serde_json::Value, mode: Mode) -> Result<Outputs, (String, String)> {
    let names: Vec<(String, String)> = match v {
        serde_json::Value::String(s) => vec![("outputs".to_owned(), s.clone())],
        serde_json::Value::Array(list) => list
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("outputs[{i}]"), n.as_str().unwrap().to_owned()))
            .collect(),
        other => panic!("not an outputs value: {other}"),
    };
    Outputs::from_names(&names, mode == Mode::Pick)
}
