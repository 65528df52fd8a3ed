//! Fuzzes everything in the filter that reads request bytes: the head/tail
//! scanner at random read limits, the whole body decision (identity, head
//! hash, turn, rewrite), the config parser and the header-map decoder, and checks the invariants that matter: no panic; a
//! body serde_json accepts is scanned with the same top-level keys (from its
//! two ends too); a body rewrite of valid JSON stays valid JSON without a
//! client `cache_salt` or `kv_transfer_params.tether`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tether_filter::api::Api;
use tether_filter::config::Config;
use tether_filter::decide::{self, BodyCall};
use tether_filter::emit::{self, rewrite};
use tether_filter::place::{Pools, Snapshot};
use tether_filter::read::scan::{self, ReadLimits};

static SETUP: OnceLock<(Config, Pools)> = OnceLock::new();

const APIS: [Api; 4] = [Api::Chat, Api::Responses, Api::Messages, Api::Completions];

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, body)) = data.split_first() else {
        return;
    };
    let api = APIS[usize::from(knobs & 3)];
    let head = 1 + usize::from(knobs >> 2) * 7;
    let tail = 1 + usize::from(knobs >> 4) * 5;
    let mut fetch = |s: usize, l: usize| body.get(s..s.checked_add(l)?).map(<[u8]>::to_vec);
    let whole = scan::scan_full(body, api);
    let ends = scan::read_doc(
        api,
        body.len(),
        ReadLimits {
            full_max: 0,
            head,
            tail,
        },
        &mut fetch,
    );
    // Oracle: a body serde_json accepts as an object is scanned whole, with the same keys.
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(body) {
        // And read from its two ends (backward block scan included), every
        // member found is serde_json's (when no key repeats, so the value is one).
        let (view, doc, _) = ends.as_ref().expect("valid JSON object rejected from its ends");
        if whole.as_ref().is_ok_and(|d| d.members.len() == map.len()) {
            for m in &doc.members {
                let key = tether_filter::json::unescape(view.bytes(m.key).expect("key in view"))
                    .expect("key unescapes")
                    .into_owned();
                let value: serde_json::Value =
                    serde_json::from_slice(view.bytes(m.value).expect("value in view"))
                        .expect("member value is JSON");
                assert_eq!(map.get(&key), Some(&value), "member {key:?} read from the ends differs");
            }
        }
        let doc = whole
            .as_ref()
            .expect("valid JSON object rejected by the scanner");
        let view = scan::View {
            head: body.to_vec(),
            tail: Vec::new(),
            tail_base: body.len(),
            size: body.len(),
        };
        let mut keys: Vec<String> = doc
            .members
            .iter()
            .map(|m| {
                tether_filter::json::unescape(view.bytes(m.key).unwrap_or_default())
                    .unwrap_or_default()
                    .into_owned()
            })
            .collect();
        keys.sort();
        keys.dedup();
        let want: Vec<String> = map.keys().cloned().collect();
        assert_eq!(keys, want, "top-level keys differ from serde_json");
    }
    let (cfg, pools) = SETUP.get_or_init(|| {
        let cfg = Config::parse(br#"{"mode":"pick","endpoints":[{"address":"10.0.0.1:80","dp_size":4},{"address":"10.0.0.2:80"}],
            "cache_salt":{"secret":"k"},"outputs":["all","body_session_id","routed_dp_rank","kv_transfer_params"],"turn_count_max_bytes":64}"#)
        .expect("fuzz config");
        let pools = Pools::new(&cfg);
        (cfg, pools)
    });
    let headers = vec![(":path".to_owned(), b"/v1/chat/completions".to_vec())];
    let call = BodyCall::new(api, &headers, body.len());
    let d = decide::on_body(cfg, pools, Snapshot::NONE, call, &mut fetch, &mut |_| {});
    if let (Some(edit), Ok(_)) = (&d.edit, serde_json::from_slice::<serde_json::Value>(body)) {
        let out = rewrite::apply(body, edit);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("rewrite broke valid JSON");
        assert_eq!(
            v["cache_salt"],
            serde_json::json!(emit::cache_salt(b"k", b"")),
            "client cache_salt survived"
        );
        // The markers in kv_transfer_params are ours, whatever the client sent there.
        let ours = tether_filter::read::identity::hex16(d.read.identity.session_hash());
        assert_eq!(
            v["kv_transfer_params"]["tether"]["session"],
            serde_json::json!(ours),
            "client kv_transfer_params.tether survived"
        );
    }
    let _ = Config::parse(body);
    let _ = tether_filter::header_pairs::decode(body);
});
