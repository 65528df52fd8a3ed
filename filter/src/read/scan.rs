//! The body scanner: top-level members from the head (forward) and the tail
//! (backward) of a JSON body, meeting at the conversation array, so the middle
//! of a long conversation is never read.
//!
//! [`read_doc`] drives it: it asks a fetch function for byte ranges (in Envoy,
//! `get_buffer_bytes(start, len)`), grows the head or the tail only while a
//! needed value is cut, and reads the whole body only when it is small
//! (`full_max`) or the two ends would overlap.

use crate::api::{Api, ApiShape};
use crate::json::{self, Span, Stop, Value};

/// Why a body could not be scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// The body ends before the top-level object does.
    #[error("body is truncated")]
    Truncated,
    /// The body is not a JSON object.
    #[error("body is not a JSON object")]
    Malformed,
    /// The host gave fewer bytes than asked for.
    #[error("body bytes unavailable")]
    Unavailable,
}

/// One top-level member: the raw key (between its quotes) and the value, both
/// as absolute body offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub key: Span,
    pub value: Span,
}

/// Where the forward scan of the head stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadEnd {
    /// The whole object was read; `end` is just after its closing brace.
    Complete { end: usize },
    /// The bytes ended inside the conversation member's value, which starts at `start`.
    InConversation { start: usize },
    /// The bytes ended inside another member (or between members) at `at`.
    InOther { at: usize },
}

/// Result of the forward scan over the head bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadScan {
    /// Complete members, in body order (the conversation member included when complete).
    pub members: Vec<Member>,
    /// Complete elements of the conversation array seen from its start.
    pub conv_elems: Vec<Span>,
    /// Start of the conversation member's value, when it was reached.
    pub conv_start: Option<usize>,
    /// The conversation member's key, when it was reached.
    pub conv_key: Option<Span>,
    /// The walk of the conversation stopped at an element `enough` accepted
    /// (the last of `conv_elems`).
    pub opened: bool,
    pub end: HeadEnd,
}

/// Scans `buf` (the body from offset 0) forward. `conv_key` names the conversation member.
/// Element predicate: stop walking the conversation after an element for which it holds.
pub type Enough<'a> = Option<&'a dyn Fn(Value<'_>) -> bool>;

/// Scans `buf` (the body from offset 0) forward. `conv_key` names the
/// conversation member; with `enough`, the walk of its elements stops after the
/// first element it accepts (the head scan then ends `InConversation`).
pub fn scan_head(buf: &[u8], conv_key: &str, enough: Enough<'_>) -> Result<HeadScan, ScanError> {
    let mut out = HeadScan {
        members: Vec::new(),
        conv_elems: Vec::new(),
        conv_start: None,
        conv_key: None,
        opened: false,
        end: HeadEnd::InOther { at: 0 },
    };
    let mut i = json::skip_ws(buf, 0);
    match buf.get(i) {
        None => return Ok(out),
        Some(b'{') => {}
        Some(_) => return Err(ScanError::Malformed),
    }
    i = json::skip_ws(buf, i + 1);
    if buf.get(i) == Some(&b'}') {
        out.end = HeadEnd::Complete { end: i + 1 };
        return Ok(out);
    }
    loop {
        // key
        match buf.get(i) {
            None => {
                out.end = HeadEnd::InOther { at: i };
                return Ok(out);
            }
            Some(b'"') => {}
            Some(_) => return Err(ScanError::Malformed),
        }
        let key_end = match json::skip_string(buf, i) {
            Ok(e) => e,
            Err(Stop::Incomplete) => {
                out.end = HeadEnd::InOther { at: i };
                return Ok(out);
            }
            Err(Stop::Malformed) => return Err(ScanError::Malformed),
        };
        let key = Span::new(i + 1, key_end - 1);
        let colon = json::skip_ws(buf, key_end);
        match buf.get(colon) {
            None => {
                out.end = HeadEnd::InOther { at: i };
                return Ok(out);
            }
            Some(b':') => {}
            Some(_) => return Err(ScanError::Malformed),
        }
        let vs = json::skip_ws(buf, colon + 1);
        let is_conv = buf
            .get(key.start..key.end)
            .is_some_and(|k| json::key_eq(k, conv_key));
        let ve = if is_conv {
            out.conv_start = Some(vs);
            out.conv_key = Some(key);
            out.conv_elems.clear();
            scan_array_head(buf, vs, &mut out.conv_elems, enough, &mut out.opened)
        } else {
            json::skip_value(buf, vs)
        };
        let ve = match ve {
            Ok(e) => e,
            Err(Stop::Incomplete) => {
                out.end = if is_conv {
                    HeadEnd::InConversation { start: vs }
                } else {
                    HeadEnd::InOther { at: vs }
                };
                return Ok(out);
            }
            Err(Stop::Malformed) => return Err(ScanError::Malformed),
        };
        out.members.push(Member {
            key,
            value: Span::new(vs, ve),
        });
        i = json::skip_ws(buf, ve);
        match buf.get(i) {
            None => {
                out.end = HeadEnd::InOther { at: i };
                return Ok(out);
            }
            Some(b',') => i = json::skip_ws(buf, i + 1),
            Some(b'}') => {
                out.end = HeadEnd::Complete { end: i + 1 };
                return Ok(out);
            }
            Some(_) => return Err(ScanError::Malformed),
        }
    }
}

/// Walks an array forward from `[` at `i`, recording complete elements; a
/// non-array value is skipped whole.
fn scan_array_head(
    buf: &[u8],
    i: usize,
    elems: &mut Vec<Span>,
    enough: Enough<'_>,
    opened: &mut bool,
) -> Result<usize, Stop> {
    if buf.get(i) != Some(&b'[') {
        return json::skip_value(buf, i);
    }
    let mut j = json::skip_ws(buf, i + 1);
    if buf.get(j) == Some(&b']') {
        return Ok(j + 1);
    }
    loop {
        let e = json::skip_value(buf, j)?;
        elems.push(Span::new(j, e));
        if enough.is_some_and(|f| buf.get(j..e).is_some_and(|b| f(Value(b)))) {
            *opened = true;
            return Err(Stop::Incomplete);
        }
        j = json::skip_ws(buf, e);
        match buf.get(j) {
            None => return Err(Stop::Incomplete),
            Some(b',') => j = json::skip_ws(buf, j + 1),
            Some(b']') => return Ok(j + 1),
            Some(_) => return Err(Stop::Malformed),
        }
    }
}

/// Where the backward scan of the tail stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailEnd {
    /// Reached the object's opening brace at `start`.
    Complete { start: usize },
    /// The bytes ran out inside (or just before the key of) a value ending at
    /// `end`; `elems` are the complete trailing elements when it is an array.
    InValue {
        end: usize,
        is_array: bool,
        elems: Vec<Span>,
        walked: Walked,
    },
}

