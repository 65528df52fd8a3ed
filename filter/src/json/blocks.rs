//! JSON bytes classified 64 at a time into bit masks (quotes, backslashes,
//! brackets), and the two carries a forward walk needs across blocks: which
//! byte a backslash escapes, and whether a block starts inside a string.
//!
//! This is the hot core of the full structural scan: a string is skipped by
//! finding the first unescaped quote in its blocks, a container by walking
//! only the brackets outside strings (found with a prefix XOR over the quote
//! mask), so structure-dense JSON costs a few operations per byte instead of a
//! branch per byte. Classification uses wasm SIMD (`simd128`: `i8x16.eq` +
//! `i8x16.bitmask`, run by Envoy's V8 and by wasmtime) in the filter module and
//! SSE2 on x86-64; [`classify_scalar`] is the reference both are tested against.

/// Bytes per block: one bit per byte in a `u64` mask.
pub const BLOCK: usize = 64;

/// One block's bytes of interest, bit `k` = byte `k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Masks {
    /// `"`
    pub quote: u64,
    /// `\`
    pub backslash: u64,
    /// `{` or `[`
    pub open: u64,
    /// `}` or `]`
    pub close: u64,
    /// Bit 5 of the byte: tells `{`/`}` (set) from `[`/`]` (clear) among brackets.
    pub curly: u64,
}

impl Masks {
    /// Adds the masks of the 16-byte lane `i` (bits 0–15) at bytes `16 * i ..`.
    #[inline(always)]
    pub fn merge_lane(&mut self, lane: Masks, i: usize) {
        let at = 16 * i;
        self.quote |= lane.quote << at;
        self.backslash |= lane.backslash << at;
        self.open |= lane.open << at;
        self.close |= lane.close << at;
        self.curly |= lane.curly << at;
    }
}

/// The reference classification, one byte at a time.
pub fn classify_scalar(block: &[u8; BLOCK]) -> Masks {
    let mut m = Masks::default();
    for (k, &b) in block.iter().enumerate() {
        let bit = 1u64 << k;
        match b {
            b'"' => m.quote |= bit,
            b'\\' => m.backslash |= bit,
            b'{' | b'[' => m.open |= bit,
            b'}' | b']' => m.close |= bit,
            _ => {}
        }
        if b & 0x20 != 0 {
            m.curly |= bit;
        }
    }
    m
}

/// Classifies a block with the fastest code this target has.
#[inline]
pub fn classify(block: &[u8; BLOCK]) -> Masks {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        wasm::classify(block)
    }
    #[cfg(target_arch = "x86_64")]
    {
        x86::classify(block)
    }
    #[cfg(not(any(
        all(target_arch = "wasm32", target_feature = "simd128"),
        target_arch = "x86_64"
    )))]
    {
        classify_scalar(block)
    }
}

/// Bytes per string step: strings are mostly short (keys, roles, ids), so a
/// string is searched 16 bytes at a time.
pub const LANE: usize = 16;

/// Quotes and backslashes among 16 bytes (for skipping one string).
#[inline]
pub fn classify_lane(lane: &[u8; LANE]) -> (u64, u64) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        wasm::classify_lane(lane)
    }
    #[cfg(target_arch = "x86_64")]
    {
        x86::classify_lane(lane)
    }
    #[cfg(not(any(
        all(target_arch = "wasm32", target_feature = "simd128"),
        target_arch = "x86_64"
    )))]
    {
        classify_lane_scalar(lane)
    }
}

