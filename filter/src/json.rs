//! JSON byte primitives: skip one value forward or backward, walk objects and
//! arrays lazily, unescape small strings — no DOM, no allocation on the hot path.
//!
//! Forward, strings and containers are skipped 64 bytes at a time ([`blocks`]:
//! bit masks of quotes, backslashes and brackets, SIMD in the wasm build), so a
//! walk costs a few operations per byte even on structure-dense JSON; backward
//! walks (only over the tail) search for quotes with `memchr`. Nothing here
//! validates JSON fully: separators inside skipped containers are not checked,
//! but bracket kinds, string ends, backslashes outside strings and scalar
//! tokens are, and any input yields a result or a [`Stop`], never a panic.

pub mod blocks;

use blocks::{BLOCK, Escapes, LANE};
use std::borrow::Cow;

/// Why a walk stopped before the value ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// The bytes at hand ended inside the value; more bytes would decide.
    #[error("value continues past the bytes at hand")]
    Incomplete,
    /// The bytes are not JSON.
    #[error("not JSON")]
    Malformed,
}

/// Containers deeper than this are treated as malformed (bounded work and stack).
pub const MAX_DEPTH: usize = 256;

/// A small bit stack of open containers (`true` = object), fixed size.
struct Nesting {
    bits: [u64; MAX_DEPTH / 64],
    depth: usize,
}

impl Nesting {
    fn new() -> Self {
        Self {
            bits: [0; MAX_DEPTH / 64],
            depth: 0,
        }
    }

    fn push(&mut self, object: bool) -> Result<(), Stop> {
        let slot = self.bits.get_mut(self.depth / 64).ok_or(Stop::Malformed)?;
        let mask = 1u64 << (self.depth % 64);
        if object {
            *slot |= mask;
        } else {
            *slot &= !mask;
        }
        self.depth += 1;
        Ok(())
    }

    /// Pops and checks that the closing bracket matches the opening one.
    fn pop(&mut self, object: bool) -> Result<(), Stop> {
        if self.depth == 0 {
            return Err(Stop::Malformed);
        }
        self.depth -= 1;
        let slot = self.bits.get(self.depth / 64).ok_or(Stop::Malformed)?;
        let was_object = slot & (1u64 << (self.depth % 64)) != 0;
        if was_object == object {
            Ok(())
        } else {
            Err(Stop::Malformed)
        }
    }
}

/// True for JSON insignificant whitespace.
#[inline]
pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// First index at or after `i` that is not whitespace (may be `buf.len()`).
#[inline]
pub fn skip_ws(buf: &[u8], mut i: usize) -> usize {
    while let Some(&b) = buf.get(i) {
        if !is_ws(b) {
            break;
        }
        i += 1;
    }
    i
}

/// Index just after the last non-whitespace byte before `end` (may be 0).
#[inline]
pub fn skip_ws_back(buf: &[u8], mut end: usize) -> usize {
    while end > 0 {
        match buf.get(end - 1) {
            Some(&b) if is_ws(b) => end -= 1,
            _ => break,
        }
    }
    end
}

/// `i` is at an opening quote; returns the index after the closing quote.
///
/// Finds the first quote not escaped by a backslash run, a block at a time;
/// text full of `\n` costs nothing extra.
#[inline]
pub fn skip_string(buf: &[u8], i: usize) -> Result<usize, Stop> {
    let mut p = i + 1;
    let mut esc = Escapes::default();
    loop {
        let (quote, backslash, n) = blocks::classify_lane_at(buf, p);
        if n == 0 {
            return Err(Stop::Incomplete);
        }
        let real = blocks::first(n);
        let quote = quote & !esc.next_of::<16>(backslash & real) & real;
        if quote != 0 {
            return Ok(p + quote.trailing_zeros() as usize + 1);
        }
        if n < LANE {
            return Err(Stop::Incomplete);
        }
        p += LANE;
    }
}

