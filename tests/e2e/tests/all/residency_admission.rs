//! A turn that arrives before its predecessor's retention shows in any
//! residency summary still lands on its holder, through a real Envoy (pick
//! mode, body path: the session in `metadata.session_id`, load + residency)
//! in front of two real `tether-rank --role decode` at 1×. A rank records a
//! retention when a prompt's prefill ends; turn 1 here has a ~100 K-token
//! prompt (~2 s of prefill), and turn 2 (the user's reply) is sent during
//! that prefill, once the filter has polled both ranks. With
//! `--residency-from admission` (the default) the holder lists the key from
//! turn 1's admission and turn 2 stays there (rule 1), although the holder
//! is the busier candidate. The control, `--residency-from retention`,
//! lists nothing yet: turn 2 is placed as an unseen key on the idle rank and
//! counted (`tether_residency_unseen`), so the test fails if ranks stop
//! listing keys from admission. The residency block's `prefill_tokens_per_s`
//! is set high so that rule 1's backlog exception (move a turn away from a
//! long queued prefill) stays out of it.

use crate::pd::{chat, words};
use crate::support::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tether_e2e::{HttpClient, Request, Response, Stack, StackSpec};
use tether_envoy::Mode;

/// Two ranks listing keys `from` admission or retention, behind Envoy with
/// load (polled every 20 ms, bound 1.5 × mean, floor 2) and residency over
/// both as candidates (no backlog exception: see the module's doc).
fn stack(from: &str) -> Stack {
    need_envoy_and_filter();
    let profile = tether_e2e::paths::workspace_root()
        .join("examples/profiles/llama-3.1-8b-fp8-h200-tp1.json")
        .display()
        .to_string();
    let mut spec = StackSpec::new(
        2,
        Mode::Pick,
        &[
            "--profile",
            &profile,
            "--role",
            "decode",
            "--speedup",
            "1",
            "--max-num-seqs",
            "64",
            "--residency-from",
            from,
        ],
    );
    spec.concurrency = 2;
    let cfg = json!({"load": {"poll_ms": 20, "factor": 1.5, "floor": 2},
                     "outputs": ["pick", "retain"],
                     "residency": {"candidates": 2, "prefill_tokens_per_s": 1e9}});
    if let Value::Object(m) = cfg {
        spec.plugin_config = m;
    }
    Stack::start(&spec).unwrap_or_else(|e| panic!("stack with --residency-from {from}: {e}"))
}

fn stat(s: &Stack, name: &str) -> f64 {
    counter(&s.envoy.prometheus().expect("Envoy stats"), name)
}

/// Waits until `name` reaches `want` (counts reach Envoy on the filter's tick).
fn wait_stat(s: &Stack, name: &str, want: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = stat(s, name);
        if v >= want || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn send(s: &Stack, client: &HttpClient, body: &Value) -> Response {
    let req = Request::post_json("/v1/chat/completions", body);
    let r = client
        .send(s.envoy.listen_addr(), req)
        .await
        .unwrap_or_else(|e| panic!("no answer: {e}"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r
}

/// Turn 1 of a session (a ~100 K-token prompt: ~2 s of prefill at 1×, so
/// its retention record exists only after that) through Envoy; while it is
/// prefilled, and after the filter has polled the ranks showing it, turn 2
/// (the user's reply: a returning turn by its markers). Returns turn 1's
/// rank, turn 2's rank, whether the holder's summary listed the key when turn
/// 2 was sent, and how much `tether_residency_unseen` and `_stay` grew.
async fn second_turn_during_the_first(
    s: &Stack,
    session: &str,
) -> (String, String, bool, f64, f64) {
    let client = HttpClient::new().timeout(Duration::from_secs(60));
    let sys = words(session, 100_000);
    let t1 = named(chat(&sys, &["write the report"], 8), session);
    let (c, target) = (client.clone(), s.envoy.listen_addr());
    let req = Request::post_json("/v1/chat/completions", &t1);
    let first = tokio::spawn(async move { c.send(target, req).await });
    // The holder: the rank whose load shows turn 1 admitted.
    let deadline = Instant::now() + Duration::from_secs(10);
    let h = loop {
        let busy = s.ranks.iter().position(|r| {
            r.load()
                .map_or(0, |l| l["server_load"].as_u64().unwrap_or(0))
                >= 1
        });
        if let Some(i) = busy {
            break i;
        }
        assert!(Instant::now() < deadline, "turn 1 never reached a rank");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Every worker's view polled both ranks since (2 workers x 2 ranks, twice).
    let polls = stat(s, "tether_load_poll_ok");
    wait_stat(s, "tether_load_poll_ok", polls + 8.0);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (unseen, stay, decided) = (
        stat(s, "tether_residency_unseen"),
        stat(s, "tether_residency_stay"),
        decisions(s),
    );
    let view = s.ranks[h].load().expect("the holder's load");
    assert_eq!(
        view["ranks"][0]["retentions"], 0,
        "turn 1 still in prefill, nothing retained yet: {view}"
    );
    let listed = view["residency"]["keys"]
        .as_str()
        .is_some_and(|k| !k.is_empty());
    let t2 = chat(&sys, &["write the report", "a first draft", "go on"], 2);
    let r = send(s, &client, &named(t2, session)).await;
    let second = r.header("x-tether-rank").expect("rank id").to_owned();
    first.abort();
    // Turn 2's decision reaches Envoy's stats on the filter's tick.
    let deadline = Instant::now() + Duration::from_secs(10);
    while decisions(s) < decided + 1.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    (
        s.ranks[h].addr().to_string(),
        second,
        listed,
        stat(s, "tether_residency_unseen") - unseen,
        stat(s, "tether_residency_stay") - stay,
    )
}

/// `body` naming its session in `metadata.session_id`: the body path, where
/// the filter reads the turn markers (a returning turn is known as one, so
/// `tether_residency_unseen` can count it; on the header path it cannot).
fn named(mut body: Value, session: &str) -> Value {
    body["metadata"] = json!({ "session_id": session });
    body
}

/// Residency decisions so far: each placement counts one of stay, least,
/// migrate or recompute.
fn decisions(s: &Stack) -> f64 {
    ["stay", "least", "migrate", "recompute"]
        .iter()
        .map(|d| stat(s, &format!("tether_residency_{d}")))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_before_its_predecessors_retention_lands_on_its_holder() {
    let s = stack("admission");
    let (holder, second, listed, unseen, stay) = second_turn_during_the_first(&s, "adm-1").await;
    assert!(listed, "listed from admission, before any retention");
    assert_eq!(second, holder, "turn 2 stays with turn 1's rank (rule 1)");
    assert_eq!(unseen, 0.0, "the view showed the key");
    assert_eq!(stay, 1.0, "placed by rule 1 (stay)");
    drop(s);

    // Control: the same with keys listed from retention only. The view shows
    // the holder busier and no key: turn 2 is unseen and goes to the other rank.
    let s = stack("retention");
    let (holder, second, listed, unseen, _) = second_turn_during_the_first(&s, "adm-1").await;
    assert!(!listed, "nothing listed before the retention");
    assert_ne!(second, holder, "an unseen key goes to the less loaded rank");
    assert_eq!(unseen, 1.0, "counted as placed on a stale view");
}
