//! The byte seam between the policy and the copy engine: checksummed payloads and the [`Mover`] trait.
//!
//! The policy decides *which* device slots move; a [`Mover`] moves their bytes (the
//! engine's paged KV cache and linear-state pool, through a `copy::KvCopy` backend).
//! Offload is gather → [`Payload::seal`] (xxh3-128) → host store; restore is
//! [`Payload::verify`] → scatter. [`MetadataOnly`] moves no bytes, for simulations
//! that only need the policy's decisions.

use thiserror::Error;
use xxhash_rust::xxh3::xxh3_128;

/// Index of a KV block slot in the device block pool (vLLM's block id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

/// Index of a linear-state snapshot slot on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateSlot(pub u32);

/// Bytes of one block or state snapshot held by the host tier, with their checksum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Payload {
    bytes: Box<[u8]>,
    checksum: u128,
}

/// A payload whose bytes no longer match the checksum taken at offload.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("payload checksum mismatch")]
pub struct ChecksumMismatch;

impl Payload {
    /// Takes ownership of gathered bytes and records their xxh3-128 checksum.
    pub fn seal(bytes: Vec<u8>) -> Self {
        let checksum = xxh3_128(&bytes);
        Self {
            bytes: bytes.into_boxed_slice(),
            checksum,
        }
    }

    /// The bytes, if they still match their checksum.
    pub fn verify(&self) -> Result<&[u8], ChecksumMismatch> {
        if xxh3_128(&self.bytes) == self.checksum {
            Ok(&self.bytes)
        } else {
            Err(ChecksumMismatch)
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True for a payload of no bytes (what [`MetadataOnly`] produces).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Mutable access to the stored bytes *without* updating the checksum: simulates
    /// host-memory corruption or a torn write in fault-injection tests.
    pub fn bytes_mut_unchecked(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// A mover could not copy bytes (a partial restore is treated as a miss).
#[derive(Debug, Error)]
#[error("KV move failed: {0}")]
pub struct MoveError(pub String);

/// Moves KV blocks and state snapshots between device slots and host memory.
///
/// `gather_*` returns the slots' bytes concatenated in list order, every slot the same
/// size; `scatter_*` writes such a buffer back. The policy splits and joins per slot.
pub trait Mover {
    /// Copies the given KV block slots into one contiguous buffer.
    fn gather_blocks(&mut self, slots: &[SlotId]) -> Result<Vec<u8>, MoveError>;
    /// Writes a buffer produced by `gather_blocks` (possibly for other slots) into `slots`.
    fn scatter_blocks(&mut self, slots: &[SlotId], data: &[u8]) -> Result<(), MoveError>;
    /// Copies the given state snapshots into one contiguous buffer.
    fn gather_states(&mut self, slots: &[StateSlot]) -> Result<Vec<u8>, MoveError>;
    /// Writes state snapshots back into `slots`.
    fn scatter_states(&mut self, slots: &[StateSlot], data: &[u8]) -> Result<(), MoveError>;
}

/// A mover for policy-only simulation: no bytes move, payloads are empty.
#[derive(Clone, Copy, Debug, Default)]
pub struct MetadataOnly;

impl Mover for MetadataOnly {
    fn gather_blocks(&mut self, _: &[SlotId]) -> Result<Vec<u8>, MoveError> {
        Ok(Vec::new())
    }
    fn scatter_blocks(&mut self, _: &[SlotId], _: &[u8]) -> Result<(), MoveError> {
        Ok(())
    }
    fn gather_states(&mut self, _: &[StateSlot]) -> Result<Vec<u8>, MoveError> {
        Ok(Vec::new())
    }
    fn scatter_states(&mut self, _: &[StateSlot], _: &[u8]) -> Result<(), MoveError> {
        Ok(())
    }
}

/// Splits a gathered buffer into `n` equal per-slot payloads.
pub(crate) fn split(data: Vec<u8>, n: usize) -> Result<Vec<Payload>, MoveError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if !data.len().is_multiple_of(n) {
        return Err(MoveError(format!(
            "gathered {} bytes for {n} slots",
            data.len()
        )));
    }
    let each = data.len() / n;
    if each == 0 {
        return Ok((0..n).map(|_| Payload::seal(Vec::new())).collect());
    }
    Ok(data
        .chunks_exact(each)
        .map(|c| Payload::seal(c.to_vec()))
        .collect())
}