/// `end` is just after a closing quote; returns the index of the opening quote.
///
/// Scanning backward is exact: inside a JSON string every `"` is escaped, so
/// the opening quote is the nearest `"` preceded by an even run of
/// backslashes. A block at a time, from the end.
#[inline]
pub fn skip_string_back(buf: &[u8], end: usize) -> Result<usize, Stop> {
    let mut p = end.checked_sub(1).ok_or(Stop::Incomplete)?;
    loop {
        if p == 0 {
            return Err(Stop::Incomplete);
        }
        let s = p.saturating_sub(LANE);
        let (quote, backslash, n) = blocks::classify_lane_at(buf, s);
        let real = blocks::first(n.min(p - s));
        let quote = unescaped_back::<16>(buf, s, quote & real, backslash & real)?;
        if quote != 0 {
            return Ok(s + 63 - quote.leading_zeros() as usize);
        }
        p = s;
    }
}

/// The quotes of the block at `s` that no backslash escapes. Whether its first
/// byte is escaped depends on the run of backslashes just before `s`; when that
/// run reaches the start of `buf` (a tail cut anywhere in the body), bytes
/// before it may continue the run, and if the two possible answers differ the
/// bytes at hand cannot decide.
#[inline]
fn unescaped_back<const W: u32>(
    buf: &[u8],
    s: usize,
    quote: u64,
    backslash: u64,
) -> Result<u64, Stop> {
    let run = buf
        .get(..s)
        .unwrap_or_default()
        .iter()
        .rev()
        .take_while(|&&b| b == b'\\')
        .count();
    let escaped = |carry: bool| {
        let mut esc = Escapes::with_carry(carry);
        quote & !esc.next_of::<W>(backslash)
    };
    let known = escaped(run % 2 == 1);
    if run == s && escaped(run % 2 == 0) != known {
        return Err(Stop::Incomplete);
    }
    Ok(known)
}

#[inline]
fn is_scalar_byte(b: u8) -> bool {
    matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E' | b'a'..=b'z')
}