/// What a [`TailWalk`] found on its way back through an array, so the
/// caller need not ask its predicates again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Walked {
    /// The last element passed `turnlike`.
    pub turnlike: bool,
    /// The walk stopped at an element `enough` accepted (the first of `elems`).
    pub accepted: bool,
}

/// Result of the backward scan over the tail bytes (absolute offsets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailScan {
    /// Complete members in body order.
    pub members: Vec<Member>,
    pub end: TailEnd,
}

/// How the tail walks a trailing array (without one, every element is recorded).
#[derive(Clone, Copy)]
pub struct TailWalk<'a> {
    /// The walk stops after the first element (from the end) this accepts: the
    /// last turns are all the filter needs.
    pub enough: &'a dyn Fn(Value<'_>) -> bool,
    /// Whether an element could be a conversation entry. An array whose last
    /// element is not (a `tools` list after `messages`) is not the
    /// conversation: only that element is recorded and the rest is skipped
    /// whole, without looking at each element.
    pub turnlike: &'a dyn Fn(Value<'_>) -> bool,
}

/// Scans `buf`, the last bytes of the body starting at absolute offset `base`, backward.
pub fn scan_tail(
    buf: &[u8],
    base: usize,
    walk: Option<TailWalk<'_>>,
) -> Result<TailScan, ScanError> {
    let mut members = Vec::new();
    let mut e = json::skip_ws_back(buf, buf.len());
    match e.checked_sub(1).and_then(|k| buf.get(k)) {
        Some(b'}') => {}
        Some(_) => return Err(ScanError::Truncated),
        None => {
            let end = TailEnd::InValue {
                end: base + e,
                is_array: false,
                elems: Vec::new(),
                walked: Walked::default(),
            };
            return Ok(TailScan { members, end });
        }
    }
    e = json::skip_ws_back(buf, e - 1);
    if e > 0 && buf.get(e - 1) == Some(&b'{') {
        return Ok(TailScan {
            members,
            end: TailEnd::Complete {
                start: base + e - 1,
            },
        });
    }
    loop {
        let value_end = e;
        let mut elems = Vec::new();
        let mut walked = Walked::default();
        let is_array = buf.get(value_end.wrapping_sub(1)) == Some(&b']');
        let vs = if is_array {
            scan_array_tail(buf, value_end, &mut elems, walk, &mut walked)
        } else {
            json::skip_value_back(buf, value_end)
        };
        let incomplete = |elems: Vec<Span>| {
            let elems = elems.into_iter().rev().map(|s| s.shift(base)).collect();
            TailEnd::InValue {
                end: base + value_end,
                is_array,
                elems,
                walked,
            }
        };
        let vs = match vs {
            Ok(s) => s,
            Err(Stop::Incomplete) => {
                members.reverse();
                return Ok(TailScan {
                    members,
                    end: incomplete(elems),
                });
            }
            Err(Stop::Malformed) => return Err(ScanError::Malformed),
        };
        // `"key" :` before the value; running out here leaves the value keyless.
        let colon = json::skip_ws_back(buf, vs);
        let key_close = json::skip_ws_back(buf, colon.saturating_sub(1));
        let keyless = colon == 0 || key_close == 0;
        if keyless {
            members.reverse();
            return Ok(TailScan {
                members,
                end: incomplete(elems),
            });
        }
        if buf.get(colon - 1) != Some(&b':') || buf.get(key_close - 1) != Some(&b'"') {
            return Err(ScanError::Malformed);
        }
        let key_open = match json::skip_string_back(buf, key_close) {
            Ok(k) => k,
            Err(Stop::Incomplete) => {
                members.reverse();
                return Ok(TailScan {
                    members,
                    end: incomplete(elems),
                });
            }
            Err(Stop::Malformed) => return Err(ScanError::Malformed),
        };
        members.push(Member {
            key: Span::new(key_open + 1, key_close - 1).shift(base),
            value: Span::new(vs, value_end).shift(base),
        });
        let sep = json::skip_ws_back(buf, key_open);
        match sep.checked_sub(1).and_then(|k| buf.get(k)) {
            None => {
                members.reverse();
                let end = TailEnd::InValue {
                    end: base + sep,
                    is_array: false,
                    elems: Vec::new(),
                    walked: Walked::default(),
                };
                return Ok(TailScan { members, end });
            }
            Some(b',') => e = json::skip_ws_back(buf, sep - 1),
            Some(b'{') => {
                members.reverse();
                return Ok(TailScan {
                    members,
                    end: TailEnd::Complete {
                        start: base + sep - 1,
                    },
                });
            }
            Some(_) => return Err(ScanError::Malformed),
        }
    }
}

