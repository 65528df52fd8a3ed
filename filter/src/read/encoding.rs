//! Compressed request bodies: which `content-encoding` the filter decodes
//! (gzip, deflate, zstd) and the decoding itself, bounded in output so a
//! small body cannot inflate into gigabytes inside the VM.

use crate::read::identity::Headers;
use std::io::Read;

/// An encoding the filter decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `gzip` / `x-gzip` (RFC 1952; concatenated members are read in turn).
    Gzip,
    /// `deflate`: the zlib format (RFC 1950), as HTTP defines it.
    Deflate,
    /// `zstd` (RFC 8878; concatenated frames are read in turn).
    Zstd,
}

/// What a request's `content-encoding` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentEncoding {
    /// Absent, empty or `identity`.
    Identity,
    Decodable(Encoding),
    /// Anything else (`br`, a list of codings, a repeated header).
    Other,
}

/// The request's content coding, from its (lower-case) headers.
pub fn of(headers: &Headers) -> ContentEncoding {
    let mut values = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("content-encoding"));
    let Some((_, v)) = values.next() else {
        return ContentEncoding::Identity;
    };
    if values.next().is_some() {
        return ContentEncoding::Other;
    }
    let v = v.trim_ascii();
    let is = |name: &[u8]| v.eq_ignore_ascii_case(name);
    if v.is_empty() || is(b"identity") {
        ContentEncoding::Identity
    } else if is(b"gzip") || is(b"x-gzip") {
        ContentEncoding::Decodable(Encoding::Gzip)
    } else if is(b"deflate") {
        ContentEncoding::Decodable(Encoding::Deflate)
    } else if is(b"zstd") {
        ContentEncoding::Decodable(Encoding::Zstd)
    } else {
        ContentEncoding::Other
    }
}

/// Why a body could not be decoded; both carry what was decoded before the
/// stop (at most the output bound), which feeds the fallback key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The decoded body would exceed the output bound (`max_decompressed_bytes`).
    TooLarge { prefix: Vec<u8> },
    /// Bad magic, a corrupt or truncated stream, a bad checksum.
    Corrupt { prefix: Vec<u8> },
}

/// Decodes `input` into at most `max_out` bytes.
pub fn decode(enc: Encoding, input: &[u8], max_out: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    let limit = u64::try_from(max_out).unwrap_or(u64::MAX).saturating_add(1);
    let read = match enc {
        Encoding::Gzip => flate2::read::MultiGzDecoder::new(input)
            .take(limit)
            .read_to_end(&mut out)
            .map(|_| ()),
        Encoding::Deflate => flate2::read::ZlibDecoder::new(input)
            .take(limit)
            .read_to_end(&mut out)
            .map(|_| ()),
        Encoding::Zstd => zstd_frames(input, limit, &mut out),
    };
    if out.len() > max_out {
        out.truncate(max_out);
        return Err(DecodeError::TooLarge { prefix: out });
    }
    match read {
        Ok(()) => Ok(out),
        Err(_) => Err(DecodeError::Corrupt { prefix: out }),
    }
}

/// Every zstd frame of `input`, appended to `out` up to `limit` bytes in all.
fn zstd_frames(mut input: &[u8], limit: u64, out: &mut Vec<u8>) -> std::io::Result<()> {
    loop {
        let left = limit.saturating_sub(out.len() as u64);
        let frame = ruzstd::decoding::StreamingDecoder::new(&mut input)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
        frame.take(left).read_to_end(out)?;
        if input.is_empty() || out.len() as u64 >= limit {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests;
