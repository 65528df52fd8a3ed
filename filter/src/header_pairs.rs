//! The proxy-wasm header-map encoding as the host hands it over: count,
//! (key length, value length) × count, then NUL-terminated keys and values.

/// Decodes the proxy-wasm map encoding: count, (key len, value len)×count, then
/// NUL-terminated keys and values. `None` on any inconsistency.
pub fn decode(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    decode_where(bytes, |_| true)
}

/// [`decode`] keeping only the pairs whose raw name passes `keep`: the others
/// are skipped without being copied (two allocations per header saved).
pub fn decode_where(bytes: &[u8], keep: impl Fn(&[u8]) -> bool) -> Option<Vec<(String, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(b)).ok()
    };
    let count = u32_at(0)?;
    let mut p = count.checked_mul(8)?.checked_add(4)?;
    let mut out = Vec::new();
    for n in 0..count {
        let (kl, vl) = (u32_at(4 + n * 8)?, u32_at(8 + n * 8)?);
        let key = bytes.get(p..p.checked_add(kl)?)?;
        p = p.checked_add(kl + 1)?;
        let value = bytes.get(p..p.checked_add(vl)?)?;
        p = p.checked_add(vl + 1)?;
        if keep(key) {
            out.push((String::from_utf8_lossy(key).into_owned(), value.to_vec()));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(pairs: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
        for (k, v) in pairs {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        }
        for (k, v) in pairs {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
            out.extend_from_slice(v);
            out.push(0);
        }
        out
    }

    #[test]
    fn round_trips_and_rejects_inconsistent_maps() {
        let pairs: &[(&str, &[u8])] = &[
            (":path", b"/v1/messages"),
            ("x-session-id", b"a"),
            ("x-bin", &[0xff, 0]),
        ];
        let enc = encode(pairs);
        let dec = decode(&enc).unwrap();
        assert_eq!(dec.len(), 3);
        assert_eq!(dec[2], ("x-bin".to_owned(), vec![0xff, 0]));
        assert_eq!(decode(&[]), Some(Vec::new()));
        for cut in 1..enc.len() - 1 {
            assert!(
                decode(&enc[..cut]).is_none() || cut >= enc.len() - 1,
                "cut at {cut}"
            );
        }
        assert!(decode(&[0xff, 0xff, 0xff, 0xff]).is_none(), "huge count");
        let kept = decode_where(&enc, |k| k.starts_with(b"x-")).unwrap();
        assert_eq!(
            kept,
            vec![
                ("x-session-id".to_owned(), b"a".to_vec()),
                ("x-bin".to_owned(), vec![0xff, 0])
            ]
        );
        // Skipped pairs are still checked for consistency.
        for cut in 1..enc.len() - 1 {
            assert!(
                decode_where(&enc[..cut], |_| false).is_none(),
                "cut at {cut}"
            );
        }
    }
}