/// Walks an array backward from just after its `]`, recording complete
/// elements (last first); returns the index of its `[`.
fn scan_array_tail(
    buf: &[u8],
    end: usize,
    elems: &mut Vec<Span>,
    walk: Option<TailWalk<'_>>,
    walked: &mut Walked,
) -> Result<usize, Stop> {
    let mut j = json::skip_ws_back(buf, end - 1);
    if j > 0 && buf.get(j - 1) == Some(&b'[') {
        return Ok(j - 1);
    }
    loop {
        let s = json::skip_value_back(buf, j)?;
        elems.push(Span::new(s, j));
        if let Some(w) = walk {
            let value = buf.get(s..j).map(Value);
            if elems.len() == 1 {
                if !value.is_some_and(|v| (w.turnlike)(v)) {
                    return json::skip_value_back(buf, end);
                }
                walked.turnlike = true;
            }
            if value.is_some_and(|v| (w.enough)(v)) {
                walked.accepted = true;
                return Err(Stop::Incomplete);
            }
        }
        j = json::skip_ws_back(buf, s);
        match j.checked_sub(1).and_then(|k| buf.get(k)) {
            None => return Err(Stop::Incomplete),
            Some(b',') => j = json::skip_ws_back(buf, j - 1),
            // A walk that reached the start has every element: it stops
            // there too (what comes before is the head's to read).
            Some(b'[') if walk.is_some() => return Err(Stop::Incomplete),
            Some(b'[') => return Ok(j - 1),
            Some(_) => return Err(Stop::Malformed),
        }
    }
}

/// The body bytes the filter fetched: a head from offset 0 and a tail ending at
/// the body's end (empty when the head is the whole body).
#[derive(Debug, Clone, Default)]
pub struct View {
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
    pub tail_base: usize,
    pub size: usize,
}

