//! Failover through the bootstraps `tether gateway` renders: a rank killed,
//! answering 503, or hanging loses no request (retries on the key's next
//! fallback in pick mode, on another host in hash mode); after a few failures
//! it is ejected (the filter's `eject` in pick mode, Envoy's outlier
//! detection in hash mode), so its sessions go straight to one fallback each
//! — the same one every turn — and they come home once it answers again.

use crate::support::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::echo::Fault;
use tether_e2e::{EchoRank, Envoy, HttpClient};
use tether_envoy::Mode;

const SESSIONS: usize = 40;
/// The ejection time the tests configure (seconds).
const EJECT_S: u64 = 3;
/// The ejection time with a hanging rank: its first round waits out three
/// attempt timeouts before the ejection, and the rest of that round and the
/// whole second one must fall inside the ejection (3 s was missed on a
/// loaded machine: Envoy returns a host on its first outlier-detection tick
/// after the ejection time, as little as 3 s after it).
const EJECT_HANG_S: u64 = 10;

/// Where one turn of a session went.
#[derive(Debug, Clone, PartialEq)]
struct Turn {
    status: u16,
    rank: Option<String>,
    attempts: u32,
}

/// One turn of every session, in order.
async fn round(envoy: &Envoy) -> BTreeMap<usize, Turn> {
    let conv = Conversation::new(Api::Chat, "sys", &[], "hi");
    let client = HttpClient::new().timeout(Duration::from_secs(30));
    let mut out = BTreeMap::new();
    for s in 0..SESSIONS {
        let resp = client
            .send(
                envoy.listen_addr(),
                header_turn(&conv, &format!("failover-{s}"), None),
            )
            .await
            .unwrap_or_else(|e| panic!("session {s}: no answer: {e}"));
        let rank = (resp.status == 200).then(|| echo_of(resp.clone()).rank);
        let attempts = resp
            .header("x-envoy-attempt-count")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(
            s,
            Turn {
                status: resp.status,
                rank,
                attempts,
            },
        );
    }
    out
}

fn errors(r: &BTreeMap<usize, Turn>) -> usize {
    r.values().filter(|t| t.status != 200).count()
}

fn rank_of(r: &BTreeMap<usize, Turn>, s: usize) -> &str {
    r[&s].rank.as_deref().unwrap_or("-")
}

/// How a rank fails.
#[derive(Debug, Clone, Copy)]
enum Failure {
    Killed,
    Answers(Fault),
}

