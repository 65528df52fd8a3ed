//! The worker side: gathers vLLM's KV pages into checksummed host payloads and scatters
//! them back, through the copy engine (CPU reference backend, or CUDA when the cache is
//! on a GPU), with the GIL released.
//!
//! Host payloads live in one [`SlotArena`] (a slot per block) and a pull's READs land in
//! another (the staging region), so a NIXL agent registers each once and a holder can
//! name a payload to a puller by address (docs/vllm.md, "State pull (NIXL)").

use crate::arena::SlotArena;
use crate::{CallerError, fault_err, hash_id};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use tether_engine::BlockHash;
use tether_kvcopy::{
    BlockId, ChunkMap, CpuCopy, CudaCopy, CudaCopyConfig, DeviceBuffer, DeviceTensor, Dtype,
    KvCacheSpec, KvCopy, KvLayout, PagedView, cuda_driver_present,
};
use xxhash_rust::xxh3::xxh3_128;

/// True when a CUDA driver library loads here (nothing else is touched).
#[pyfunction]
pub fn cuda_available() -> bool {
    cuda_driver_present()
}

enum Backend {
    Cpu,
    Cuda {
        copy: Box<CudaCopy>,
        staging: Option<DeviceBuffer>,
    },
}

/// A host payload: its slot in the arena and the xxh3-128 of its bytes at save.
#[derive(Clone, Copy)]
struct Held {
    slot: u32,
    checksum: u128,
}

/// One worker's KV cache (every layer's view, one layout) and its host payloads.
#[pyclass(module = "tether_vllm._native")]
pub struct KvCopier {
    backend: Backend,
    map: ChunkMap,
    /// Base address of each layer's view.
    ptrs: Vec<u64>,
    store: HashMap<BlockHash, Held>,
    /// The host tier's payload bytes, one slot per block.
    arena: SlotArena,
    /// Where a pull's READs land before they are verified and scattered.
    staging: SlotArena,
    /// Payloads saved since the last `take_saved`: (id, address, checksum).
    saved: Vec<(BlockHash, u64, u128)>,
    /// Saves skipped because every arena slot was in use.
    arena_full: u64,
}

/// Arena slots for a host tier of `host_bytes`: one per block it can hold, plus room for
/// payloads a lease keeps after the ledger let them go (at least 16, an eighth more).
fn host_slots(host_bytes: u64, block_bytes: usize) -> usize {
    let blocks = (host_bytes as usize).div_ceil(block_bytes.max(1));
    if blocks == 0 {
        return 0;
    }
    blocks + (blocks / 8).max(16)
}

// SAFETY: the raw addresses are plain integers here; every dereference happens inside a
// method that holds `&mut self` (one thread at a time), and the Python side keeps the
// tensors alive for the copier's lifetime (`TetherConnector.register_kv_caches`).
unsafe impl Send for KvCopier {}
// SAFETY: no method reads or writes through the addresses from `&self`.
unsafe impl Sync for KvCopier {}

fn dtype(elem_bytes: usize) -> PyResult<Dtype> {
    match elem_bytes {
        2 => Ok(Dtype::Bf16), // f16 and bf16 move alike: copies are type-agnostic
        1 => Ok(Dtype::Fp8),
        n => Err(CallerError::new_err(format!(
            "KV element size {n} bytes is not supported (2: fp16/bf16, 1: fp8)"
        ))),
    }
}