impl View {
    /// The bytes of an absolute span, when fetched.
    pub fn bytes(&self, s: Span) -> Option<&[u8]> {
        if s.end <= self.head.len() {
            return self.head.get(s.start..s.end);
        }
        let start = s.start.checked_sub(self.tail_base)?;
        self.tail.get(start..s.end.checked_sub(self.tail_base)?)
    }

    pub fn value(&self, s: Span) -> Option<Value<'_>> {
        self.bytes(s).map(Value)
    }

    /// The first `n` bytes of the body (or fewer when fewer were fetched).
    pub fn prefix(&self, n: usize) -> &[u8] {
        self.head.get(..n.min(self.head.len())).unwrap_or_default()
    }

    /// True when the head holds the whole body.
    pub fn is_full(&self) -> bool {
        self.head.len() == self.size
    }
}

/// The conversation member, as far as it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conv {
    /// An array (`messages`, `input`, `prompt`): elements from its start and
    /// from its end; `all` when `first` holds every element (then `last` is empty).
    Array {
        first: Vec<Span>,
        last: Vec<Span>,
        all: bool,
        /// Index in `first` of the first entry that is not a preamble, when
        /// the head's walk stopped there (else the callers look).
        opening: Option<usize>,
    },
    /// A string (`input`, `prompt`): `prefix` covers the bytes read from its start.
    Text { prefix: Span },
}

impl Conv {
    /// Index in `first` of the first entry that is not a preamble: where the
    /// head's walk stopped when it stopped there, else the first such entry
    /// in view. `None` for a text conversation or when every entry in view is
    /// a preamble. (The head hash feeds entries up to it; the turn reads it
    /// as the opening turn.)
    pub fn opening_index(&self, api: Api, view: &View) -> Option<usize> {
        match self {
            Conv::Array {
                opening: Some(i), ..
            } => Some(*i),
            Conv::Array { first, .. } => first
                .iter()
                .position(|s| view.value(*s).is_some_and(|v| !api.is_preamble(v))),
            Conv::Text { .. } => None,
        }
    }

    /// The last `n` known elements in order (from `last`, or from `first` when all are known).
    pub fn last_elems(&self) -> &[Span] {
        match self {
            Conv::Array {
                first, last, all, ..
            } => {
                if *all {
                    first
                } else {
                    last
                }
            }
            Conv::Text { .. } => &[],
        }
    }
}

/// The scanned document: every top-level member except a cut conversation
/// array, plus what is known of the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doc {
    pub members: Vec<Member>,
    pub conv: Option<Conv>,
}

impl Doc {
    /// The last top-level member named `key` (parsers keep the last duplicate).
    pub fn member<'v>(&self, view: &'v View, key: &str) -> Option<Value<'v>> {
        self.members
            .iter()
            .rev()
            .find(|m| view.bytes(m.key).is_some_and(|k| json::key_eq(k, key)))
            .and_then(|m| view.value(m.value))
    }

    /// All top-level members named `key` (to strip client copies of fields we own).
    pub fn members_named<'d>(
        &'d self,
        view: &'d View,
        key: &'d str,
    ) -> impl Iterator<Item = &'d Member> + 'd {
        self.members
            .iter()
            .filter(move |m| view.bytes(m.key).is_some_and(|k| json::key_eq(k, key)))
    }
}

/// How much to read; see the crate docs for the defaults.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits {
    /// Bodies up to this size are read whole (exact turn count).
    pub full_max: usize,
    /// First head and tail sizes; each grows ×4 while a needed value is cut.
    pub head: usize,
    pub tail: usize,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            full_max: 32 * 1024,
            head: 16 * 1024,
            tail: 16 * 1024,
        }
    }
}

/// What [`read_doc`] did, for counters and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Bytes copied out of the host.
    pub fetched: usize,
    /// Head/tail growth rounds after the first.
    pub regrows: u32,
    /// The whole body was read.
    pub full: bool,
    /// The whole body was read although it is over `full_max` (a needed value sat in the middle).
    pub middle: bool,
}

/// How the tail walks a conversation: back to the last assistant (or
/// preamble) entry before the turn that just ended ([`ApiShape::ends_tail_walk`]),
/// recognising the conversation by its last entry.
macro_rules! tail_walk {
    ($api:expr) => {
        TailWalk {
            enough: &|v| $api.ends_tail_walk(v),
            turnlike: &|v| $api.looks_like_turn(v),
        }
    };
}

