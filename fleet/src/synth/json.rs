//! Writes a body member as JSON, byte for byte what `serde_json::to_writer`
//! writes, faster for what prompts are made of: long strings with nothing to
//! escape.
//!
//! serde_json looks up every byte of a string in its escape table; a
//! synthesized 0.6 MB body spent half its synthesis there. Here a string is
//! checked eight bytes at a time for the bytes JSON escapes (`"`, `\` and
//! control characters below 0x20) and copied whole when it has none; a string
//! that has one is handed to serde_json as before.

use serde_json::Value;

/// Appends `v` as compact JSON to `out` (the same bytes as `serde_json::to_writer`).
pub fn write(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, x);
            }
            out.push(b']');
        }
        Value::Object(members) => {
            out.push(b'{');
            for (i, (k, x)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                write(out, x);
            }
            out.push(b'}');
        }
        // Writing JSON into a Vec cannot fail.
        other => {
            let _ = serde_json::to_writer(&mut *out, other);
        }
    }
}

/// A JSON string: copied between quotes when nothing in it needs escaping.
fn write_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Whether `b` holds a byte JSON escapes: `"`, `\` or one below 0x20.
fn needs_escape(b: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` is zero → its high bit set in the result (exact when no
    // byte of `x` has its own high bit set; those are masked out below).
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        let x = u64::from_le_bytes(a);
        // Bytes < 0x20: (x & 0xE0..) is zero for them; non-ASCII bytes have
        // the high bit and are never escaped.
        let ascii = !x & HIGH;
        let low = zero(x & 0xE0E0_E0E0_E0E0_E0E0) & ascii;
        let quote = zero(x ^ (ONES * u64::from(b'"'))) & ascii;
        let backslash = zero(x ^ (ONES * u64::from(b'\\'))) & ascii;
        if low | quote | backslash != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&c| c < 0x20 || c == b'"' || c == b'\\')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn every_escaped_byte_is_found_at_every_position() {
        for bad in (0u8..0x20).chain([b'"', b'\\']) {
            for pos in 0..20 {
                let mut b = vec![b'a'; 20];
                b[pos] = bad;
                assert!(needs_escape(&b), "{bad:#x} at {pos}");
            }
        }
        assert!(!needs_escape(
            "ab cd ef \u{e9}\u{7f} gh ij kl / \u{1f600}".as_bytes()
        ));
    }

    proptest! {
        #[test]
        fn strings_are_written_as_serde_json_writes_them(s in any::<String>(), t in "[ -~\t\n]{0,40}") {
            for v in [json!(s), json!(t), json!({ s.clone(): [t.clone(), 1, null, true, 2.5] })] {
                let mut out = Vec::new();
                write(&mut out, &v);
                prop_assert_eq!(out, serde_json::to_vec(&v).unwrap());
            }
        }
    }
}
