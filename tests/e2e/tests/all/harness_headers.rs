//! Harness session headers through Envoy: Codex's older `session_id`
//! (underscore) and OpenCode Zen's `x-opencode-session` are default session
//! sources — a session keeps its key and rank turn after turn, and two
//! sessions with the same conversation get two keys.

use crate::support::*;
use serde_json::json;
use tether_e2e::Request;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::bootstrap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_session_id_and_opencode_session_are_read() {
    let fleet = Fleet::pick(bootstrap::DEMO, 4, &[], json!({}), &[]);
    let conv = Conversation::new(Api::Chat, "sys", &[], "hi");
    for header in ["session_id", "x-opencode-session"] {
        let turn = |session: &str| {
            Request::post_bytes(conv.api().path(), "application/json", conv.body(&[]))
                .header(header, session)
        };
        let a1 = fleet.echo(turn("run-a")).await;
        let a2 = fleet.echo(turn("run-a")).await;
        let b = fleet.echo(turn("run-b")).await;
        assert_eq!(
            a1.header("x-tether-key-source"),
            Some(format!("header:{header}").as_str()),
            "{a1:?}"
        );
        let key = |e: &tether_e2e::EchoReply| e.header("x-tether-key").map(str::to_owned);
        assert_eq!(key(&a1), key(&a2), "{header}: one session, one key");
        assert_eq!(place(&a1), place(&a2), "{header}: one session, one rank");
        assert_ne!(key(&a1), key(&b), "{header}: two sessions, two keys");
    }
}