/// Reads the document of a body of `size` bytes through `fetch(start, len)`.
pub fn read_doc(
    api: Api,
    size: usize,
    limits: ReadLimits,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
) -> Result<(View, Doc, ReadStats), ScanError> {
    let mut stats = ReadStats::default();
    if size <= limits.full_max {
        return read_full(api, size, fetch, stats).map(|(v, d, mut s)| {
            s.middle = false;
            (v, d, s)
        });
    }
    let (mut head_len, mut tail_len) = (limits.head.max(1), limits.tail.max(1));
    let mut head: Vec<u8> = Vec::new();
    let mut tail: Vec<u8> = Vec::new();
    loop {
        // When the ends would cover the body, read all of it; and once they
        // had to grow and would cover half of it: one forward scan of the
        // whole costs less than walking most of it from both ends again.
        let ends = head_len.saturating_add(tail_len);
        if ends >= size && stats.regrows == 0 {
            // A body the first two ends already cover needed nothing from a
            // middle: fetched whole, but read from its ends all the same.
            return read_small(api, size, fetch, stats);
        }
        if ends >= size || (stats.regrows > 0 && ends.saturating_mul(2) >= size) {
            stats.middle = true;
            return read_full(api, size, fetch, stats);
        }
        if head.len() != head_len {
            head = fetch_exact(fetch, 0, head_len, &mut stats)?;
        }
        let tail_base = size - tail_len;
        if tail.len() != tail_len {
            tail = fetch_exact(fetch, tail_base, tail_len, &mut stats)?;
        }
        let hs = scan_head(
            &head,
            api.conversation_key(),
            Some(&|v| !api.is_preamble(v)),
        )?;
        let ts = scan_tail(&tail, tail_base, Some(tail_walk!(api)))?;
        let view = View {
            head,
            tail,
            tail_base,
            size,
        };
        match meet(api, hs, ts, &view) {
            Meeting::Met(doc) => return Ok((view, doc, stats)),
            Meeting::Whole => {
                // One end saw the whole object although the ends do not
                // overlap: only whitespace or garbage lies beyond; read it all to decide.
                stats.middle = true;
                return read_full(api, size, fetch, stats);
            }
            Meeting::Grow {
                head: need_head,
                tail: need_tail,
            } => {
                let View {
                    head: h, tail: t, ..
                } = view;
                head = h;
                tail = t;
                if need_head {
                    head_len = head_len.saturating_mul(4);
                }
                if need_tail {
                    tail_len = tail_len.saturating_mul(4);
                }
                stats.regrows += 1;
            }
        }
    }
}

/// What the two ends' scans say together.
enum Meeting {
    /// They meet inside the conversation: the document (members from both ends).
    Met(Doc),
    /// Read more of one end or both.
    Grow { head: bool, tail: bool },
    /// One end saw the whole object: only a whole read decides.
    Whole,
}

fn meet(api: Api, hs: HeadScan, ts: TailScan, view: &View) -> Meeting {
    let conv_is_text =
        matches!(hs.end, HeadEnd::InConversation { start } if view.head.get(start) == Some(&b'"'));
    let need_head = match hs.end {
        HeadEnd::Complete { .. } => false,
        HeadEnd::InOther { .. } => true,
        // The head's walk stops at the first entry that is not a preamble.
        HeadEnd::InConversation { .. } => !conv_is_text && !hs.opened,
    };
    let need_tail = match &ts.end {
        TailEnd::Complete { .. } => false,
        TailEnd::InValue {
            is_array: true,
            elems,
            walked,
            ..
        } => {
            // The last entry must look like a turn; when tool results end the
            // conversation, the assistant entry that called them must be in
            // view too (an entry the walk stopped at ends the run).
            !walked.turnlike
                || !walked.accepted
                    && !elems
                        .first()
                        .and_then(|s| view.value(*s))
                        .is_some_and(|v| api.ends_turn_run(v))
        }
        TailEnd::InValue {
            is_array: false, ..
        } => !conv_is_text,
    };
    if let (HeadEnd::Complete { .. }, _) | (_, TailEnd::Complete { .. }) = (&hs.end, &ts.end) {
        return Meeting::Whole;
    }
    if need_head || need_tail {
        return Meeting::Grow {
            head: need_head,
            tail: need_tail,
        };
    }
    let conv = match (hs.end, ts.end) {
        (
            HeadEnd::InConversation { start },
            TailEnd::InValue {
                is_array: true,
                elems,
                ..
            },
        ) if view.head.get(start) == Some(&b'[') => Some(Conv::Array {
            opening: hs.opened.then(|| hs.conv_elems.len().saturating_sub(1)),
            first: hs.conv_elems,
            last: elems,
            all: false,
        }),
        (HeadEnd::InConversation { start }, TailEnd::InValue { .. }) => Some(Conv::Text {
            prefix: Span::new(start, view.head.len()),
        }),
        _ => None,
    };
    let mut members = hs.members;
    members.extend(ts.members);
    Meeting::Met(Doc { members, conv })
}

