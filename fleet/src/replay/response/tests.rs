use super::*;
use serde_json::json;

#[test]
fn usage_is_normalized_per_api() {
    let chat = json!({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}});
    let u = usage(Api::Chat, &chat).unwrap();
    assert_eq!((u.prompt, u.cached, u.output), (100, 64, 5));
    let chat_null =
        json!({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": null});
    assert_eq!(usage(Api::Chat, &chat_null).unwrap().cached, 0);
    let resp = json!({"input_tokens": 90, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 32}});
    let u = usage(Api::Responses, &resp).unwrap();
    assert_eq!((u.prompt, u.cached, u.output), (90, 32, 3));
    // Anthropic counts cache reads apart from input_tokens.
    let msg = json!({"input_tokens": 10, "cache_read_input_tokens": 80, "cache_creation_input_tokens": 0, "output_tokens": 7});
    let u = usage(Api::Messages, &msg).unwrap();
    assert_eq!((u.prompt, u.cached, u.output), (90, 80, 7));
    assert!(usage(Api::Chat, &json!({"completion_tokens": 1})).is_none());
}

#[test]
fn sse_events_split_across_chunks_and_line_endings() {
    let mut p = SseParser::default();
    assert!(p.push(b"event: a\ndata: {\"x\"").is_empty());
    let e = p.push(b":1}\n\ndata: 2\r\n\r\ndata: 3");
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].name.as_deref(), Some("a"));
    assert_eq!(e[0].data, "{\"x\":1}");
    assert_eq!(e[1].data, "2");
    assert_eq!(p.finish().unwrap().data, "3");
}

fn feed(api: Api, events: &[(&str, serde_json::Value)]) -> StreamReader {
    let mut r = StreamReader::new(api);
    for (i, (name, data)) in events.iter().enumerate() {
        let ev = Event {
            name: (!name.is_empty()).then(|| name.to_string()),
            data: data.to_string(),
        };
        r.event(&ev, 10.0 * i as f64);
    }
    r
}

#[test]
fn chat_streams_count_deltas_and_take_the_usage_chunk() {
    let mut r = feed(
        Api::Chat,
        &[
            (
                "",
                json!({"choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": null}),
            ),
            (
                "",
                json!({"choices": [{"delta": {"content": "a"}}], "usage": null}),
            ),
            (
                "",
                json!({"choices": [{"delta": {"content": " b"}}], "usage": null}),
            ),
            (
                "",
                json!({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16}}}),
            ),
        ],
    );
    r.event(
        &Event {
            name: None,
            data: "[DONE]".into(),
        },
        40.0,
    );
    assert!(r.finished);
    assert_eq!(r.times.deltas, 2);
    assert_eq!(
        (r.times.first_ms, r.times.last_ms),
        (Some(10.0), Some(20.0))
    );
    assert_eq!(r.usage.as_ref().unwrap().cached, 16);
}

#[test]
fn messages_and_responses_streams_end_with_their_final_events() {
    let m = feed(
        Api::Messages,
        &[
            (
                "message_start",
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 4, "cache_read_input_tokens": 60, "output_tokens": 1}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta"}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "usage": {"output_tokens": 9}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ],
    );
    assert!(m.finished);
    let u = m.usage.unwrap();
    assert_eq!((u.prompt, u.cached, u.output), (64, 60, 9));
    let r = feed(
        Api::Responses,
        &[
            ("response.output_text.delta", json!({"delta": "x"})),
            (
                "response.completed",
                json!({"response": {"usage": {"input_tokens": 8, "output_tokens": 1}}}),
            ),
        ],
    );
    assert!(r.finished);
    assert_eq!(r.usage.unwrap().prompt, 8);
}

#[test]
fn simulated_times_win_over_the_client_clock() {
    let u = Usage {
        prompt: 100,
        cached: 50,
        output: 4,
        tether: Some(
            json!({"sim_ttft_ms": 12.5, "sim_e2e_ms": 30.0, "sim_itl_ms": 5.0, "sim_queue_ms": 1.0, "dp_rank": 3, "device_cached_tokens": 40, "restored_tokens": 10}),
        ),
    };
    let h = Headers::from_pairs([
        ("x-tether-rank", &b"10.0.0.1:8000"[..]),
        ("x-envoy-attempt-count", b"2"),
    ]);
    let times = ClientTimes {
        first_ms: Some(900.0),
        last_ms: Some(950.0),
        deltas: 4,
        end_ms: 1000.0,
    };
    let s = served(u.clone(), &h, &times);
    assert_eq!(s.timing.clock, Clock::Simulated);
    assert_eq!((s.timing.ttft_ms, s.timing.e2e_ms), (12.5, 30.0));
    assert_eq!(s.engine().as_deref(), Some("10.0.0.1:8000#3"));
    assert_eq!(s.attempts, 2);
    assert_eq!(
        (s.device_cached_tokens, s.restored_tokens),
        (Some(40), Some(10))
    );
    // A server with no simulated times (a real vLLM): the client's clock.
    let plain = Usage { tether: None, ..u };
    let s = served(plain, &Headers::default(), &times);
    assert_eq!(s.timing.clock, Clock::Client);
    assert_eq!(s.timing.ttft_ms, 900.0);
    assert!((s.timing.itl_ms.unwrap() - 50.0 / 3.0).abs() < 1e-9);
    assert_eq!(s.timing.e2e_ms, 1000.0);
    assert_eq!(s.engine(), None);
}

#[test]
fn cached_never_exceeds_prompt() {
    let u = Usage {
        prompt: 10,
        cached: 99,
        output: 1,
        tether: None,
    };
    let s = served(u, &Headers::default(), &ClientTimes::default());
    assert_eq!(s.cached_tokens, 10);
}
