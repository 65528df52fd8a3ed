//! Compressed request bodies through Envoy: a gzip or zstd body is decoded
//! by the filter and read like a plain one (its `prompt_cache_key`, its head
//! turn after turn), reaches the rank exactly as sent, and a bomb falls back
//! with its counter while the VM keeps routing (docs/gateway.md, "Compressed
//! request bodies").

use crate::support::*;
use serde_json::json;
use std::io::Write;
use tether_e2e::Request;
use tether_e2e::agent::{Api, Conversation};
use tether_e2e::bootstrap;

fn gzip(body: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(body).unwrap_or_else(|e| panic!("{e}"));
    e.finish().unwrap_or_else(|e| panic!("{e}"))
}

fn zstd(body: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(body, ruzstd::encoding::CompressionLevel::Fastest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_and_zstd_bodies_are_read_and_forwarded_as_sent() {
    let fleet = Fleet::pick(
        bootstrap::DEMO,
        4,
        &[],
        json!({"max_decompressed_bytes": 1_048_576}),
        &[],
    );
    let mut conv = Conversation::new(
        Api::Chat,
        "You are a release agent.",
        &["shell"],
        "cut the release",
    );
    let plain = fleet
        .echo(Request::post_bytes(
            conv.api().path(),
            "application/json",
            conv.body(&[]),
        ))
        .await;
    assert_eq!(plain.header("x-tether-key-source"), Some("head"));
    for (enc, pack) in [("gzip", gzip as fn(&[u8]) -> Vec<u8>), ("zstd", zstd)] {
        let send = |body: Vec<u8>| {
            Request::post_bytes(conv.api().path(), "application/json", body)
                .header("content-encoding", enc)
        };
        // The head, turn after turn, as for the plain body.
        let mut c = conv.clone();
        for turn in 0..3 {
            let packed = pack(c.body(&[]).as_bytes());
            let e = fleet.echo(send(packed.clone())).await;
            assert_eq!(
                e.header("x-tether-key-source"),
                Some("head"),
                "{enc} turn {turn}"
            );
            assert_eq!(
                e.header("x-tether-key"),
                plain.header("x-tether-key"),
                "{enc} turn {turn}"
            );
            assert_eq!(place(&e), place(&plain), "{enc} turn {turn}");
            assert_eq!(e.body_bytes, packed.len(), "{enc}: forwarded as sent");
            assert_eq!(e.header("content-encoding"), Some(enc));
            c.tool_round(
                &format!("call_{turn}"),
                "shell",
                json!({"cmd": "make"}),
                "ok",
            );
        }
        // prompt_cache_key inside the compressed body.
        let e = fleet
            .echo(send(pack(
                conv.body(&[("prompt_cache_key", json!("pck-9"))])
                    .as_bytes(),
            )))
            .await;
        assert_eq!(
            e.header("x-tether-key-source"),
            Some("body:prompt_cache_key"),
            "{enc}"
        );
        // A bomb: 8 MiB of spaces after the JSON.
        let mut big = conv.body(&[]).into_bytes();
        big.extend(std::iter::repeat_n(b' ', 8 << 20));
        let e = fleet.echo(send(pack(&big))).await;
        assert_eq!(
            e.header("x-tether-key-source"),
            Some("fallback:decompressed_too_large"),
            "{enc}"
        );
    }
    conv.user("and after the bombs, the VM still routes");
    let after = fleet
        .echo(Request::post_bytes(
            conv.api().path(),
            "application/json",
            conv.body(&[]),
        ))
        .await;
    assert_eq!(after.header("x-tether-key"), plain.header("x-tether-key"));
}