#[pymethods]
impl KvCopier {
    /// `ptrs`: each layer view's data address; `available`: bytes addressable from each
    /// (storage bytes after the view's offset); the view is logical `[num_blocks,
    /// num_kv_heads, block_size, 2*head_size]` with element strides `(block, head, token)`
    /// and a unit last stride. `device`: `"cpu"` or `"cuda"` (with `device_index`).
    /// `host_bytes`: the host tier's capacity, which sizes the payload arena (None: one
    /// slot per device block); `staging_bytes`: the pull staging region (0: none).
    #[new]
    #[pyo3(signature = (ptrs, available, num_blocks, block_size, num_kv_heads, head_size,
        strides, elem_bytes, device="cpu", device_index=0, host_bytes=None, staging_bytes=0))]
    #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new(
        ptrs: Vec<u64>,
        available: Vec<usize>,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_size: usize,
        strides: (usize, usize, usize),
        elem_bytes: usize,
        device: &str,
        device_index: usize,
        host_bytes: Option<u64>,
        staging_bytes: u64,
    ) -> PyResult<Self> {
        let view = PagedView {
            num_kv_heads,
            head_size,
            block_stride: strides.0,
            head_stride: strides.1,
            token_stride: strides.2,
        };
        let spec = KvCacheSpec::try_new(
            KvLayout::Paged(view),
            dtype(elem_bytes)?,
            ptrs.len(),
            num_blocks,
            block_size,
        )
        .map_err(|e| fault_err(e.fault(), e))?;
        let map = spec.chunk_map();
        if available.len() != ptrs.len() {
            return Err(CallerError::new_err("ptrs and available differ in length"));
        }
        if let Some((i, &have)) = available
            .iter()
            .enumerate()
            .find(|(_, a)| **a < map.tensor_bytes())
        {
            return Err(CallerError::new_err(format!(
                "layer {i}: view reaches {} bytes, its storage holds {have}",
                map.tensor_bytes()
            )));
        }
        let backend = match device {
            "cpu" => {
                // Mutable slices over overlapping memory would alias: the CPU path takes
                // disjoint per-layer views only (vLLM's default layer-compact layouts).
                let mut spans: Vec<(u64, u64)> = ptrs
                    .iter()
                    .map(|&p| (p, p + map.tensor_bytes() as u64))
                    .collect();
                spans.sort_unstable();
                if spans.windows(2).any(|w| w[1].0 < w[0].1) {
                    return Err(CallerError::new_err(
                        "layer views overlap (a cross-layer layout): the CPU path needs disjoint views",
                    ));
                }
                Backend::Cpu
            }
            "cuda" => {
                let copy = CudaCopy::new(CudaCopyConfig {
                    ordinal: device_index,
                    ..CudaCopyConfig::default()
                })
                .map_err(|e| fault_err(e.fault(), e))?;
                Backend::Cuda {
                    copy: Box::new(copy),
                    staging: None,
                }
            }
            other => {
                return Err(CallerError::new_err(format!(
                    "device {other:?}: expected \"cpu\" or \"cuda\""
                )));
            }
        };
        let each = map.block_bytes();
        let slots = match host_bytes {
            Some(b) => host_slots(b, each),
            None => num_blocks,
        };
        let arena = SlotArena::new(slots, each)
            .map_err(|e| CallerError::new_err(format!("host payload arena: {e}")))?;
        let staging = SlotArena::new(staging_bytes as usize / each.max(1), each)
            .map_err(|e| CallerError::new_err(format!("pull staging region: {e}")))?;
        Ok(Self {
            backend,
            map,
            ptrs,
            store: HashMap::new(),
            arena,
            staging,
            saved: Vec::new(),
            arena_full: 0,
        })
    }

    /// Bytes of one block across all layers (one host payload).
    #[getter]
    fn block_bytes(&self) -> usize {
        self.map.block_bytes()
    }

    /// Host payload bytes held.
    #[getter]
    fn stored_bytes(&self) -> usize {
        self.store.len() * self.map.block_bytes()
    }

    /// Saves skipped because every slot of the payload arena was in use (a future miss).
    #[getter]
    fn arena_full(&self) -> u64 {
        self.arena_full
    }

    /// `(address, bytes)` of the payload arena and of the staging region: what a NIXL
    /// agent registers (a region of 0 bytes is not registered).
    fn regions(&self) -> ((u64, usize), (u64, usize)) {
        (self.arena.region(), self.staging.region())
    }

    /// Payloads saved since the last call: `(16-byte id, address, checksum)` each, what
    /// the scheduler needs to lease them.
    fn take_saved<'py>(&mut self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, u64, u128)> {
        std::mem::take(&mut self.saved)
            .into_iter()
            .map(|(h, addr, sum)| (PyBytes::new(py, &h.0.to_le_bytes()), addr, sum))
            .collect()
    }

    /// Host payloads held.
    fn __len__(&self) -> usize {
        self.store.len()
    }

    /// True when the payload of this block hash is held.
    fn contains(&self, block_hash: &Bound<'_, PyBytes>) -> bool {
        self.store.contains_key(&hash_id(block_hash.as_bytes()))
    }

    /// Copies `block_ids` to host payloads named by `block_hashes` (checksummed);
    /// payloads already held are kept. Returns the bytes copied.
    fn save(
        &mut self,
        py: Python<'_>,
        block_ids: Vec<u32>,
        block_hashes: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<usize> {
        let hashes = paired(&block_ids, &block_hashes)?;
        let todo: Vec<(BlockId, BlockHash)> = block_ids
            .into_iter()
            .zip(hashes)
            .filter(|(_, h)| !self.store.contains_key(h))
            .collect();
        if todo.is_empty() {
            return Ok(0);
        }
        let ids: Vec<BlockId> = todo.iter().map(|(b, _)| *b).collect();
        let staging = py
            .detach(|| self.gather(&ids))
            .map_err(|e| fault_err(e.fault(), e))?;
        let each = self.map.block_bytes();
        for ((_, h), bytes) in todo.iter().zip(staging.chunks_exact(each)) {
            let Some(slot) = self.arena.alloc() else {
                self.arena_full += 1;
                continue;
            };
            self.arena.bytes_mut(slot).copy_from_slice(bytes);
            let checksum = xxh3_128(bytes);
            self.store.insert(*h, Held { slot, checksum });
            self.saved.push((*h, self.arena.addr(slot), checksum));
        }
        Ok(staging.len())
    }

    /// Restores host payloads into `block_ids`: verifies each payload's checksum, copies
    /// the verified leading run, and returns its length (== len(block_ids) when all were
    /// good). A missing or corrupt payload ends the run; corrupt ones are freed.
    fn load(
        &mut self,
        py: Python<'_>,
        block_ids: Vec<u32>,
        block_hashes: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<usize> {
        let hashes = paired(&block_ids, &block_hashes)?;
        let held: Vec<Held> = hashes
            .iter()
            .map_while(|h| self.store.get(h).copied())
            .collect();
        let payloads = held.iter().map(|p| (self.arena.bytes(p.slot), p.checksum));
        let (staging, good) = verified_run(payloads, self.map.block_bytes());
        if good < held.len() {
            // Held but corrupt: freed, so it is never offered again.
            self.free_one(hashes[good]);
        }
        self.scatter_run(py, &block_ids[..good], &staging)
    }

    /// Frees the payloads of these 16-byte ids (what `Ledger.take_freed` returns).
    fn free(&mut self, ids: Vec<Bound<'_, PyBytes>>) {
        for b in ids {
            self.free_one(hash_id(b.as_bytes()));
        }
    }

    /// Flips one byte of a held payload without updating its checksum (fault injection
    /// for tests: host-memory corruption). Returns false when it is not held.
    fn corrupt(&mut self, block_hash: &Bound<'_, PyBytes>) -> bool {
        match self.store.get(&hash_id(block_hash.as_bytes())).copied() {
            Some(held) if self.arena.slot_bytes() > 0 => {
                self.arena.bytes_mut(held.slot)[0] ^= 0x5A;
                true
            }
            _ => false,
        }
    }

    /// `n` staging slots for a pull's READs, as `(slot, address)` pairs, or None (and
    /// none taken) when fewer are free.
    fn staging_alloc(&mut self, n: usize) -> Option<Vec<(u32, u64)>> {
        let slots = self.staging.alloc_n(n)?;
        Some(
            slots
                .into_iter()
                .map(|s| (s, self.staging.addr(s)))
                .collect(),
        )
    }

    /// Hands staging slots back (after their READ completed or was given up).
    fn staging_free(&mut self, slots: Vec<u32>) {
        for s in slots {
            self.staging.release(s);
        }
    }

    /// Zeroes a staging slot from byte `start` on (fault injection: what a READ that
    /// ended early leaves behind).
    fn staging_poison(&mut self, slot: u32, start: usize) -> PyResult<()> {
        self.staging_slot(slot)?;
        let bytes = self.staging.bytes_mut(slot);
        let from = start.min(bytes.len());
        bytes[from..].fill(0);
        Ok(())
    }

    /// Restores pulled payloads: verifies each staging slot against the checksum the
    /// holder's lease gave, scatters the verified leading run into `block_ids`, and
    /// returns its length (== len(block_ids) when all were good). The slots stay taken.
    fn load_staged(
        &mut self,
        py: Python<'_>,
        block_ids: Vec<u32>,
        slots: Vec<u32>,
        checksums: Vec<u128>,
    ) -> PyResult<usize> {
        if block_ids.len() != slots.len() || slots.len() != checksums.len() {
            return Err(CallerError::new_err(
                "block_ids, slots and checksums differ in length",
            ));
        }
        for &slot in &slots {
            self.staging_slot(slot)?;
        }
        let payloads = slots
            .iter()
            .zip(&checksums)
            .map(|(&slot, &sum)| (self.staging.bytes(slot), sum));
        let (staging, good) = verified_run(payloads, self.map.block_bytes());
        self.scatter_run(py, &block_ids[..good], &staging)
    }
}

/// The leading run of `payloads` whose bytes match their checksum, concatenated, and
/// its length: what a restore may scatter (`each`: one payload's bytes).
fn verified_run<'a>(
    payloads: impl ExactSizeIterator<Item = (&'a [u8], u128)>,
    each: usize,
) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(payloads.len() * each);
    let mut good = 0;
    for (bytes, sum) in payloads {
        if xxh3_128(bytes) != sum {
            break;
        }
        out.extend_from_slice(bytes);
        good += 1;
    }
    (out, good)
}

