//! The residency summary in `/load`: what the rank retains, on which tier, bounded
//! by `--residency-entries`; a fresh rank holds nothing.

use crate::harness::{Server, chat, profile_path, words};
use clap::Parser;
use tether_placement::{Resident, resident_key};
use tether_rank::config::{Args, RankConfig};
use tether_rank::load::LoadReport;

async fn retain(s: &Server, session: &str, subagent: Option<&str>, words_n: usize) {
    let mut h = vec![
        ("x-tether-tenant", "7"),
        ("x-tether-session", session),
        ("x-tether-prompt-end", "1"),
        ("x-tether-turn-kind", "tool"),
    ];
    if let Some(a) = subagent {
        h.push(("x-tether-subagent", a));
    }
    let body = chat(&words(&format!("res{session}"), words_n), &["go"], 2);
    let r = s.post("/v1/chat/completions", &h, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

async fn resident(s: &Server) -> (Resident, u64) {
    let l: LoadReport = serde_json::from_slice(&s.get("/load").await.body).unwrap();
    let sum = l.residency.expect("the rank publishes residency");
    assert_eq!(sum.keys.len(), sum.tiers.len() * 16);
    (Resident::decode(&sum).unwrap(), sum.omitted)
}

#[tokio::test]
async fn load_lists_retained_keys_with_tokens_and_tier() {
    let s = Server::start(&["--dp-size", "2"]).await;
    let (fresh, omitted) = resident(&s).await;
    assert!(fresh.is_empty(), "a fresh rank holds nothing");
    assert_eq!(omitted, 0);
    retain(&s, "a1", None, 2000).await;
    retain(&s, "a1", Some("5"), 500).await;
    retain(&s, "b2", None, 1000).await;
    let (r, omitted) = resident(&s).await;
    assert_eq!((r.len(), omitted), (3, 0));
    let main = r.get(resident_key(7, 0xa1, 0)).expect("a1 listed");
    let sub = r
        .get(resident_key(7, 0xa1, 5))
        .expect("a1's subagent listed");
    let b2 = r.get(resident_key(7, 0xb2, 0)).expect("b2 listed");
    assert!(main.device && sub.device && b2.device);
    assert!(
        main.tokens > b2.tokens && b2.tokens > sub.tokens,
        "{main:?} {b2:?} {sub:?}"
    );
    assert_eq!(main.tokens % 16, 0, "full blocks only");
    assert!(r.get(resident_key(7, 0xc3, 0)).is_none());
    // A turn without a prompt-end marker retains nothing.
    let r2 = s
        .post(
            "/v1/chat/completions",
            &[],
            &chat(&words("plain", 800), &["x"], 2),
        )
        .await;
    assert_eq!(r2.status, 200);
    assert_eq!(resident(&s).await.0.len(), 3);
}

#[tokio::test]
async fn host_tier_records_are_listed_as_host() {
    let s = Server::start(&[
        "--cache",
        "retention-host",
        "--host-gib",
        "4",
        "--kv-tokens",
        "4096",
    ])
    .await;
    retain(&s, "d1", None, 1500).await;
    // Push d1 off the device: more retained prompts than the device holds.
    for i in 0..6 {
        retain(&s, &format!("e{i}"), None, 1500).await;
    }
    let (r, _) = resident(&s).await;
    let d1 = r
        .get(resident_key(7, 0xd1, 0))
        .expect("d1 still listed (host tier)");
    assert!(!d1.device, "{d1:?}");
    assert!(d1.tokens > 0);
}

#[tokio::test]
async fn the_entry_limit_keeps_the_largest_and_counts_the_rest() {
    let s = Server::start(&["--residency-entries", "1"]).await;
    retain(&s, "f1", None, 400).await;
    retain(&s, "f2", None, 1600).await;
    let (r, omitted) = resident(&s).await;
    assert_eq!((r.len(), omitted), (1, 1));
    assert!(r.get(resident_key(7, 0xf2, 0)).is_some());
    let off = Server::start(&["--residency-entries", "0"]).await;
    let l: LoadReport = serde_json::from_slice(&off.get("/load").await.body).unwrap();
    assert!(l.residency.is_none());
    let p = profile_path().display().to_string();
    let too_many = tether_placement::residency::MAX_ENTRIES + 1;
    let args = Args::try_parse_from([
        "tether-rank",
        "--profile",
        &p,
        "--residency-entries",
        &too_many.to_string(),
    ])
    .unwrap();
    let e = RankConfig::from_args(args).unwrap_err().to_string();
    assert!(e.contains("--residency-entries"), "{e}");
}

/// A request in flight lists its key from admission (`--residency-from
/// admission`, the default): polled while its long answer is still being
/// generated, the key is in `/load`'s residency before the reply returns.
#[tokio::test]
async fn an_admitted_unfinished_request_is_listed() {
    let s = std::sync::Arc::new(Server::start(&["--speedup", "1"]).await);
    let key = resident_key(7, 0xa7, 0);
    let s2 = s.clone();
    let reply = tokio::spawn(async move {
        let h = [
            ("x-tether-tenant", "7"),
            ("x-tether-session", "a7"),
            ("x-tether-prompt-end", "1"),
            ("x-tether-turn-kind", "user"),
        ];
        let body = chat(&words("inflight", 600), &["go"], 200);
        s2.post("/v1/chat/completions", &h, &body).await.status
    });
    let mut seen = None;
    for _ in 0..400 {
        if let Some(h) = resident(&s).await.0.get(key) {
            seen = Some(h);
            break;
        }
        if reply.is_finished() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let listed_in_flight = seen.is_some() && !reply.is_finished();
    assert_eq!(reply.await.unwrap(), 200);
    let h = seen.expect("the in-flight key is listed");
    assert!(listed_in_flight, "listed while the request was in flight");
    assert!(h.device && h.tokens > 0 && h.tokens % 16 == 0, "{h:?}");
    // With `--residency-from retention` a key with no request and no record
    // is not listed, and retention still lists it after the reply.
    let r = Server::start(&["--residency-from", "retention"]).await;
    assert!(resident(&r).await.0.is_empty());
    retain(&r, "a8", None, 300).await;
    assert!(resident(&r).await.0.get(resident_key(7, 0xa8, 0)).is_some());
}
