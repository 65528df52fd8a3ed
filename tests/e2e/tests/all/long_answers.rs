//! Long answers through every bootstrap `tether gateway` renders: a 20 s
//! non-streamed answer and a 20 s server-sent-event stream arrive whole
//! (Envoy's 15 s route default cut the first at 15.0 s with a 504 and the
//! second after 15 events without `[DONE]`); `--request-timeout 15` brings
//! the cut back, so the test sees the timeout it sets.

use crate::support::*;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::echo::{DELAY_HEADER, STREAM_HEADER};
use tether_e2e::{HttpClient, Response};
use tether_envoy::Mode;

const ANSWER_MS: u64 = 20_000;

/// One request whose answer takes [`ANSWER_MS`], streamed or not.
async fn long(addr: SocketAddr, streamed: bool) -> (Response, Duration) {
    let conv = Conversation::new(Api::Chat, "sys", &[], "write a long answer");
    let header = if streamed {
        STREAM_HEADER
    } else {
        DELAY_HEADER
    };
    let req = header_turn(&conv, "long-answer", None).header(header, ANSWER_MS.to_string());
    let start = Instant::now();
    let resp = HttpClient::new()
        .timeout(Duration::from_secs(60))
        .send(addr, req)
        .await
        .unwrap_or_else(|e| panic!("no answer: {e}"));
    (resp, start.elapsed())
}

#[track_caller]
fn whole(mode: Mode, streamed: bool, (resp, took): &(Response, Duration)) {
    let what = format!(
        "{} mode, {}",
        mode.name(),
        if streamed { "streamed" } else { "non-streamed" }
    );
    assert_eq!(
        resp.status,
        200,
        "{what}: {}",
        String::from_utf8_lossy(&resp.body)
    );
    assert!(
        *took >= Duration::from_millis(ANSWER_MS),
        "{what}: {took:?}"
    );
    if streamed {
        let body = String::from_utf8_lossy(&resp.body);
        let events = body.matches("data: ").count();
        assert!(body.ends_with("data: [DONE]\n\n"), "{what}: {body}");
        // The echo, one event a second, [DONE].
        assert!(
            events >= 2 + (ANSWER_MS / 1000) as usize,
            "{what}: {events} events"
        );
    } else {
        echo_of(resp.clone());
    }
    println!("{what}: 200 after {:.1} s", took.as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_second_answers_arrive_whole_in_every_mode() {
    let ranks = ranks(2);
    let [pick, hash, rr] = Mode::ALL.map(|m| gateway(m, &ranks, false, |_| {}));
    let cut = gateway(Mode::Pick, &ranks, false, |s| s.timeouts.request_s = 15);
    let (a, b, c, d, e, f, g) = tokio::join!(
        long(pick.listen_addr(), false),
        long(pick.listen_addr(), true),
        long(hash.listen_addr(), false),
        long(hash.listen_addr(), true),
        long(rr.listen_addr(), false),
        long(rr.listen_addr(), true),
        long(cut.listen_addr(), false),
    );
    whole(Mode::Pick, false, &a);
    whole(Mode::Pick, true, &b);
    whole(Mode::Hash, false, &c);
    whole(Mode::Hash, true, &d);
    whole(Mode::RoundRobin, false, &e);
    whole(Mode::RoundRobin, true, &f);
    // The control: a 15 s request timeout cuts the same answer.
    assert_eq!(g.0.status, 504, "{}", String::from_utf8_lossy(&g.0.body));
    assert!(
        g.1 >= Duration::from_secs(15) && g.1 < Duration::from_secs(19),
        "{:?}",
        g.1
    );
}
