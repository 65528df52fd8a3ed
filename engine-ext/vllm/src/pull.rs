//! A state pull's bookkeeping (docs/vllm.md, "State pull (NIXL)"): the pull chain that
//! names a block across engines, and the holder's lease book — which retained blocks a
//! key's chain maps to, where the worker keeps their payloads, and which payloads a lease
//! keeps from being freed.

use crate::ledger::Ledger;
use crate::{CallerError, hash_id};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::{HashMap, HashSet};
use tether_engine::BlockHash;
use xxhash_rust::xxh3::xxh3_128;

/// The chain's domain tag: a chain of another version never matches this one.
const CHAIN_TAG: &[u8] = b"tether-pull-v1";

/// The pull chain of `tokens`' whole blocks: `c0 = xxh3-128(tag ‖ salt)`, `c(i+1) =
/// xxh3-128(c(i) as 16 bytes LE ‖ the block's token ids as u32 LE)`; one 16-byte entry
/// per whole block. vLLM's own block hashes cannot name a block between engines: their
/// chain starts from a per-process random `NONE_HASH` unless every engine shares
/// `PYTHONHASHSEED`.
pub fn chain(tokens: &[u32], block_size: usize, salt: &[u8]) -> Vec<u128> {
    extend(seed(salt), tokens, block_size)
}

/// `c0` of a chain.
fn seed(salt: &[u8]) -> u128 {
    xxh3_128(&[CHAIN_TAG, salt].concat())
}

/// The links after `c` for `tokens`' whole blocks.
fn extend(mut c: u128, tokens: &[u32], block_size: usize) -> Vec<u128> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut buf = Vec::with_capacity(16 + 4 * block_size);
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            buf.clear();
            buf.extend_from_slice(&c.to_le_bytes());
            for t in block {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            c = xxh3_128(&buf);
            c
        })
        .collect()
}

/// `chain` for Python: the pull chain of `tokens`' whole blocks as 16-byte strings.
/// A token id that is not a u32 raises `CallerError` (the caller does not pull).
#[pyfunction]
pub fn pull_chain<'py>(
    py: Python<'py>,
    tokens: Vec<i64>,
    block_size: usize,
    salt: &str,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let ids = tokens
        .iter()
        .map(|&t| u32::try_from(t))
        .collect::<Result<Vec<u32>, _>>()
        .map_err(|_| CallerError::new_err("pull_chain: a token id is not a u32"))?;
    Ok(chain(&ids, block_size, salt.as_bytes())
        .into_iter()
        .map(|c| PyBytes::new(py, &c.to_le_bytes()))
        .collect())
}

fn link(b: &Bound<'_, PyBytes>) -> PyResult<u128> {
    let bytes: [u8; 16] = b
        .as_bytes()
        .try_into()
        .map_err(|_| CallerError::new_err("a pull chain entry is 16 bytes"))?;
    Ok(u128::from_le_bytes(bytes))
}

struct Lease {
    ids: Vec<BlockHash>,
    expires_ms: u64,
}

/// The holder's side of a pull: per resident key, the pull chain of its latest retained
/// blocks and their host payload ids; the payloads' addresses and checksums as the worker
/// reported them; the leases and the payloads they keep.
#[pyclass(module = "tether_vllm._native")]
#[derive(Default)]
pub struct PullSource {
    chains: HashMap<u64, Vec<(u128, BlockHash)>>,
    slots: HashMap<BlockHash, (u64, u128)>,
    leases: HashMap<String, Lease>,
    /// Payload id → leases holding it.
    pins: HashMap<BlockHash, u32>,
    /// Frees the ledger asked for while a lease held the payload.
    deferred: HashSet<BlockHash>,
}

#[pymethods]
impl PullSource {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Leading `hosts` (vLLM block hashes) the key's recorded chain already names: a
    /// turn's next prompt end resends them, so only the blocks after need hashing.
    fn common(&self, key: u64, hosts: Vec<Bound<'_, PyBytes>>) -> usize {
        self.chains.get(&key).map_or(0, |held| {
            held.iter()
                .zip(&hosts)
                .take_while(|((_, id), h)| *id == hash_id(h.as_bytes()))
                .count()
        })
    }

