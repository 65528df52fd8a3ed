//! Offload and restore through the real CPU copy backend: a paged bf16 KV cache in host
//! memory, a session retained at its prompt end, pressure that moves it to the host tier
//! (gather → xxh3-128 → host store), a corrupted byte that must be a miss, and a clean
//! restore (verify → scatter) that must be bit-exact.

use anyhow::{Context, Result, ensure};
use half::bf16;
use std::collections::HashMap;
use tether_engine::hash::{BlockHasher, RequestKeys};
use tether_engine::host::HostKind;
use tether_engine::marker::HexId;
use tether_engine::payload::MoveError;
use tether_engine::{
    BlockHash, Mover, PolicyConfig, RequestId, RestoreMiss, RetentionCache, RetentionKey, SlotId,
    StateSlot, TurnKind, TurnMarker,
};
use tether_kvcopy::{CpuCopy, Dtype, KvCacheSpec, KvCopy, KvLayout, StateSpec};

const BLOCKS: usize = 24;
const BLOCK_SIZE: usize = 16;

/// The engine's paged KV cache (vLLM Flash layout, one tensor per layer) moved by `CpuCopy`.
struct PagedKv {
    spec: KvCacheSpec,
    kv: Vec<Vec<u8>>,
    state_spec: StateSpec,
    state: Vec<Vec<u8>>,
    rng: u64,
}

impl PagedKv {
    fn new() -> Result<Self> {
        let spec = KvCacheSpec::try_new(
            KvLayout::Flash {
                num_kv_heads: 2,
                head_dim: 8,
            },
            Dtype::Bf16,
            3,
            BLOCKS,
            BLOCK_SIZE,
        )?;
        let state_spec = StateSpec::try_new(2, 4, 64)?;
        let map = spec.chunk_map();
        let smap = state_spec.chunk_map();
        Ok(Self {
            kv: vec![vec![0; map.tensor_bytes()]; map.num_tensors()],
            state: vec![vec![0; smap.tensor_bytes()]; smap.num_tensors()],
            spec,
            state_spec,
            rng: 0x1234_5678,
        })
    }

    /// Random bf16 values, as a prefill would produce.
    fn random_bf16(&mut self, bytes: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes);
        while out.len() < bytes {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let v = bf16::from_f32((self.rng % 20_000) as f32 / 1000.0 - 10.0);
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.truncate(bytes);
        out
    }

    fn block_bytes(&self, slot: SlotId) -> Result<Vec<u8>> {
        self.gather_blocks(&[slot])
            .map_err(|e| anyhow::anyhow!(e.0))
    }

    fn gather_blocks(&self, slots: &[SlotId]) -> Result<Vec<u8>, MoveError> {
        let ids: Vec<u32> = slots.iter().map(|s| s.0).collect();
        let map = self.spec.chunk_map();
        let mut staging = vec![
            0;
            map.staging_bytes(ids.len())
                .map_err(|e| MoveError(e.to_string()))?
        ];
        CpuCopy
            .gather_from(&map, &self.kv, &ids, &mut staging)
            .map_err(|e| MoveError(e.to_string()))?;
        Ok(staging)
    }
}

impl Mover for PagedKv {
    fn gather_blocks(&mut self, slots: &[SlotId]) -> Result<Vec<u8>, MoveError> {
        PagedKv::gather_blocks(self, slots)
    }
    fn scatter_blocks(&mut self, slots: &[SlotId], data: &[u8]) -> Result<(), MoveError> {
        let ids: Vec<u32> = slots.iter().map(|s| s.0).collect();
        CpuCopy
            .scatter_blocks(&self.spec, &mut self.kv, &ids, data)
            .map_err(|e| MoveError(e.to_string()))
    }
    fn gather_states(&mut self, slots: &[StateSlot]) -> Result<Vec<u8>, MoveError> {
        let ids: Vec<u32> = slots.iter().map(|s| s.0).collect();
        let map = self.state_spec.chunk_map();
        let mut staging = vec![
            0;
            map.staging_bytes(ids.len())
                .map_err(|e| MoveError(e.to_string()))?
        ];
        CpuCopy
            .snapshot_state(&self.state_spec, &self.state, &ids, &mut staging)
            .map_err(|e| MoveError(e.to_string()))?;
        Ok(staging)
    }
    fn scatter_states(&mut self, slots: &[StateSlot], data: &[u8]) -> Result<(), MoveError> {
        let ids: Vec<u32> = slots.iter().map(|s| s.0).collect();
        CpuCopy
            .restore_state(&self.state_spec, &mut self.state, &ids, data)
            .map_err(|e| MoveError(e.to_string()))
    }
}

struct Rank {
    cache: RetentionCache,
    kv: PagedKv,
    /// What each block's KV must be, wherever it lives: recorded when prefill computed it.
    truth: HashMap<BlockHash, Vec<u8>>,
    next_id: u64,
}

