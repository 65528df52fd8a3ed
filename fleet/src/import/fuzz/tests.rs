use crate::import::{ImportOptions, agentx, bailian, mooncake, tracelab};
use crate::trace::{Trace, TraceError, read_trace_from};
use proptest::prelude::*;
use std::io::Cursor;

const TETHER: &str = r#"{"type":"trace","format":"tether-trace","version":1,"block_size":16}
{"type":"session","id":"s","start_ms":0}
{"type":"agent","session":"s","id":"main","agent_type":"main"}
{"type":"agent","session":"s","id":"a","agent_type":"explore","parent":"main","spawned_by_turn":0}
{"type":"request","session":"s","agent":"main","at_ms":0,"input_tokens":40,"output_tokens":3,"opened_by":"first","ended_by":"handoff","hash_runs":[[0,3]]}
{"type":"request","session":"s","agent":"a","at_ms":5,"input_tokens":20,"output_tokens":3,"opened_by":"handoff","hash_ids":[7,8]}"#;

/// Mutates `text`: overwrites, inserts or deletes bytes at random places.
fn mutate(text: &str, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    for &(at, op, byte) in edits {
        if b.is_empty() {
            break;
        }
        let i = at % b.len();
        match op % 3 {
            0 => b[i] = byte,
            1 => b.insert(i, byte),
            _ => {
                b.remove(i);
            }
        }
    }
    b
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Parses then imports; any error must name `name`.
fn parse_then_import<R>(
    name: &str,
    parsed: Result<R, TraceError>,
    import: impl Fn(R) -> Result<Trace, TraceError>,
) -> Result<(), String> {
    match parsed.and_then(import) {
        Err(e) if !e.to_string().starts_with(name) => Err(e.to_string()),
        _ => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_tether_reader_never_panics(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8)) {
        let bytes = mutate(TETHER, &edits);
        if let Err(e) = read_trace_from(Cursor::new(bytes), "t.jsonl") {
            prop_assert!(e.to_string().starts_with("t.jsonl"), "{e}");
        }
    }

    #[test]
    fn the_mooncake_importer_never_panics(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8)) {
        let text = lossy(&mutate(mooncake::tests::CHATS, &edits));
        let r = parse_then_import("m.jsonl", mooncake::parse(Cursor::new(text.into_bytes()), "m.jsonl"), |recs| {
            mooncake::import_records(recs, &ImportOptions::default(), "m.jsonl", None)
        });
        prop_assert!(r.is_ok(), "{r:?}");
    }

    #[test]
    fn the_bailian_importer_never_panics(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8)) {
        let text = lossy(&mutate(bailian::tests::CHATS, &edits));
        let r = parse_then_import("b.jsonl", bailian::parse(Cursor::new(text.into_bytes()), "b.jsonl"), |recs| {
            bailian::import_records(recs, &ImportOptions::default(), "b.jsonl", None)
        });
        prop_assert!(r.is_ok(), "{r:?}");
    }

    #[test]
    fn the_agentx_importer_never_panics(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8)) {
        let text = lossy(&mutate(agentx::tests::RUN, &edits));
        if let Ok(t) = serde_json::from_str::<agentx::WekaTrace>(&text) {
            let r = parse_then_import("x.json", Ok(vec![(t, "x.json".into(), None)]), |traces| {
                agentx::import_traces(traces, &ImportOptions::default(), "x.json", "x")
            });
            prop_assert!(r.is_ok(), "{r:?}");
        }
    }

    #[test]
    fn the_tracelab_importer_never_panics(edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..8)) {
        let text = lossy(&mutate(&tracelab::tests::fixture(), &edits));
        let r = parse_then_import("l.jsonl", tracelab::parse(Cursor::new(text.into_bytes()), "l.jsonl"), |rounds| {
            tracelab::import_rounds(rounds, &ImportOptions::default(), "l.jsonl", None)
        });
        prop_assert!(r.is_ok(), "{r:?}");
    }
}
