use super::*;
use serde_json::{Value as J, json};

fn parse(bytes: &[u8]) -> J {
    serde_json::from_slice(bytes).unwrap()
}

#[test]
fn ours_first_then_the_clients_members_without_theirs() {
    let client = br#"{"do_remote_prefill":true,"tether":{"session":"ffff"},"remote_port":7,"tet\u0068er":1}"#;
    let v = parse(&merged(r#"{"prompt_end":"1"}"#, Some(Value(client))));
    assert_eq!(
        v,
        json!({"tether": {"prompt_end": "1"}, "do_remote_prefill": true, "remote_port": 7})
    );
}

#[test]
fn a_client_value_that_is_not_an_object_is_replaced() {
    for client in [&b"null"[..], b"\"x\"", b"[1]", b"3"] {
        let v = parse(&merged(r#"{"a":"b"}"#, Some(Value(client))));
        assert_eq!(v, json!({"tether": {"a": "b"}}));
    }
    assert_eq!(parse(&merged("{}", None)), json!({"tether": {}}));
}
