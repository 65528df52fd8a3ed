//! Host-side checks of the CUDA backend's addressing: the kernel arguments and the
//! per-block memcpy runs, replayed on host memory against the CPU backend (no GPU needed).

use super::{KernelParams, runs};
use crate::naive::fill_random;
use crate::{BlockId, CpuCopy, Dtype, KvCacheSpec, KvCopy, KvLayout, StateSpec};

/// Pretend device addresses: tensor `i` lives at `(i + 1) << 40`.
fn fake_ptr(i: usize) -> u64 {
    ((i as u64) + 1) << 40
}

fn specs() -> Vec<KvCacheSpec> {
    let mut out = Vec::new();
    for layout in [
        KvLayout::Flash {
            num_kv_heads: 3,
            head_dim: 8,
        },
        KvLayout::FlashInfer {
            num_kv_heads: 3,
            head_dim: 8,
        },
        KvLayout::Mla { latent_dim: 20 },
        KvLayout::CrossLayer {
            num_kv_heads: 3,
            head_dim: 8,
        },
    ] {
        for dtype in [Dtype::F16, Dtype::Bf16, Dtype::Fp8] {
            out.push(KvCacheSpec::try_new(layout, dtype, 3, 7, 5).expect("valid shape"));
        }
    }
    out
}

fn host_cache(n: usize, bytes: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut t = vec![0u8; bytes];
            fill_random(&mut t, seed + i as u64);
            t
        })
        .collect()
}

/// Replays the gather kernel's addressing (one chunk per work item, staging at
/// `item * chunk_bytes`) on host memory.
fn emulate_gather(p: &KernelParams, cache: &[Vec<u8>], blocks: &[BlockId]) -> Vec<u8> {
    let chunk = p.chunk_bytes as usize;
    let mut staging = vec![0u8; p.items() as usize * chunk];
    for item in 0..p.items() {
        let addr = p.cache_chunk(blocks, item);
        let tensor = (addr >> 40) as usize - 1;
        let off = (addr & ((1 << 40) - 1)) as usize;
        let dst = item as usize * chunk;
        staging[dst..dst + chunk].copy_from_slice(&cache[tensor][off..off + chunk]);
    }
    staging
}

#[test]
fn kernel_arguments_address_the_same_bytes_as_the_cpu_backend() {
    let blocks: [BlockId; 4] = [6, 0, 3, 6];
    for spec in specs() {
        let map = spec.chunk_map();
        let cache = host_cache(map.num_tensors(), map.tensor_bytes(), 17);
        let ptrs: Vec<u64> = (0..map.num_tensors()).map(fake_ptr).collect();
        let p = KernelParams::new(&map, &ptrs, blocks.len()).expect("small shape");
        let mut expected = vec![0u8; map.staging_bytes(blocks.len()).expect("fits")];
        CpuCopy
            .gather(&map, &cache, &blocks, &mut expected)
            .expect("valid request");
        assert_eq!(emulate_gather(&p, &cache, &blocks), expected, "{spec:?}");
    }
    let state = StateSpec::try_new(4, 3, 40).expect("valid").chunk_map();
    let cache = host_cache(4, state.tensor_bytes(), 5);
    let ptrs: Vec<u64> = (0..4).map(fake_ptr).collect();
    let p = KernelParams::new(&state, &ptrs, 2).expect("small shape");
    let mut expected = vec![0u8; state.staging_bytes(2).expect("fits")];
    CpuCopy
        .gather(&state, &cache, &[2, 0], &mut expected)
        .expect("valid request");
    assert_eq!(emulate_gather(&p, &cache, &[2, 0]), expected);
}

#[test]
fn per_block_runs_cover_staging_exactly_as_the_cpu_backend() {
    let blocks: [BlockId; 3] = [1, 5, 2];
    for spec in specs() {
        let map = spec.chunk_map();
        let cache = host_cache(map.num_tensors(), map.tensor_bytes(), 3);
        let mut expected = vec![0u8; map.staging_bytes(blocks.len()).expect("fits")];
        CpuCopy
            .gather(&map, &cache, &blocks, &mut expected)
            .expect("valid request");
        let mut staging = vec![0xEEu8; expected.len()];
        let mut covered = 0;
        for (tensor_off, staging_off, len, tensor) in runs(&map, &blocks) {
            staging[staging_off..staging_off + len]
                .copy_from_slice(&cache[tensor][tensor_off..tensor_off + len]);
            covered += len;
        }
        assert_eq!(
            covered,
            expected.len(),
            "{spec:?}: runs overlap or leave gaps"
        );
        assert_eq!(staging, expected, "{spec:?}");
        let expected_runs = if map.block_is_contiguous() {
            blocks.len()
        } else {
            blocks.len() * map.num_layers() * map.planes()
        };
        assert_eq!(runs(&map, &blocks).count(), expected_runs, "{spec:?}");
    }
}
