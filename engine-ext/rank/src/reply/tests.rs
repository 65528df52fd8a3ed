use super::*;

fn outcome() -> Outcome {
    Outcome {
        prompt_tokens: 100,
        cached_tokens: 64,
        device_cached_tokens: 48,
        restored_tokens: 16,
        transferred_tokens: 0,
        output_tokens: 3,
        arrival: 10.0,
        admitted: 12.0,
        first_token: 20.0,
        finished: 30.0,
        restore_ms: 1.5,
        transfer_ms: 0.0,
        restore_miss: false,
    }
}

fn meta() -> Meta {
    Meta {
        id: 0xabc,
        model: "m".into(),
        created: 1,
        dp_rank: 2,
    }
}

fn frames(bytes: &[u8]) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(bytes).unwrap();
    assert!(text.ends_with("\n\n"));
    parse_sse(text).unwrap()
}

fn stream(api: Api, usage: bool) -> Vec<(Option<String>, String)> {
    let mut s = Stream::new(api, meta(), usage);
    let mut out = Vec::new();
    s.start(100, 64, &mut out);
    s.token(&mut out);
    s.finish(&outcome(), &mut out);
    frames(&out)
}

#[test]
fn usage_counts_add_up_per_api() {
    let o = outcome();
    let chat = usage(Api::Chat, &o, 2);
    assert_eq!(chat["prompt_tokens_details"]["cached_tokens"], 64);
    assert_eq!(chat["total_tokens"], 103);
    assert_eq!(chat["tether"]["sim_ttft_ms"], 10.0);
    assert_eq!(chat["tether"]["sim_itl_ms"], 5.0);
    assert_eq!(chat["tether"]["restored_tokens"], 16);
    let msg = usage(Api::Messages, &o, 2);
    assert_eq!(msg["input_tokens"], 36);
    assert_eq!(msg["cache_read_input_tokens"], 64);
    let resp = usage(Api::Responses, &o, 2);
    assert_eq!(resp["input_tokens_details"]["cached_tokens"], 64);
    assert_eq!(resp["output_tokens"], 3);
}

#[test]
fn chat_stream_has_role_tokens_finish_usage_done() {
    let f = stream(Api::Chat, true);
    assert_eq!(f.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = f[..f.len() - 1]
        .iter()
        .map(|(n, d)| {
            assert!(n.is_none());
            serde_json::from_str(d).unwrap()
        })
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, answer(3));
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "stop");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], serde_json::json!([]));
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    // Without include_usage: no usage chunk, no usage members.
    let f = stream(Api::Chat, false);
    assert!(f.iter().all(|(_, d)| !d.contains("usage")));
}

#[test]
fn responses_stream_is_a_sequence_of_named_events() {
    let f = stream(Api::Responses, false);
    let names: Vec<&str> = f.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (n, d)) in f.iter().enumerate() {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["type"], n.as_deref().unwrap());
        assert_eq!(v["sequence_number"], i);
    }
    let done: Value = serde_json::from_str(&f[10].1).unwrap();
    assert_eq!(done["response"]["status"], "completed");
    assert_eq!(
        done["response"]["output"][0]["content"][0]["text"],
        answer(3)
    );
    assert_eq!(
        done["response"]["usage"]["input_tokens_details"]["cached_tokens"],
        64
    );
}

#[test]
fn messages_stream_follows_anthropics_event_order() {
    let f = stream(Api::Messages, false);
    let names: Vec<&str> = f.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    for (n, d) in &f {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["type"], n.as_deref().unwrap());
    }
    let start: Value = serde_json::from_str(&f[0].1).unwrap();
    assert_eq!(start["message"]["usage"]["cache_read_input_tokens"], 64);
    assert_eq!(start["message"]["usage"]["input_tokens"], 36);
    let delta: Value = serde_json::from_str(&f[7].1).unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 3);
}

#[test]
fn completions_stream_and_bodies_parse() {
    let f = stream(Api::Completions, true);
    assert_eq!(f.last().unwrap().1, "[DONE]");
    let text: String = f[..f.len() - 1]
        .iter()
        .filter_map(|(_, d)| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["text"].as_str().map(str::to_owned)
        })
        .collect();
    assert_eq!(text, answer(3));
    for api in [Api::Chat, Api::Completions, Api::Responses, Api::Messages] {
        let v: Value = serde_json::from_slice(&body(api, &meta(), &outcome())).unwrap();
        assert!(v["usage"].is_object(), "{api:?}");
    }
    let e: Value =
        serde_json::from_slice(&error_body(Some(Api::Messages), BadReason::TooLarge, "x")).unwrap();
    assert_eq!(e["error"]["type"], "request_too_large");
    let e: Value = serde_json::from_slice(&error_body(None, BadReason::UnknownPath, "x")).unwrap();
    assert_eq!(e["error"]["code"], 404);
}

#[test]
fn stream_errors_are_api_shaped() {
    for api in [Api::Chat, Api::Completions, Api::Responses, Api::Messages] {
        let mut s = Stream::new(api, meta(), false);
        let mut out = Vec::new();
        s.error("boom", &mut out);
        let f = frames(&out);
        let v: Value = serde_json::from_str(&f[0].1).unwrap();
        assert!(v.to_string().contains("boom"));
    }
}
