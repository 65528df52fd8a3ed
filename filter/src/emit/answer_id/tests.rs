use super::*;
use crate::read::chain_id::{Previous, mac_key, open};
use proptest::prelude::*;
use serde_json::{Value, json};

const ENGINE: &str = "resp_0123456789abcdef";

fn sse(id: &str, deltas: usize) -> Vec<u8> {
    let object =
        |status: &str| json!({"id": id, "object": "response", "status": status, "output": []});
    let mut s = format!(
        "event: response.created\ndata: {}\n\nevent: response.in_progress\ndata: {}\n\n",
        json!({"type": "response.created", "sequence_number": 0, "response": object("in_progress")}),
        json!({"type": "response.in_progress", "sequence_number": 1, "response": object("in_progress")}),
    );
    for i in 0..deltas {
        s.push_str(&format!(
            "event: response.output_text.delta\ndata: {}\n\n",
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "delta": format!(" w{i}")})
        ));
    }
    s.push_str(&format!(
        "event: response.completed\ndata: {}\n\n",
        json!({"type": "response.completed", "response": object("completed")})
    ));
    s.into_bytes()
}

/// Feeds `answer` cut at `cuts` as the host would (held bytes come back
/// whole with the next chunk); returns what the client got and what was found.
fn run(answer: &[u8], cuts: &[usize]) -> (Vec<u8>, Vec<Found>) {
    let key = mac_key(Some(b"k"));
    let mut ids = AnswerIds::new(b"tenant".to_vec(), b"session!".to_vec());
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c < answer.len()).collect();
    bounds.sort_unstable();
    bounds.dedup();
    bounds.push(answer.len());
    let (mut client, mut held, mut found, mut at) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for (i, &b) in bounds.iter().enumerate() {
        held.extend_from_slice(answer.get(at..b).unwrap_or_default());
        at = b;
        let end = i + 1 == bounds.len();
        let (step, f) = ids.feed(&key, &held, end);
        found.push(f);
        match step {
            Step::Hold => assert!(!end, "never held at the end"),
            Step::Pass => client.append(&mut held),
            Step::Write(out) => {
                client.extend_from_slice(&out);
                held.clear();
            }
        }
    }
    (client, found)
}

/// The ids the client sees: every `response.id` of the SSE events, or the object's `id`.
fn ids_seen(client: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(client);
    let mut out = Vec::new();
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let v: Value = serde_json::from_str(data).expect("each event is JSON");
        if let Some(id) = v["response"]["id"].as_str() {
            out.push(id.to_owned());
        }
    }
    if out.is_empty()
        && let Ok(v) = serde_json::from_slice::<Value>(client)
    {
        out.push(v["id"].as_str().unwrap_or_default().to_owned());
    }
    out
}

fn opens_to_engine(id: &str) -> bool {
    let key = mac_key(Some(b"k"));
    matches!(open(&key, b"tenant", id.as_bytes()),
        Previous::Carried { session, engine } if session == b"session!" && engine == ENGINE.as_bytes())
}

#[test]
fn every_event_of_a_stream_carries_the_chain_id() {
    let answer = sse(ENGINE, 5);
    let (client, found) = run(&answer, &[40, 200, 201, 330]);
    let ids = ids_seen(&client);
    assert_eq!(ids.len(), 3, "created, in_progress, completed");
    assert!(ids.iter().all(|id| opens_to_engine(id)), "{ids:?}");
    assert_eq!(found.iter().filter(|f| **f == Found::Wrapped).count(), 1);
    // Nothing else changed.
    let back = String::from_utf8_lossy(&client).replace(&ids[0], ENGINE);
    assert_eq!(back.as_bytes(), answer.as_slice());
}

#[test]
fn a_json_answer_carries_it_and_a_copy_elsewhere_too() {
    let answer = json!({"id": ENGINE, "object": "response", "metadata": {"again": ENGINE}, "text": format!("say \"{ENGINE}\"")})
        .to_string()
        .into_bytes();
    let (client, _) = run(&answer, &[]);
    let v: Value = serde_json::from_slice(&client).expect("JSON");
    let id = v["id"].as_str().unwrap_or_default();
    assert!(opens_to_engine(id));
    assert_eq!(v["metadata"]["again"], id, "every string equal to the id");
    assert_eq!(
        v["text"],
        format!("say \"{ENGINE}\""),
        "escaped text inside a string is left alone"
    );
}

#[test]
fn no_id_in_the_window_passes_untouched() {
    let mut answer = vec![b' '; ID_WINDOW + 10];
    answer.extend_from_slice(json!({"id": ENGINE}).to_string().as_bytes());
    let (client, found) = run(&answer, &[4096, 8192, 12288, 16390]);
    assert_eq!(client, answer);
    assert!(found.contains(&Found::NotWrapped(None)));
    let (client, found) = run(br#"{"object":"response"}"#, &[5]);
    assert_eq!(client, br#"{"object":"response"}"#);
    assert_eq!(found.last(), Some(&Found::NotWrapped(None)));
}

#[test]
fn an_id_a_chain_id_cannot_carry_is_learned_instead() {
    let answer = json!({"id": "resp/with/slashes"}).to_string().into_bytes();
    let (client, found) = run(&answer, &[]);
    assert_eq!(client, answer);
    assert_eq!(
        found,
        vec![Found::NotWrapped(Some(b"resp/with/slashes".to_vec()))]
    );
}

#[test]
fn the_kept_back_end_is_bounded_and_released() {
    let key = mac_key(None);
    let mut ids = AnswerIds::new(Vec::new(), b"s".to_vec());
    let first = sse(ENGINE, 0);
    let (step, found) = ids.feed(&key, &first, false);
    assert!(matches!(step, Step::Write(_)) && found == Found::Wrapped);
    // A chunk cut right inside the next occurrence keeps only that start.
    let (step, _) = ids.feed(&key, b"data: {\"id\":\"resp_0123", false);
    assert_eq!(step, Step::Write(b"data: {\"id\":".to_vec()));
    assert_eq!(ids.finish(), b"\"resp_0123".to_vec(), "trailers release it");
    assert!(!ids.active());
}

proptest! {
    #[test]
    fn any_chunking_gives_the_same_answer(cuts in proptest::collection::vec(0usize..2000, 0..12)) {
        let answer = sse(ENGINE, 12);
        let (whole, _) = run(&answer, &[]);
        let (cut, _) = run(&answer, &cuts);
        prop_assert_eq!(cut, whole);
    }

    #[test]
    fn any_bytes_never_panic(answer in proptest::collection::vec(any::<u8>(), 0..600), cuts in proptest::collection::vec(0usize..600, 0..6)) {
        let _ = run(&answer, &cuts);
    }
}
