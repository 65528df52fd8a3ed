//! The gateway delivers the turn markers to a vLLM KV connector: custom
//! `x-tether-*` headers never reach one, so with outputs `vllm` the filter
//! writes them into the request body's `kv_transfer_params.tether` — through
//! real Envoy, on the deployment bootstrap `envoy/vllm-dp.yaml` with the
//! plugin configuration it is written for (DP rank + `vllm`).

use crate::support::{Fleet, counter, echo_of, endpoints};
use serde_json::{Value, json};
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::{Request, bootstrap};
use tether_filter::config::Config;
use tether_filter::decide;
use tether_filter::place::Pools;
use tether_wire::TurnMarker;

fn marker_of(kv: &Value) -> TurnMarker {
    let tether = kv["tether"].as_object().expect("kv_transfer_params.tether");
    TurnMarker::from_fields(
        tether
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("not a string"))),
    )
    .expect("the engine's reader accepts what the gateway wrote")
    .expect("a session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markers_reach_the_upstream_in_kv_transfer_params() {
    let outputs = json!({"outputs": ["dp_rank", "vllm"]});
    let f = Fleet::pick(bootstrap::VLLM_DP, 1, &[2], outputs.clone(), &[]);
    let mut cfg = json!({"mode": "pick", "endpoints": endpoints(&f.ranks, &[2])});
    crate::support::merge(&mut cfg, outputs);
    let native = Config::parse(cfg.to_string().as_bytes()).expect("config");
    let pools = Pools::new(&native);

    let mut conv = Conversation::new(Api::Chat, "You are terse.", &["bash"], "fix the build");
    conv.tool_round("c1", "bash", json!({"cmd": "make"}), "error: x");
    for (what, client_kv) in [
        ("no params", None),
        (
            "spoofed",
            Some(json!({"do_remote_prefill": true, "remote_port": 5600,
                "tether": {"session": "ffffffffffffffff", "prompt_end": "1", "turn_kind": "first"}})),
        ),
    ] {
        let mut identity = vec![("session_id", json!("vllm-run-1"))];
        if let Some(kv) = &client_kv {
            identity.push(("kv_transfer_params", kv.clone()));
        }
        let body = conv.body(&identity);
        let echo = echo_of(
            f.raw(Request::post_bytes(
                Api::Chat.path(),
                "application/json",
                body.clone(),
            ))
            .await,
        );
        let sent: Value = serde_json::from_str(echo.body.as_deref().expect("echoed body"))
            .expect("the rank got JSON");
        let kv = &sent["kv_transfer_params"];
        let got = marker_of(kv);
        // Exactly the markers the filter's native build computes for these bytes.
        let d = decide::on_whole_body(
            &native,
            &pools,
            tether_filter::api::Api::Chat,
            body.as_bytes(),
        );
        let want = TurnMarker::from_fields(
            d.request_headers(
                &Config::parse(br#"{"outputs":["retain","turn"]}"#).expect("config"),
                &pools,
            )
            .iter()
            .map(|(h, v)| (tether_wire::params::field_of(h).unwrap_or("?"), v.as_str())),
        )
        .expect("markers")
        .expect("a session");
        assert_eq!(got, want, "{what}");
        assert_eq!(got.kind, tether_wire::TurnKind::Tool, "{what}");
        if client_kv.is_some() {
            assert_eq!(kv["do_remote_prefill"], json!(true), "client params kept");
            assert_eq!(kv["remote_port"], json!(5600));
        }
        // The session as vLLM's request.session_id, the DP rank for vLLM's API server.
        assert!(echo.header("x-session-id").is_some_and(|v| v.len() == 16));
        assert!(echo.header("x-data-parallel-rank").is_some());
        // Nothing else: no x-tether-* header reaches a vLLM server.
        assert!(
            echo.headers.keys().all(|k| !k.starts_with("x-tether-")),
            "{:?}",
            echo.headers.keys().collect::<Vec<_>>()
        );
        assert_eq!(
            sent["messages"],
            serde_json::from_str::<Value>(&body).unwrap()["messages"]
        );
    }
    // The spoofed request is counted, the honest one not.
    let m = f.metrics();
    assert_eq!(counter(&m, "tether_spoofed_body_marker_removed"), 1.0);
    assert_eq!(counter(&m, "tether_body_rewritten"), 2.0);
}