    /// A prompt end retained these blocks for `key` (`hosts`: their vLLM block hashes, in
    /// order); `tokens` are the token ids of blocks `from_block..` (the first `from_block`
    /// links are the key's recorded ones, `common` said so). Replaces the key's chain.
    fn record(
        &mut self,
        key: u64,
        hosts: Vec<Bound<'_, PyBytes>>,
        tokens: Vec<i64>,
        from_block: usize,
        block_size: usize,
        salt: &str,
    ) -> PyResult<()> {
        let ids = tokens
            .iter()
            .map(|&t| u32::try_from(t))
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| CallerError::new_err("record: a token id is not a u32"))?;
        let held = self.chains.get(&key).map_or(&[][..], Vec::as_slice);
        if from_block > held.len().min(hosts.len()) {
            return Err(CallerError::new_err(format!(
                "record: {from_block} links to keep, {} recorded",
                held.len()
            )));
        }
        let mut links: Vec<u128> = held[..from_block].iter().map(|(c, _)| *c).collect();
        let start = links
            .last()
            .copied()
            .unwrap_or_else(|| seed(salt.as_bytes()));
        links.extend(extend(start, &ids, block_size));
        let entries = links
            .into_iter()
            .zip(&hosts)
            .map(|(c, h)| (c, hash_id(h.as_bytes())))
            .collect();
        self.chains.insert(key, entries);
        Ok(())
    }

    /// Payloads the worker saved: `(id, address, checksum)` each (`KvCopier.take_saved`).
    fn saved(&mut self, entries: Vec<(Bound<'_, PyBytes>, u64, u128)>) {
        for (id, addr, sum) in entries {
            self.slots.insert(hash_id(id.as_bytes()), (addr, sum));
        }
    }

    /// Payloads the worker dropped (found corrupt): never offered again.
    fn lost(&mut self, ids: Vec<Bound<'_, PyBytes>>) {
        for id in ids {
            self.slots.remove(&hash_id(id.as_bytes()));
        }
    }

    /// The ledger freed these payloads (16-byte ids): returns those the worker may free
    /// now; a payload a lease holds is freed when its last lease ends.
    fn frees<'py>(
        &mut self,
        py: Python<'py>,
        freed: Vec<Bound<'py, PyBytes>>,
    ) -> Vec<Bound<'py, PyBytes>> {
        freed
            .into_iter()
            .filter(|b| {
                let id = hash_id(b.as_bytes());
                if self.pins.contains_key(&id) {
                    self.deferred.insert(id);
                    return false;
                }
                self.slots.remove(&id);
                true
            })
            .map(|b| PyBytes::new(py, b.as_bytes()))
            .collect()
    }

    /// Grants lease `lease_id` on `key`'s blocks from `start` whose chain matches the
    /// puller's (`chain`, from block 0) and whose payload the worker holds, at most
    /// `max_blocks`: returns `(address, checksum)` per block, in order, stopping at the
    /// first that does not qualify. Nothing matched: no lease, an empty list.
    #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn lease(
        &mut self,
        lease_id: String,
        key: u64,
        chain: Vec<Bound<'_, PyBytes>>,
        start: usize,
        max_blocks: usize,
        now_ms: u64,
        lease_ms: u64,
    ) -> PyResult<Vec<(u64, u128)>> {
        let wanted = chain.iter().map(link).collect::<PyResult<Vec<u128>>>()?;
        let Some(held) = self.chains.get(&key) else {
            return Ok(Vec::new());
        };
        let matched = held
            .iter()
            .zip(&wanted)
            .take_while(|((c, _), w)| c == *w)
            .count();
        let mut ids = Vec::new();
        let mut out = Vec::new();
        for (_, id) in held.iter().take(matched).skip(start).take(max_blocks) {
            let Some(&slot) = self.slots.get(id) else {
                break;
            };
            ids.push(*id);
            out.push(slot);
        }
        if ids.is_empty() {
            return Ok(out);
        }
        for id in &ids {
            *self.pins.entry(*id).or_default() += 1;
        }
        let expires_ms = now_ms.saturating_add(lease_ms);
        self.leases.insert(lease_id, Lease { ids, expires_ms });
        Ok(out)
    }

    /// A heartbeat: the lease runs `lease_ms` from `now_ms`. False when it is unknown
    /// (expired or released).
    fn renew(&mut self, lease_id: &str, now_ms: u64, lease_ms: u64) -> bool {
        match self.leases.get_mut(lease_id) {
            Some(l) => {
                l.expires_ms = now_ms.saturating_add(lease_ms);
                true
            }
            None => false,
        }
    }

    /// Ends a lease (notification or HTTP release): returns the payload ids the worker
    /// may free now, or None when the lease is unknown.
    fn release<'py>(
        &mut self,
        py: Python<'py>,
        lease_id: &str,
        ledger: PyRef<'_, Ledger>,
    ) -> Option<Vec<Bound<'py, PyBytes>>> {
        let lease = self.leases.remove(lease_id)?;
        Some(self.unpin(py, lease, &ledger))
    }

    /// Ends every lease that ran out by `now_ms`: returns how many, and the payload ids
    /// the worker may free now.
    fn expire<'py>(
        &mut self,
        py: Python<'py>,
        now_ms: u64,
        ledger: PyRef<'_, Ledger>,
    ) -> (usize, Vec<Bound<'py, PyBytes>>) {
        let due: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires_ms <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        let mut frees = Vec::new();
        for id in &due {
            if let Some(lease) = self.leases.remove(id) {
                frees.extend(self.unpin(py, lease, &ledger));
            }
        }
        (due.len(), frees)
    }

    /// Drops the chains of keys the ledger no longer retains on either tier.
    fn prune(&mut self, ledger: PyRef<'_, Ledger>) -> usize {
        let live: HashSet<u64> = ledger
            .resident_entries()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        let before = self.chains.len();
        self.chains.retain(|k, _| live.contains(k));
        before - self.chains.len()
    }

    /// Leases in force.
    #[getter]
    fn leases(&self) -> usize {
        self.leases.len()
    }

    /// Payloads some lease holds.
    #[getter]
    fn pinned(&self) -> usize {
        self.pins.len()
    }

    /// Frees waiting for a lease to end.
    #[getter]
    fn deferred(&self) -> usize {
        self.deferred.len()
    }

    /// Keys with a recorded chain.
    #[getter]
    fn keys(&self) -> usize {
        self.chains.len()
    }
}

impl PullSource {
    /// Drops a lease's pins; a payload no lease holds any more whose free was deferred is
    /// freed now, unless the ledger stored it again meanwhile (its save found it held).
    fn unpin<'py>(
        &mut self,
        py: Python<'py>,
        lease: Lease,
        ledger: &Ledger,
    ) -> Vec<Bound<'py, PyBytes>> {
        let mut frees = Vec::new();
        for id in lease.ids {
            let Some(n) = self.pins.get_mut(&id) else {
                continue;
            };
            *n -= 1;
            if *n > 0 {
                continue;
            }
            self.pins.remove(&id);
            if self.deferred.remove(&id) && ledger.inner.host_prefix(&[id]) == 0 {
                self.slots.remove(&id);
                frees.push(PyBytes::new(py, &id.0.to_le_bytes()));
            }
        }
        frees
    }
}