impl Rank {
    /// One turn: admit, check every cached block is bit-exact, prefill the rest with fresh
    /// random KV (written through the copy backend), retain at the prompt end, release.
    fn turn(
        &mut self,
        hashes: &[BlockHash],
        session: u128,
        now: u64,
    ) -> Result<tether_engine::Admission> {
        self.next_id += 1;
        let id = RequestId(self.next_id);
        let key = RetentionKey {
            tenant: HexId(7),
            session: HexId(session),
            subagent: HexId(0),
        };
        let a = self.cache.admit(id, hashes, Some(key), now, &mut self.kv)?;
        for (i, (slot, h)) in a.slots.iter().zip(hashes).take(a.cached_blocks).enumerate() {
            let want = self.truth.get(h).context("cached block never computed")?;
            ensure!(
                &self.kv.block_bytes(*slot)? == want,
                "block {i} served with wrong KV"
            );
        }
        let fresh = &a.slots[a.cached_blocks..];
        let bytes = self.kv.spec.chunk_map().staging_bytes(fresh.len())?;
        let kv = self.kv.random_bf16(bytes);
        self.kv
            .scatter_blocks(fresh, &kv)
            .map_err(|e| anyhow::anyhow!(e.0))?;
        let per = self.kv.spec.chunk_map().block_bytes();
        for (h, c) in hashes[a.cached_blocks..].iter().zip(kv.chunks_exact(per)) {
            self.truth.entry(*h).or_insert_with(|| c.to_vec());
        }
        let m = TurnMarker {
            key,
            prompt_end: true,
            kind: TurnKind::User,
            turn: None,
            retention_ms: None,
        };
        self.cache.finish_prefill(id, Some(&m), now, &mut self.kv)?;
        self.cache.release(id)?;
        self.cache.check().map_err(anyhow::Error::msg)?;
        Ok(a)
    }
}

fn prompt(session: u32, blocks: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..(blocks * BLOCK_SIZE) as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) ^ session)
        .collect();
    let keys = RequestKeys {
        cache_salt: Some(b"tenant-7".to_vec()),
        lora: None,
    };
    BlockHasher::try_new(BLOCK_SIZE)
        .map(|h| h.hash_prompt(&tokens, &keys))
        .unwrap_or_default()
}

#[test]
fn offload_under_pressure_then_miss_on_corruption_and_bit_exact_restore() -> Result<()> {
    let kv = PagedKv::new()?;
    let block_bytes = kv.spec.chunk_map().block_bytes() as u64;
    let cfg = PolicyConfig {
        block_size: BLOCK_SIZE,
        device_blocks: BLOCKS,
        block_bytes,
        host_bytes: 4 * BLOCKS as u64 * block_bytes,
        ..PolicyConfig::default()
    };
    let mut rank = Rank {
        cache: RetentionCache::try_new(cfg)?,
        kv,
        truth: HashMap::new(),
        next_id: 0,
    };
    let (a, b) = (prompt(1, 8), prompt(2, 8));
    rank.turn(&a, 1, 0)?;
    rank.turn(&b, 2, 1_000)?;
    // Pressure: three more sessions need 24 slots; the 8 free ones are not enough, so
    // the least valuable retentions (equal value here: the lower key first) go to the host.
    rank.turn(&prompt(3, 8), 3, 2_000)?;
    rank.turn(&prompt(4, 8), 4, 2_500)?;
    rank.turn(&prompt(5, 8), 5, 3_000)?;
    let stats = rank.cache.stats();
    ensure!(
        stats.offloaded >= 2,
        "expected both early sessions offloaded, got {stats:?}"
    );
    let host = rank.cache.host();
    ensure!(
        host.record(&RetentionKey {
            tenant: HexId(7),
            session: HexId(1),
            subagent: HexId(0)
        })
        .is_some()
    );
    ensure!(host.used() <= host.capacity());

    // Corrupt one byte of session A's offloaded KV: its return must be a miss.
    let device_a = rank.cache.peek_prefix(&a);
    ensure!(
        device_a < a.len(),
        "session A should not be fully on the device"
    );
    let victim = a[device_a];
    let p = rank
        .cache
        .host_mut()
        .payload_mut(HostKind::Block, victim)
        .context("A's block on host")?;
    ensure!(
        p.len() as u64 == block_bytes,
        "host payload holds the real gathered bytes"
    );
    p.bytes_mut_unchecked()[block_bytes as usize / 2] ^= 0x01;
    let got = rank.turn(&a, 1, 4_000)?;
    ensure!(
        got.miss == Some(RestoreMiss::Checksum),
        "expected a checksum miss, got {:?}",
        got.miss
    );
    ensure!(got.restored_blocks == 0 && got.cached_blocks == device_a);

    // Session B's offloaded state is intact: it comes back restored and bit-exact
    // (`Rank::turn` compares every served block with the KV its prefill produced).
    let device_b = rank.cache.peek_prefix(&b);
    let got = rank.turn(&b, 2, 5_000)?;
    ensure!(got.miss.is_none(), "unexpected miss {:?}", got.miss);
    ensure!(
        got.cached_blocks == b.len(),
        "B fully served: {} of {}",
        got.cached_blocks,
        b.len()
    );
    ensure!(got.restored_blocks == b.len() - device_b && got.restored_blocks > 0);
    Ok(())
}
