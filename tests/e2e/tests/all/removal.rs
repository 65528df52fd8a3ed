//! Removing an endpoint from the plugin configuration moves only the sessions
//! that were on it (Envoy restarted with the smaller configuration).

use crate::support::*;
use serde_json::json;
use std::collections::BTreeMap;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::{HttpClient, bootstrap};

const SESSIONS: usize = 200;

async fn placements(f: &Fleet) -> BTreeMap<usize, String> {
    let conv = Conversation::new(Api::Chat, "sys", &[], "hi");
    let mut out = BTreeMap::new();
    let mut conn = HttpClient::new()
        .connect(f.envoy.listen_addr())
        .await
        .expect("connect");
    for s in 0..SESSIONS {
        let resp = conn
            .send(header_turn(&conv, &format!("removal-{s}"), None))
            .await
            .expect("answered");
        out.insert(s, echo_of(resp).rank);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_endpoint_moves_only_its_sessions() {
    need_envoy_and_filter();
    let all = ranks(4);
    let removed = all[2].name().to_owned();
    let full = json!({"mode": "pick", "endpoints": endpoints(&all, &[])});
    let fleet = Fleet::start(all, bootstrap::DEMO, &full, &[]);
    let before = placements(&fleet).await;
    let Fleet { ranks, envoy, .. } = fleet;
    drop(envoy);

    let kept: Vec<serde_json::Value> = endpoints(&ranks, &[])
        .as_array()
        .expect("array")
        .iter()
        .filter(|e| e["address"] != json!(ranks[2].addr().to_string()))
        .cloned()
        .collect();
    let smaller = json!({"mode": "pick", "endpoints": kept});
    let fleet = Fleet::start(ranks, bootstrap::DEMO, &smaller, &[]);
    let after = placements(&fleet).await;

    let on_removed = before.values().filter(|r| **r == removed).count();
    let mut moved = 0;
    for s in 0..SESSIONS {
        let (b, a) = (&before[&s], &after[&s]);
        assert_ne!(
            a, &removed,
            "session {s} still sent to the removed endpoint"
        );
        if b != &removed {
            assert_eq!(a, b, "session {s} moved from {b} to {a} though {b} stayed");
        }
        moved += usize::from(a != b);
    }
    println!(
        "endpoint removal: {moved}/{SESSIONS} sessions moved ({:.1} %), all of them from {removed} ({on_removed} sessions there)",
        100.0 * moved as f64 / SESSIONS as f64
    );
    assert_eq!(moved, on_removed);
    assert!(on_removed > 0, "the removed endpoint had sessions to move");
}