/// Checks a scalar token (`true`, `false`, `null` or a number).
fn check_scalar(tok: &[u8]) -> Result<(), Stop> {
    match tok.first() {
        Some(b't') if tok == b"true" => Ok(()),
        Some(b'f') if tok == b"false" => Ok(()),
        Some(b'n') if tok == b"null" => Ok(()),
        Some(b'-' | b'0'..=b'9') => {
            if tok
                .iter()
                .all(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                && tok.last().is_some_and(u8::is_ascii_digit)
            {
                Ok(())
            } else {
                Err(Stop::Malformed)
            }
        }
        _ => Err(Stop::Malformed),
    }
}

/// `i` is at the first byte of a value; returns the index just after it.
pub fn skip_value(buf: &[u8], i: usize) -> Result<usize, Stop> {
    match buf.get(i) {
        None => Err(Stop::Incomplete),
        Some(b'"') => skip_string(buf, i),
        Some(b'{' | b'[') => skip_container(buf, i),
        Some(_) => {
            let mut j = i;
            while buf.get(j).is_some_and(|&b| is_scalar_byte(b)) {
                j += 1;
            }
            if j == buf.len() {
                // A number may go on in bytes we do not have.
                return Err(Stop::Incomplete);
            }
            check_scalar(buf.get(i..j).ok_or(Stop::Malformed)?)?;
            Ok(j)
        }
    }
}

/// Skips a whole object or array starting at `i`, checking bracket kinds.
///
/// A block at a time: the unescaped quotes give (by a prefix XOR) the bytes
/// inside strings, and only the brackets outside them are visited. A
/// backslash outside a string is malformed.
fn skip_container(buf: &[u8], i: usize) -> Result<usize, Stop> {
    let mut nest = Nesting::new();
    let mut p = i;
    let mut esc = Escapes::default();
    // All ones when the block starts inside a string.
    let mut in_string = 0u64;
    loop {
        let (m, n) = blocks::classify_at(buf, p);
        if n == 0 {
            return Err(Stop::Incomplete);
        }
        let real = blocks::first(n);
        let quote = m.quote & !esc.next(m.backslash & real) & real;
        let inside = blocks::prefix_xor(quote) ^ in_string;
        in_string = ((inside as i64) >> 63) as u64;
        if m.backslash & !inside & real != 0 {
            return Err(Stop::Malformed);
        }
        let mut brackets = (m.open | m.close) & !inside & real;
        while brackets != 0 {
            let k = brackets.trailing_zeros();
            let bit = 1u64 << k;
            let object = m.curly & bit != 0;
            if m.open & bit != 0 {
                nest.push(object)?;
            } else {
                nest.pop(object)?;
                if nest.depth == 0 {
                    return Ok(p + k as usize + 1);
                }
            }
            brackets &= brackets - 1;
        }
        if n < BLOCK {
            return Err(Stop::Incomplete);
        }
        p += BLOCK;
    }
}

/// `end` is just after the last byte of a value; returns the index of its first byte.
pub fn skip_value_back(buf: &[u8], end: usize) -> Result<usize, Stop> {
    let last = end.checked_sub(1).ok_or(Stop::Incomplete)?;
    match buf.get(last) {
        None => Err(Stop::Malformed),
        Some(b'"') => skip_string_back(buf, end),
        Some(b'}' | b']') => skip_container_back(buf, end),
        Some(_) => {
            let mut j = end;
            while j > 0 && buf.get(j - 1).is_some_and(|&b| is_scalar_byte(b)) {
                j -= 1;
            }
            if j == 0 {
                return Err(Stop::Incomplete);
            }
            check_scalar(buf.get(j..end).ok_or(Stop::Malformed)?)?;
            Ok(j)
        }
    }
}

/// The mirror of `skip_container`, a block at a time from the end: whether a
/// block's last byte is inside a string is known from the block after it, so
/// the quote parity runs from there.
fn skip_container_back(buf: &[u8], end: usize) -> Result<usize, Stop> {
    let mut nest = Nesting::new();
    let mut p = end;
    // All ones when the byte at `p` is inside a string.
    let mut in_string = 0u64;
    loop {
        if p == 0 {
            return Err(Stop::Incomplete);
        }
        let s = p.saturating_sub(BLOCK);
        let (m, n) = blocks::classify_at(buf, s);
        let real = blocks::first(n.min(p - s));
        let quote = unescaped_back::<64>(buf, s, m.quote & real, m.backslash & real)?;
        // `prefix_xor` counts from the block's start; fix its carry so that the
        // state after the block's last real byte is `in_string`.
        let odd = u64::from(quote.count_ones() % 2 == 1);
        let carry = (in_string & 1) ^ odd;
        let inside = blocks::prefix_xor(quote) ^ carry.wrapping_neg();
        in_string = carry.wrapping_neg();
        if m.backslash & !inside & real != 0 {
            return Err(Stop::Malformed);
        }
        let mut brackets = (m.open | m.close) & !inside & real;
        while brackets != 0 {
            let k = 63 - brackets.leading_zeros();
            let bit = 1u64 << k;
            let object = m.curly & bit != 0;
            if m.close & bit != 0 {
                nest.push(object)?;
            } else {
                nest.pop(object)?;
                if nest.depth == 0 {
                    return Ok(s + k as usize);
                }
            }
            brackets &= !bit;
        }
        p = s;
    }
}

/// A byte range `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same range moved by `base` (chunk-relative → body-absolute).
    pub fn shift(self, base: usize) -> Self {
        Self {
            start: self.start + base,
            end: self.end + base,
        }
    }
}

/// One complete JSON value (the slice holds exactly it), walked lazily.
#[derive(Debug, Clone, Copy)]
pub struct Value<'a>(pub &'a [u8]);

