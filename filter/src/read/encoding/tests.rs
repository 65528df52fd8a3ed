use super::*;
use crate::testkit::compress;

fn hdr(v: &str) -> Vec<(String, Vec<u8>)> {
    vec![("content-encoding".to_owned(), v.as_bytes().to_vec())]
}

#[test]
fn content_encoding_names() {
    assert_eq!(of(&[]), ContentEncoding::Identity);
    assert_eq!(of(&hdr(" identity ")), ContentEncoding::Identity);
    assert_eq!(of(&hdr("GZIP")), ContentEncoding::Decodable(Encoding::Gzip));
    assert_eq!(
        of(&hdr("x-gzip")),
        ContentEncoding::Decodable(Encoding::Gzip)
    );
    assert_eq!(
        of(&hdr("deflate")),
        ContentEncoding::Decodable(Encoding::Deflate)
    );
    assert_eq!(of(&hdr("zstd")), ContentEncoding::Decodable(Encoding::Zstd));
    assert_eq!(of(&hdr("br")), ContentEncoding::Other);
    assert_eq!(of(&hdr("gzip, zstd")), ContentEncoding::Other);
    let twice = [hdr("gzip"), hdr("gzip")].concat();
    assert_eq!(of(&twice), ContentEncoding::Other);
}

#[test]
fn round_trips_every_encoding() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.repeat(50);
    for enc in [Encoding::Gzip, Encoding::Deflate, Encoding::Zstd] {
        let packed = compress(enc, &body);
        assert_ne!(packed, body);
        assert_eq!(
            decode(enc, &packed, body.len()),
            Ok(body.clone()),
            "{enc:?}"
        );
        // Concatenated members / frames are one body.
        if enc != Encoding::Deflate {
            let two = [packed.clone(), packed.clone()].concat();
            assert_eq!(
                decode(enc, &two, 2 * body.len()),
                Ok([body.clone(), body.clone()].concat()),
                "{enc:?}"
            );
        }
    }
}

#[test]
fn a_bomb_stops_at_the_output_bound() {
    // 8 MiB of zeros packs into a few KiB: decoded no further than 1 MiB.
    let zeros = vec![0u8; 8 << 20];
    for enc in [Encoding::Gzip, Encoding::Deflate, Encoding::Zstd] {
        let packed = compress(enc, &zeros);
        assert!(packed.len() < 64 << 10, "{enc:?}: {}", packed.len());
        match decode(enc, &packed, 1 << 20) {
            Err(DecodeError::TooLarge { prefix }) => {
                assert_eq!(prefix.len(), 1 << 20, "{enc:?}");
            }
            other => panic!("{enc:?}: {:?}", other.map(|v| v.len())),
        }
    }
}

#[test]
fn truncated_and_foreign_streams_are_corrupt() {
    let body = br#"{"model":"m","input":"a long enough input to span some bytes"}"#.repeat(200);
    for enc in [Encoding::Gzip, Encoding::Deflate, Encoding::Zstd] {
        let packed = compress(enc, &body);
        let cut = packed.get(..packed.len() / 2).unwrap_or_default();
        assert!(
            matches!(decode(enc, cut, 1 << 20), Err(DecodeError::Corrupt { .. })),
            "{enc:?} truncated"
        );
        assert!(
            matches!(
                decode(enc, &body, 1 << 20),
                Err(DecodeError::Corrupt { .. })
            ),
            "{enc:?} plain JSON labelled compressed"
        );
        assert!(matches!(
            decode(enc, &[], 1 << 20),
            Err(DecodeError::Corrupt { .. }) | Ok(_)
        ));
    }
    // A truncated stream keeps the bytes decoded before the cut: the fallback key reads them.
    let packed = compress(Encoding::Gzip, &body);
    let cut = packed.get(..packed.len() - 9).unwrap_or_default();
    match decode(Encoding::Gzip, cut, 1 << 20) {
        Err(DecodeError::Corrupt { prefix }) => assert!(body.starts_with(&prefix)),
        other => panic!("{:?}", other.map(|v| v.len())),
    }
}