/// The reference for [`classify_lane`].
pub fn classify_lane_scalar(lane: &[u8; LANE]) -> (u64, u64) {
    let (mut q, mut b) = (0, 0);
    for (k, &x) in lane.iter().enumerate() {
        q |= u64::from(x == b'"') << k;
        b |= u64::from(x == b'\\') << k;
    }
    (q, b)
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm {
    use super::{BLOCK, Masks};
    use core::arch::wasm32::{
        u8x16_bitmask, u8x16_eq, u8x16_shl, u8x16_splat, v128, v128_load, v128_or,
    };

    /// The `i`-th 16 bytes of a block.
    #[inline(always)]
    fn lane(block: &[u8; BLOCK], i: usize) -> v128 {
        debug_assert!(i < 4);
        // SAFETY: `i < 4`, so the 16 bytes at `16 * i` lie inside the 64-byte
        // array; `v128_load` has no alignment requirement.
        unsafe { v128_load(block.as_ptr().add(16 * i).cast::<v128>()) }
    }

    #[inline]
    pub fn classify(block: &[u8; BLOCK]) -> Masks {
        let quote = u8x16_splat(b'"');
        let backslash = u8x16_splat(b'\\');
        let case = u8x16_splat(0x20);
        let open = u8x16_splat(b'{');
        let close = u8x16_splat(b'}');
        let mask = |v: v128| u64::from(u8x16_bitmask(v));
        let mut m = Masks::default();
        for i in 0..4 {
            let v = lane(block, i);
            // `[`/`{` and `]`/`}` differ only in bit 5: set it, compare with the curly ones.
            let folded = v128_or(v, case);
            let lane = Masks {
                quote: mask(u8x16_eq(v, quote)),
                backslash: mask(u8x16_eq(v, backslash)),
                open: mask(u8x16_eq(folded, open)),
                close: mask(u8x16_eq(folded, close)),
                // Bit 5 of each byte moved to its sign bit.
                curly: mask(u8x16_shl(v, 2)),
            };
            m.merge_lane(lane, i);
        }
        m
    }

    #[inline]
    pub fn classify_lane(lane: &[u8; super::LANE]) -> (u64, u64) {
        // SAFETY: the array holds exactly the 16 bytes loaded; `v128_load` has
        // no alignment requirement.
        let v = unsafe { v128_load(lane.as_ptr().cast::<v128>()) };
        (
            u64::from(u8x16_bitmask(u8x16_eq(v, u8x16_splat(b'"')))),
            u64::from(u8x16_bitmask(u8x16_eq(v, u8x16_splat(b'\\')))),
        )
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! SSE2 (part of the x86-64 baseline, so always present).
    use super::{BLOCK, Masks};
    use core::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_slli_epi16,
    };

    /// The `i`-th 16 bytes of a block.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn lane(block: &[u8; BLOCK], i: usize) -> __m128i {
        debug_assert!(i < 4);
        // SAFETY: `i < 4`, so the 16 bytes at `16 * i` lie inside the 64-byte
        // array; `_mm_loadu_si128` has no alignment requirement.
        unsafe { _mm_loadu_si128(block.as_ptr().add(16 * i).cast::<__m128i>()) }
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn movemask(v: __m128i) -> u64 {
        // `_mm_movemask_epi8` sets only the low 16 bits.
        u64::from(_mm_movemask_epi8(v) as u16)
    }

    #[inline]
    pub fn classify(block: &[u8; BLOCK]) -> Masks {
        // SAFETY: SSE2 is part of the x86-64 baseline.
        unsafe { classify_sse2(block) }
    }

    #[inline]
    pub fn classify_lane(lane: &[u8; super::LANE]) -> (u64, u64) {
        // SAFETY: SSE2 is part of the x86-64 baseline.
        unsafe { classify_lane_sse2(lane) }
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn classify_sse2(block: &[u8; BLOCK]) -> Masks {
        let quote = _mm_set1_epi8(b'"' as i8);
        let backslash = _mm_set1_epi8(b'\\' as i8);
        let case = _mm_set1_epi8(0x20);
        let open = _mm_set1_epi8(b'{' as i8);
        let close = _mm_set1_epi8(b'}' as i8);
        let mut m = Masks::default();
        for i in 0..4 {
            let v = lane(block, i);
            let folded = _mm_or_si128(v, case);
            let lane = Masks {
                quote: movemask(_mm_cmpeq_epi8(v, quote)),
                backslash: movemask(_mm_cmpeq_epi8(v, backslash)),
                open: movemask(_mm_cmpeq_epi8(folded, open)),
                close: movemask(_mm_cmpeq_epi8(folded, close)),
                // Shifting 16-bit lanes left by 2 moves each byte's bit 5 to its
                // bit 7 (bits crossing into the next byte land below bit 7).
                curly: movemask(_mm_slli_epi16::<2>(v)),
            };
            m.merge_lane(lane, i);
        }
        m
    }

    #[inline]
    #[target_feature(enable = "sse2")]
    fn classify_lane_sse2(lane: &[u8; super::LANE]) -> (u64, u64) {
        // SAFETY: the array holds exactly the 16 bytes loaded;
        // `_mm_loadu_si128` has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(lane.as_ptr().cast::<__m128i>()) };
        (
            movemask(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8))),
            movemask(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8))),
        )
    }
}

