//! The id format of the wire: hashes travel as lower-case hex, never raw ids.
//!
//! The gateway writes 64-bit hashes as exactly 16 lower-case hex digits
//! ([`hex16`]); readers accept 1–64 digits in any case ([`crate::HexId`]) so a
//! gateway with a wider hash (e.g. SHA-256) still maps onto one key type.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `h` as 16 lower-case hex digits, on the stack (the gateway writes several of
/// these per request on its hottest path).
pub fn hex16_bytes(h: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, d) in out.iter_mut().enumerate() {
        let nibble = (h >> (60 - 4 * i)) & 0xf;
        *d = DIGITS[nibble as usize];
    }
    out
}

/// `h` as 16 lower-case hex digits.
pub fn hex16(h: u64) -> String {
    hex16_bytes(h).iter().map(|&b| char::from(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_format() {
        for h in [0, 1, 0xdead_beef, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(hex16(h), format!("{h:016x}"));
        }
    }
}