impl<'a> Value<'a> {
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }

    pub fn is_object(&self) -> bool {
        self.0.first() == Some(&b'{')
    }

    pub fn is_array(&self) -> bool {
        self.0.first() == Some(&b'[')
    }

    pub fn is_string(&self) -> bool {
        self.0.first() == Some(&b'"')
    }

    /// The members of an object, in order (empty for non-objects; stops at the
    /// first malformed member).
    pub fn members(&self) -> Members<'a> {
        Members {
            buf: self.0,
            i: if self.is_object() { 1 } else { usize::MAX },
        }
    }

    /// The elements of an array, in order (empty for non-arrays).
    pub fn elements(&self) -> Elements<'a> {
        Elements {
            buf: self.0,
            i: if self.is_array() { 1 } else { usize::MAX },
        }
    }

    /// The first member named `key` of an object (the walk stops there).
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.members().find(|(k, _)| key_eq(k, key)).map(|(_, v)| v)
    }

    /// Like [`Value::get`], looking at the first `n` members only: a cheap
    /// check for keys SDKs put first (`role`, `type`).
    pub fn get_near(&self, key: &str, n: usize) -> Option<Value<'a>> {
        self.members()
            .take(n)
            .find(|(k, _)| key_eq(k, key))
            .map(|(_, v)| v)
    }

    /// The bytes from the start of member `key`'s value to the end of this
    /// object, without skipping the value: for peeking at its leading bytes
    /// (with [`Value::first_element_head`] / [`Value::get_near`]) cheaply.
    pub fn get_head(&self, key: &str) -> Option<Value<'a>> {
        let buf = self.0;
        if !self.is_object() {
            return None;
        }
        let mut i = 1;
        loop {
            i = skip_ws(buf, i);
            if buf.get(i) == Some(&b',') {
                i = skip_ws(buf, i + 1);
            }
            if buf.get(i) != Some(&b'"') {
                return None;
            }
            let key_end = skip_string(buf, i).ok()?;
            let k = buf.get(i + 1..key_end - 1)?;
            let colon = skip_ws(buf, key_end);
            if buf.get(colon) != Some(&b':') {
                return None;
            }
            let vs = skip_ws(buf, colon + 1);
            if key_eq(k, key) {
                return buf.get(vs..).map(Value);
            }
            i = skip_value(buf, vs).ok()?;
        }
    }

    /// The bytes from the first element of an array to the array's end: lets a
    /// caller read the first element's leading members without skipping all of it.
    pub fn first_element_head(&self) -> Option<Value<'a>> {
        if !self.is_array() {
            return None;
        }
        let i = skip_ws(self.0, 1);
        match self.0.get(i) {
            Some(b'{') => self.0.get(i..).map(Value),
            _ => None,
        }
    }

    /// When this object's first member is `key` with a string value free of
    /// escapes, that string's bytes (without quotes): a look at the leading
    /// bytes only, for the `{"role": "user", …}` shape SDKs write, with no
    /// member walk. `None` means "look properly" ([`Value::get`]).
    pub fn first_plain_str(&self, key: &str) -> Option<&'a [u8]> {
        let b = self.0;
        let mut i = skip_ws(b, 1);
        if b.first() != Some(&b'{') || b.get(i) != Some(&b'"') {
            return None;
        }
        i += 1;
        let k = key.as_bytes();
        if b.get(i..i + k.len())? != k || b.get(i + k.len()) != Some(&b'"') {
            return None;
        }
        i = skip_ws(b, i + k.len() + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let rest = b.get(i + 1..)?;
        let end = rest.iter().position(|&c| c == b'"' || c == b'\\')?;
        (rest.get(end) == Some(&b'"'))
            .then(|| rest.get(..end))
            .flatten()
    }

    /// A string value, unescaped (borrowed when it holds no escapes).
    pub fn str(&self) -> Option<Cow<'a, str>> {
        let inner = self.0.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
        unescape(inner)
    }

    /// True when this is a string equal to `s` (after unescaping). Compares
    /// the raw bytes first: unescaping never lengthens a string, so only a
    /// longer value with a backslash needs unescaping.
    pub fn str_is(&self, s: &str) -> bool {
        let Some(inner) = self
            .0
            .strip_prefix(b"\"")
            .and_then(|b| b.strip_suffix(b"\""))
        else {
            return false;
        };
        raw_eq(inner, s)
    }
}