/// The block of `buf` at `start`: up to 64 bytes, the rest padded with spaces
/// (which are neither quotes, backslashes nor brackets). Returns the block
/// and how many bytes of it are real (0 at or past the end).
#[inline]
pub fn load(buf: &[u8], start: usize) -> ([u8; BLOCK], usize) {
    if let Some(whole) = whole(buf, start) {
        return (*whole, BLOCK);
    }
    let rest = buf.get(start..).unwrap_or_default();
    let mut block = [b' '; BLOCK];
    let n = rest.len().min(BLOCK);
    if let (Some(dst), Some(src)) = (block.get_mut(..n), rest.get(..n)) {
        dst.copy_from_slice(src);
    }
    (block, n)
}

/// The 64 bytes of `buf` at `start`, in place, when all are there.
#[inline(always)]
fn whole(buf: &[u8], start: usize) -> Option<&[u8; BLOCK]> {
    buf.get(start..start.checked_add(BLOCK)?)
        .and_then(|s| <&[u8; BLOCK]>::try_from(s).ok())
}

/// [`classify`] of the block at `start` and its number of real bytes; a whole
/// block is read in place (no copy).
#[inline]
pub fn classify_at(buf: &[u8], start: usize) -> (Masks, usize) {
    match whole(buf, start) {
        Some(b) => (classify(b), BLOCK),
        None => {
            let (b, n) = load(buf, start);
            (classify(&b), n)
        }
    }
}

/// [`classify_lane`] of the 16 bytes at `start` (in place when all are
/// there, else padded with spaces): (quotes, backslashes, real bytes).
#[inline]
pub fn classify_lane_at(buf: &[u8], start: usize) -> (u64, u64, usize) {
    if let Some(lane) = start
        .checked_add(LANE)
        .and_then(|end| buf.get(start..end))
        .and_then(|s| <&[u8; LANE]>::try_from(s).ok())
    {
        let (q, b) = classify_lane(lane);
        return (q, b, LANE);
    }
    let rest = buf.get(start..).unwrap_or_default();
    let mut lane = [b' '; LANE];
    let n = rest.len().min(LANE);
    if let (Some(dst), Some(src)) = (lane.get_mut(..n), rest.get(..n)) {
        dst.copy_from_slice(src);
    }
    let (q, b) = classify_lane(&lane);
    (q, b, n)
}

/// Mask of the first `n` bytes of a block.
#[inline]
pub fn first(n: usize) -> u64 {
    if n >= BLOCK { !0 } else { (1u64 << n) - 1 }
}

/// Which bytes backslashes escape, carried across blocks.
///
/// A run of backslashes escapes every second one and, when the run has odd
/// length, the byte after it. Computed for a whole block with one subtraction:
/// subtracting each run's first bit from the run shifted left flips the bits
/// of the run's even positions, i.e. the escaped ones (the method of simdjson's
/// escape scanner).
#[derive(Debug, Clone, Copy, Default)]
pub struct Escapes {
    /// 1 when the block's first byte is escaped by the previous block's last backslash.
    carry: u64,
}

const ODD_BITS: u64 = 0xAAAA_AAAA_AAAA_AAAA;

impl Escapes {
    /// Starts at a byte that is escaped (`true`) or not.
    pub fn with_carry(escaped: bool) -> Self {
        Self {
            carry: u64::from(escaped),
        }
    }

    /// Escaped bytes of the next 64-byte block, given its backslashes.
    #[inline]
    pub fn next(&mut self, backslash: u64) -> u64 {
        self.next_of::<64>(backslash)
    }

    /// Escaped bytes of the next `W`-byte step (`W` ≤ 64; bits from `W` up of
    /// the answer are meaningless), given its backslashes.
    #[inline]
    pub fn next_of<const W: u32>(&mut self, backslash: u64) -> u64 {
        if backslash == 0 {
            let escaped = self.carry;
            self.carry = 0;
            return escaped;
        }
        // A backslash escaped by the previous step cannot escape anything.
        let potential = backslash & !self.carry;
        let maybe_escaped = potential << 1;
        // For each run of potential escapes, the subtraction carries through the
        // run and marks which bytes after a run start are escapes (by parity).
        let codes = ((maybe_escaped | ODD_BITS).wrapping_sub(potential)) ^ ODD_BITS;
        let escaped = codes ^ (backslash | self.carry);
        let escape = codes & backslash;
        self.carry = (escape >> (W - 1)) & 1;
        escaped
    }
}

/// Bit `k` set when an odd number of bits `0..=k` of `x` are set: with `x` the
/// unescaped quotes, the bytes inside strings (opening quote included).
#[inline]
pub fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

// proptest is a native-only dev-dependency.
#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