/// A body the first two ends cover, fetched whole and read from its two ends
/// as a long one is, so a small conversation is not walked entry by entry:
/// the middle of the conversation is trusted to be well formed, as a long
/// body's unread middle is (walking it cost as much as the rest of the
/// decision). When the ends do not meet inside one conversation array the
/// body is scanned whole, as before.
fn read_small(
    api: Api,
    size: usize,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    mut stats: ReadStats,
) -> Result<(View, Doc, ReadStats), ScanError> {
    let view = fetch_whole(size, fetch, &mut stats)?;
    let ends = scan_head(
        &view.head,
        api.conversation_key(),
        Some(&|v| !api.is_preamble(v)),
    )
    .and_then(|hs| Ok((hs, scan_tail(&view.head, 0, Some(tail_walk!(api)))?)));
    if let Ok((hs, ts)) = ends {
        let conv = match (&hs.end, &ts.end, hs.conv_key) {
            (
                HeadEnd::InConversation { start },
                TailEnd::InValue {
                    end,
                    is_array: true,
                    ..
                },
                Some(key),
            ) if start < end && view.head.get(*start) == Some(&b'[') => Some(Member {
                key,
                value: Span::new(*start, *end),
            }),
            _ => None,
        };
        let before = hs.members.len();
        if let (Some(conv), Meeting::Met(mut doc)) = (conv, meet(api, hs, ts, &view)) {
            // The whole body is at hand: the conversation is a member as in a
            // whole walk (the rewrite rebuilds members up to its cut from them).
            doc.members.insert(before, conv);
            return Ok((view, doc, stats));
        }
    }
    let doc = scan_full(&view.head, api)?;
    Ok((view, doc, stats))
}

fn fetch_exact(
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    start: usize,
    len: usize,
    stats: &mut ReadStats,
) -> Result<Vec<u8>, ScanError> {
    let bytes = fetch(start, len).ok_or(ScanError::Unavailable)?;
    if bytes.len() != len {
        return Err(ScanError::Unavailable);
    }
    stats.fetched += len;
    Ok(bytes)
}

fn read_full(
    api: Api,
    size: usize,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    mut stats: ReadStats,
) -> Result<(View, Doc, ReadStats), ScanError> {
    let view = fetch_whole(size, fetch, &mut stats)?;
    let doc = scan_full(&view.head, api)?;
    Ok((view, doc, stats))
}

/// The whole body, fetched once, as a view whose head is all of it.
fn fetch_whole(
    size: usize,
    fetch: &mut dyn FnMut(usize, usize) -> Option<Vec<u8>>,
    stats: &mut ReadStats,
) -> Result<View, ScanError> {
    let head = if size == 0 {
        Vec::new()
    } else {
        fetch_exact(fetch, 0, size, stats)?
    };
    stats.full = true;
    Ok(View {
        head,
        tail: Vec::new(),
        tail_base: size,
        size,
    })
}

/// Scans a whole body (the head scan over all of it).
pub fn scan_full(body: &[u8], api: Api) -> Result<Doc, ScanError> {
    let hs = scan_head(body, api.conversation_key(), None)?;
    match hs.end {
        HeadEnd::Complete { end } => {
            if json::skip_ws(body, end) != body.len() {
                return Err(ScanError::Malformed);
            }
        }
        HeadEnd::InConversation { .. } | HeadEnd::InOther { .. } => {
            return Err(ScanError::Truncated);
        }
    }
    let conv = hs.conv_start.and_then(|start| match body.get(start) {
        Some(b'[') => Some(Conv::Array {
            first: hs.conv_elems,
            last: Vec::new(),
            all: true,
            opening: None,
        }),
        Some(b'"') => hs
            .members
            .iter()
            .find(|m| m.value.start == start)
            .map(|m| Conv::Text { prefix: m.value }),
        _ => None,
    });
    Ok(Doc {
        members: hs.members,
        conv,
    })
}

// proptest is a native-only dev-dependency (see Cargo.toml).
#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests;