/// Iterator over an object's members: (raw key between the quotes, value).
pub struct Members<'a> {
    buf: &'a [u8],
    i: usize,
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a [u8], Value<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let buf = self.buf;
        let mut i = skip_ws(buf, self.i);
        if buf.get(i) == Some(&b',') {
            i = skip_ws(buf, i + 1);
        }
        if buf.get(i) != Some(&b'"') {
            self.i = usize::MAX;
            return None;
        }
        let key_end = skip_string(buf, i).ok()?;
        let key = buf.get(i + 1..key_end - 1)?;
        let colon = skip_ws(buf, key_end);
        if buf.get(colon) != Some(&b':') {
            self.i = usize::MAX;
            return None;
        }
        let vs = skip_ws(buf, colon + 1);
        let Ok(ve) = skip_value(buf, vs) else {
            self.i = usize::MAX;
            return None;
        };
        self.i = ve;
        Some((key, Value(buf.get(vs..ve)?)))
    }
}

/// Iterator over an array's elements.
pub struct Elements<'a> {
    buf: &'a [u8],
    i: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = Value<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let buf = self.buf;
        let mut i = skip_ws(buf, self.i);
        if buf.get(i) == Some(&b',') {
            i = skip_ws(buf, i + 1);
        }
        match buf.get(i) {
            None | Some(b']') => {
                self.i = usize::MAX;
                return None;
            }
            Some(_) => {}
        }
        let Ok(e) = skip_value(buf, i) else {
            self.i = usize::MAX;
            return None;
        };
        self.i = e;
        Some(Value(buf.get(i..e)?))
    }
}

/// Compares a raw (still escaped) key with a plain one. Escaped keys are
/// unescaped first, so `"cache\u005fsalt"` cannot hide from the filter.
#[inline]
pub fn key_eq(raw: &[u8], plain: &str) -> bool {
    raw_eq(raw, plain)
}

/// Whether the inside of a JSON string, unescaped, equals `plain`, without
/// unescaping in the common case: a raw key with no backslash is its own
/// unescaping, so it matches only byte for byte. Unescaping never lengthens
/// a string, so a shorter raw key never matches; only one with a backslash
/// is unescaped. The backslash test runs only when the lengths allow a
/// match (it used to run on every same-length key: a `memchr` call per
/// comparison on the filter's hot path).
#[inline]
fn raw_eq(raw: &[u8], plain: &str) -> bool {
    let p = plain.as_bytes();
    let escaped = || raw.contains(&b'\\');
    match raw.len().cmp(&p.len()) {
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => raw == p && !escaped(),
        std::cmp::Ordering::Greater => escaped() && unescape(raw).is_some_and(|k| k == plain),
    }
}

/// Unescapes the inside of a JSON string; `None` if it is not valid.
pub fn unescape(inner: &[u8]) -> Option<Cow<'_, str>> {
    if memchr::memchr(b'\\', inner).is_none() {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    let mut out = String::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        let rest = inner.get(i..)?;
        let k = memchr::memchr(b'\\', rest).unwrap_or(rest.len());
        out.push_str(std::str::from_utf8(rest.get(..k)?).ok()?);
        i += k;
        if i >= inner.len() {
            break;
        }
        let esc = *inner.get(i + 1)?;
        i += 2;
        let c = match esc {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = hex4(inner.get(i..i + 4)?)?;
                i += 4;
                if (0xD800..0xDC00).contains(&hi) {
                    if inner.get(i..i + 2)? != b"\\u" {
                        return None;
                    }
                    let lo = hex4(inner.get(i + 2..i + 6)?)?;
                    i += 6;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                } else {
                    char::from_u32(hi)?
                }
            }
            _ => return None,
        };
        out.push(c);
    }
    Some(Cow::Owned(out))
}

fn hex4(b: &[u8]) -> Option<u32> {
    if b.len() != 4 || !b.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let s = std::str::from_utf8(b).ok()?;
    u32::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests;