impl KvCopier {
    fn free_one(&mut self, h: BlockHash) {
        if let Some(held) = self.store.remove(&h) {
            self.arena.release(held.slot);
        }
    }

    /// Scatters verified payload bytes into `ids` with the GIL released; returns how many.
    fn scatter_run(&mut self, py: Python<'_>, ids: &[u32], staging: &[u8]) -> PyResult<usize> {
        py.detach(|| self.scatter(ids, staging))
            .map_err(|e| fault_err(e.fault(), e))?;
        Ok(ids.len())
    }

    fn staging_slot(&self, slot: u32) -> PyResult<()> {
        let (_, len) = self.staging.region();
        if (slot as usize + 1) * self.staging.slot_bytes() > len {
            return Err(CallerError::new_err(format!(
                "staging slot {slot} out of range"
            )));
        }
        Ok(())
    }

    fn gather(&mut self, ids: &[BlockId]) -> Result<Vec<u8>, tether_kvcopy::CopyError> {
        let need = self.map.staging_bytes(ids.len())?;
        let mut out = vec![0u8; need];
        match &mut self.backend {
            Backend::Cpu => {
                let len = self.map.tensor_bytes();
                // SAFETY: each address is the start of a live view of at least `len`
                // bytes (checked against its storage at construction; the connector keeps
                // the tensors alive); the views are disjoint (checked) and only read here.
                let views: Vec<&[u8]> = self
                    .ptrs
                    .iter()
                    .map(|&p| unsafe { std::slice::from_raw_parts(p as *const u8, len) })
                    .collect();
                CpuCopy.gather_from(&self.map, &views, ids, &mut out)?;
            }
            Backend::Cuda { copy, staging } => {
                let buf = cuda_staging(copy, staging, need)?;
                let tensors = device_tensors(&self.ptrs, self.map.tensor_bytes());
                copy.gather(&self.map, &tensors, ids, &mut buf.tensor())?;
                let all = copy.download(buf)?; // waits for the copy stream
                out.copy_from_slice(&all[..need]);
            }
        }
        Ok(out)
    }