/// The scenario: place the sessions, fail the rank holding the most, two
/// rounds while it fails, heal it, wait out the ejection, one more round.
async fn fail_and_heal(mode: Mode, failure: Failure) {
    let mut ranks = ranks(3);
    let hang = matches!(failure, Failure::Answers(Fault::Hang));
    let eject_s = if hang { EJECT_HANG_S } else { EJECT_S };
    let envoy = gateway(mode, &ranks, false, |s| {
        s.eject_after = 3;
        s.eject_for_s = eject_s;
        // Hash mode: no load bound. With MAGLEV's default bound (150) a
        // session moved when the previous answer's upstream stream was still
        // counted active as the next request arrived (seen on a loaded
        // machine); these tests are about failover, not balance.
        s.hash_balance_factor = Some(1_000_000);
        // A hang is told from a slow answer by the wait for response
        // headers; generous, so a healthy rank on a loaded test machine is
        // not taken for a hanging one. The other failures run on the defaults.
        if hang {
            s.timeouts.attempt_s = 5;
        }
    });
    let before = round(&envoy).await;
    assert_eq!(errors(&before), 0, "{before:?}");
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for s in 0..SESSIONS {
        *count.entry(rank_of(&before, s)).or_default() += 1;
    }
    let victim = count
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(r, _)| (*r).to_owned())
        .expect("sessions placed");
    let on_victim: Vec<usize> = (0..SESSIONS)
        .filter(|s| rank_of(&before, *s) == victim)
        .collect();
    assert!(on_victim.len() >= 4, "{count:?}");
    let vi = ranks
        .iter()
        .position(|r| r.name() == victim)
        .expect("victim");
    let addr = ranks[vi].addr();
    match failure {
        Failure::Killed => drop(ranks.remove(vi)),
        Failure::Answers(f) => ranks[vi].set_fault(f).unwrap_or_else(|e| panic!("{e}")),
    }

    let t = Instant::now();
    let first = round(&envoy).await;
    let first_s = t.elapsed().as_secs_f64();
    let second = round(&envoy).await;
    for (name, r) in [("first", &first), ("second", &second)] {
        assert_eq!(errors(r), 0, "{mode:?} {failure:?}, {name} round: {r:?}");
        for s in 0..SESSIONS {
            if on_victim.contains(&s) {
                assert_ne!(rank_of(r, s), victim, "session {s}");
            } else {
                assert_eq!(rank_of(r, s), rank_of(&before, s), "session {s} moved");
            }
        }
    }
    // One fallback per session, turn after turn (its cache builds there).
    // Hash mode: a retry before the ejection walks to any other host; from
    // the ejection on, MAGLEV's table without the rank decides.
    let third = round(&envoy).await;
    assert_eq!(errors(&third), 0, "{third:?}");
    for s in &on_victim {
        assert_eq!(rank_of(&second, *s), rank_of(&third, *s), "session {s}");
        if mode == Mode::Pick {
            assert_eq!(rank_of(&first, *s), rank_of(&second, *s), "session {s}");
        }
    }
    // Ejected: the second round wastes no attempt on it.
    let retried_first = on_victim.iter().filter(|s| first[s].attempts > 1).count();
    let retried_second = on_victim.iter().filter(|s| second[s].attempts > 1).count();
    assert!(retried_first >= 3, "{first:?}");
    assert_eq!(retried_second, 0, "{second:?}");

    // Heal it, wait out the ejection: the sessions come home.
    match failure {
        Failure::Killed => ranks.insert(
            vi,
            EchoRank::start_with(&echo_bin(), &victim, addr)
                .unwrap_or_else(|e| panic!("restarting {victim} on {addr}: {e}")),
        ),
        Failure::Answers(_) => ranks[vi]
            .set_fault(Fault::None)
            .unwrap_or_else(|e| panic!("{e}")),
    }
    let healed = Instant::now();
    // Hash mode: Envoy returns an ejected host on its outlier-detection
    // interval (5 s) after the ejection time.
    let back_within = Duration::from_secs(eject_s + if mode == Mode::Hash { 6 } else { 1 });
    let after = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = round(&envoy).await;
        assert_eq!(errors(&r), 0, "{r:?}");
        if (0..SESSIONS).all(|s| rank_of(&r, s) == rank_of(&before, s)) {
            break r;
        }
        assert!(
            healed.elapsed() < back_within + Duration::from_secs(5),
            "{mode:?} {failure:?}: sessions not home {:?} after healing: {r:?}",
            healed.elapsed()
        );
    };
    let home_s = healed.elapsed().as_secs_f64();
    assert_eq!(errors(&after), 0);

    let m = metrics_of(&envoy);
    if mode == Mode::Pick {
        assert!(counter(&m, "tether_served_by_fallback") >= 3.0);
        assert!(counter(&m, "tether_endpoint_ejected") >= 1.0);
        assert!(counter(&m, "tether_primary_ejected") >= on_victim.len() as f64);
    } else {
        assert!(counter(&m, "outlier_detection_ejections_enforced_total") >= 1.0);
    }
    println!(
        "{} mode, {failure:?}: {} sessions on {victim}, 0 errors in {} requests; first round {first_s:.1} s ({retried_first} retried), second 0 retried; home {home_s:.1} s after healing; filter counters: served_by_fallback {}, primary_ejected {}, endpoint_ejected {}",
        mode.name(),
        on_victim.len(),
        4 * SESSIONS,
        counter(&m, "tether_served_by_fallback"),
        counter(&m, "tether_primary_ejected"),
        counter(&m, "tether_endpoint_ejected"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_mode_fails_over_a_killed_rank_and_comes_home() {
    fail_and_heal(Mode::Pick, Failure::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_mode_fails_over_a_503_rank_and_comes_home() {
    fail_and_heal(Mode::Pick, Failure::Answers(Fault::Unavailable)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_mode_fails_over_a_hanging_rank_and_comes_home() {
    fail_and_heal(Mode::Pick, Failure::Answers(Fault::Hang)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_mode_fails_over_a_503_rank_and_comes_home() {
    fail_and_heal(Mode::Hash, Failure::Answers(Fault::Unavailable)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_mode_fails_over_a_hanging_rank_and_comes_home() {
    fail_and_heal(Mode::Hash, Failure::Answers(Fault::Hang)).await;
}

/// A rank restarted on a new address under its name keeps its sessions
/// (rendezvous in pick mode, MAGLEV `hash_key` in hash mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_rank_on_a_new_address_keeps_its_sessions() {
    for mode in [Mode::Pick, Mode::Hash] {
        let mut ranks = ranks(3);
        let envoy = gateway(mode, &ranks, true, |_| {});
        let before = round(&envoy).await;
        drop(envoy);
        let moved = ranks[1].name().to_owned();
        let old = ranks[1].addr();
        ranks[1] =
            EchoRank::start_with(&echo_bin(), &moved, "127.0.0.1:0".parse().expect("literal"))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(ranks[1].addr(), old);
        let envoy = gateway(mode, &ranks, true, |_| {});
        let after = round(&envoy).await;
        let on_moved = (0..SESSIONS)
            .filter(|s| rank_of(&before, *s) == moved)
            .count();
        assert!(on_moved > 0);
        for s in 0..SESSIONS {
            assert_eq!(
                rank_of(&after, s),
                rank_of(&before, s),
                "{mode:?} session {s}"
            );
        }
        println!(
            "{} mode: {moved} restarted {old} -> {}, its {on_moved} sessions stayed",
            mode.name(),
            ranks[1].addr()
        );
        // The control: identified by address, the same move moves sessions.
        drop(envoy);
        let by_address = round(&gateway(mode, &ranks, false, |_| {})).await;
        ranks[1] =
            EchoRank::start_with(&echo_bin(), &moved, "127.0.0.1:0".parse().expect("literal"))
                .unwrap_or_else(|e| panic!("{e}"));
        let moved_again = round(&gateway(mode, &ranks, false, |_| {})).await;
        assert!(
            (0..SESSIONS).any(|s| rank_of(&by_address, s) != rank_of(&moved_again, s)),
            "{mode:?}: without names a new address should move sessions"
        );
    }
}
