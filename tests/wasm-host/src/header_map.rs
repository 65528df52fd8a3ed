//! Ordered header maps with Envoy's rules and the ABI's serialized pair format.
//!
//! Wire format (all integers u32 little-endian): `count`, then `count` pairs of
//! `(key_len, value_len)`, then each key and value followed by a NUL byte.

#[cfg(test)]
mod tests;

/// A header map as Envoy keeps it: insertion-ordered, names lower-cased,
/// values raw bytes, repeated names allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderMap {
    entries: Vec<(String, Vec<u8>)>,
}

/// The serialized pair list was malformed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed serialized header map: {0}")]
pub struct PairsError(&'static str);

impl HeaderMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a map from pairs, lower-casing names as Envoy does.
    pub fn from_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let mut map = Self::new();
        for (k, v) in pairs {
            map.add(k.as_ref(), v.as_ref());
        }
        map
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// The first value of `name` (Envoy returns the first of repeated headers).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        let name = lower(name);
        self.entries
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of `name` as text, if it is UTF-8.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name.as_bytes())
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Appends a value, keeping existing ones.
    pub fn add(&mut self, name: &[u8], value: &[u8]) {
        self.entries.push((lower(name), value.to_vec()));
    }

    /// Sets `name` to exactly one value, at the position of its first occurrence.
    pub fn replace(&mut self, name: &[u8], value: &[u8]) {
        let name = lower(name);
        match self.entries.iter().position(|(k, _)| *k == name) {
            Some(first) => {
                self.entries[first].1 = value.to_vec();
                let mut index = 0;
                self.entries.retain(|(k, _)| {
                    let keep = index <= first || *k != name;
                    index += 1;
                    keep
                });
            }
            None => self.entries.push((name, value.to_vec())),
        }
    }

    /// Removes every value of `name`.
    pub fn remove(&mut self, name: &[u8]) {
        let name = lower(name);
        self.entries.retain(|(k, _)| *k != name);
    }

    /// Serializes into the ABI pair format.
    pub fn serialize(&self) -> Vec<u8> {
        let size = 4 + self
            .entries
            .iter()
            .map(|(k, v)| 10 + k.len() + v.len())
            .sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (k, v) in &self.entries {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        }
        for (k, v) in &self.entries {
            out.extend_from_slice(k.as_bytes());
            out.push(0);
            out.extend_from_slice(v);
            out.push(0);
        }
        out
    }

    /// Parses the ABI pair format; an empty input is an empty map.
    pub fn deserialize(bytes: &[u8]) -> Result<Self, PairsError> {
        Ok(Self::from_pairs(decode_pairs(bytes)?))
    }
}

/// A raw (name, value) pair as it is on the wire.
pub type Pair = (Vec<u8>, Vec<u8>);

/// Decodes serialized pairs without interpreting names.
pub fn decode_pairs(bytes: &[u8]) -> Result<Vec<Pair>, PairsError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let count = read_u32(bytes, 0).ok_or(PairsError("truncated count"))? as usize;
    let sizes_end = count
        .checked_mul(8)
        .and_then(|n| n.checked_add(4))
        .filter(|&end| end <= bytes.len())
        .ok_or(PairsError("count exceeds the data"))?;
    let mut pos = sizes_end;
    let mut pairs = Vec::with_capacity(count);
    for i in 0..count {
        let key_len = read_u32(bytes, 4 + i * 8).ok_or(PairsError("truncated sizes"))? as usize;
        let value_len = read_u32(bytes, 8 + i * 8).ok_or(PairsError("truncated sizes"))? as usize;
        let key = take(bytes, &mut pos, key_len)?;
        let value = take(bytes, &mut pos, value_len)?;
        pairs.push((key, value));
    }
    Ok(pairs)
}

fn take(bytes: &[u8], pos: &mut usize, len: usize) -> Result<Vec<u8>, PairsError> {
    let end = pos.checked_add(len).ok_or(PairsError("length overflow"))?;
    let slice = bytes
        .get(*pos..end)
        .ok_or(PairsError("string runs past the end"))?;
    if bytes.get(end) != Some(&0) {
        return Err(PairsError("string is not NUL-terminated"));
    }
    *pos = end + 1;
    Ok(slice.to_vec())
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw))
}

fn lower(name: &[u8]) -> String {
    String::from_utf8_lossy(name).to_ascii_lowercase()
}