    fn scatter(&mut self, ids: &[BlockId], staging: &[u8]) -> Result<(), tether_kvcopy::CopyError> {
        if ids.is_empty() {
            return Ok(());
        }
        match &mut self.backend {
            Backend::Cpu => {
                let len = self.map.tensor_bytes();
                // SAFETY: as in `gather`; the views are disjoint, so these mutable slices
                // never alias, and nothing else writes them during the call (vLLM calls
                // the connector between forward passes).
                let mut views: Vec<&mut [u8]> = self
                    .ptrs
                    .iter()
                    .map(|&p| unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) })
                    .collect();
                CpuCopy.scatter_into(&self.map, &mut views, ids, staging)?;
            }
            Backend::Cuda { copy, .. } => {
                let buf = copy.upload(staging)?;
                let mut tensors = device_tensors(&self.ptrs, self.map.tensor_bytes());
                copy.scatter(&self.map, &mut tensors, ids, &buf.tensor())?;
                copy.synchronize()?;
            }
        }
        Ok(())
    }
}

/// The 128-bit ids of `hashes`, which must pair one to one with `ids`.
fn paired(ids: &[u32], hashes: &[Bound<'_, PyBytes>]) -> PyResult<Vec<BlockHash>> {
    if ids.len() != hashes.len() {
        return Err(CallerError::new_err(
            "block_ids and block_hashes differ in length",
        ));
    }
    Ok(hashes.iter().map(|b| hash_id(b.as_bytes())).collect())
}

fn cuda_staging<'a>(
    copy: &CudaCopy,
    staging: &'a mut Option<DeviceBuffer>,
    need: usize,
) -> Result<&'a DeviceBuffer, tether_kvcopy::CopyError> {
    if staging.as_ref().is_none_or(|b| b.len() < need) {
        *staging = Some(copy.alloc(need.next_power_of_two())?);
    }
    staging
        .as_ref()
        .ok_or(tether_kvcopy::CopyError::InvalidShape("staging allocation"))
}

fn device_tensors(ptrs: &[u64], len: usize) -> Vec<DeviceTensor<'static>> {
    ptrs.iter()
        // SAFETY: addresses of live device views of at least `len` bytes in the
        // device's primary context, kept alive by the connector.
        .map(|&p| unsafe { DeviceTensor::from_raw(p, len) })
        .collect()
}
