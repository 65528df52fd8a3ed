use super::*;
use crate::read::scan::{ReadLimits, read_doc, scan_full};
use crate::testkit::{ALL_APIS, ALL_ORDERS, Convo, Order, SliceFetch, Step};

fn hash_whole(api: Api, body: &[u8]) -> Option<u64> {
    let doc = scan_full(body, api).unwrap();
    let view = View {
        head: body.to_vec(),
        tail: Vec::new(),
        tail_base: body.len(),
        size: body.len(),
    };
    head_hash(api, &doc, &view)
}

fn hash_ends(api: Api, body: &[u8]) -> Option<u64> {
    let mut f = SliceFetch::new(body);
    let (view, doc, _) = read_doc(
        api,
        body.len(),
        ReadLimits {
            full_max: 0,
            head: 128,
            tail: 128,
        },
        &mut |s, l| f.fetch(s, l),
    )
    .unwrap();
    head_hash(api, &doc, &view)
}

#[test]
fn head_is_stable_across_turns_and_reads() {
    for api in ALL_APIS {
        for order in ALL_ORDERS {
            let t1 = Convo::new("You are a careful engineer.", "Refactor the parser");
            let h1 = hash_whole(api, &t1.body(api, order)).unwrap();
            let mut later = t1.clone();
            for i in 0..20 {
                later = later.with(Step::Tool {
                    id: format!("c{i}"),
                    tool: "Read".into(),
                    result: format!("content {i}"),
                });
                later = later.with(Step::User(format!("next {i}")));
                if api == Api::Completions {
                    break;
                }
                let body = later.body(api, order);
                assert_eq!(
                    hash_whole(api, &body),
                    Some(h1),
                    "{api:?} {order:?} turn {i}"
                );
                assert_eq!(
                    hash_ends(api, &body),
                    Some(h1),
                    "{api:?} {order:?} turn {i} (ends)"
                );
            }
        }
    }
}

#[test]
fn head_tells_runs_and_subagents_apart() {
    for api in ALL_APIS {
        let base = hash_whole(api, &Convo::new("sys A", "task 1").body(api, Order::Sdk));
        assert_ne!(
            base,
            hash_whole(api, &Convo::new("sys A", "task 2").body(api, Order::Sdk)),
            "{api:?} first user"
        );
        assert_ne!(
            base,
            hash_whole(api, &Convo::new("sys B", "task 1").body(api, Order::Sdk)),
            "{api:?} system"
        );
        if api != Api::Completions {
            let mut other_tools = Convo::new("sys A", "task 1");
            other_tools.tools = vec!["Bash"];
            assert_ne!(
                base,
                hash_whole(api, &other_tools.body(api, Order::Sdk)),
                "{api:?} tools"
            );
        }
    }
}

#[test]
fn same_system_prompt_different_first_message_differ() {
    // Never messages[0] alone: two runs with one system prompt must differ.
    let a = hash_whole(
        Api::Chat,
        br#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"a"}]}"#,
    );
    let b = hash_whole(
        Api::Chat,
        br#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"b"}]}"#,
    );
    assert_ne!(a, b);
}

#[test]
fn whitespace_and_cache_control_do_not_matter() {
    let a = hash_whole(Api::Messages, br#"{"messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}],"system":"s"}"#);
    let b = hash_whole(Api::Messages, b"{ \"system\" : \"s\", \"messages\" : [ { \"role\":\"user\", \"content\":[ {\"type\":\"text\",\"text\":\"x\"} ] } ] }");
    assert_eq!(a, b);
}

#[test]
fn long_first_messages_hash_by_their_ends() {
    let big =
        |mid: &str, end: &str| format!("{}{}{}", "a".repeat(3000), mid, "b".repeat(3000)) + end;
    let h = |s: String| {
        hash_whole(
            Api::Chat,
            format!(r#"{{"messages":[{{"role":"user","content":"{s}"}}]}}"#).as_bytes(),
        )
    };
    assert_ne!(
        h(big("x", "1")),
        h(big("x", "2")),
        "the end of a long message counts"
    );
    assert_ne!(h(big("x", "")), h(big("xy", "")), "so does its length");
}

#[test]
fn chained_responses_use_instructions_and_tools() {
    let a = hash_whole(Api::Responses, br#"{"input":[{"type":"function_call_output","call_id":"1","output":"x"}],"instructions":"I","previous_response_id":"r1"}"#);
    let b = hash_whole(Api::Responses, br#"{"input":[{"role":"user","content":"next"}],"instructions":"I","previous_response_id":"r2"}"#);
    assert_eq!(a, b);
}
