//! CPU reference backend: exact semantics against the naive per-element reference,
//! round trips, cross-layout moves and typed errors, on random data for every layout and type.

use half::{bf16, f16};
use proptest::prelude::*;
use tether_kvcopy::naive::{fill_random, naive_gather, naive_scatter, naive_snapshot};
use tether_kvcopy::{BlockId, CopyError, CpuCopy, Dtype, KvCacheSpec, KvCopy, KvLayout, StateSpec};

const DTYPES: [Dtype; 3] = [Dtype::F16, Dtype::Bf16, Dtype::Fp8];

fn layouts(heads: usize, head_dim: usize, latent: usize) -> [KvLayout; 4] {
    [
        KvLayout::Flash {
            num_kv_heads: heads,
            head_dim,
        },
        KvLayout::FlashInfer {
            num_kv_heads: heads,
            head_dim,
        },
        KvLayout::Mla { latent_dim: latent },
        KvLayout::CrossLayer {
            num_kv_heads: heads,
            head_dim,
        },
    ]
}

fn random_cache(spec: &KvCacheSpec, seed: u64) -> Vec<Vec<u8>> {
    let map = spec.chunk_map();
    (0..map.num_tensors())
        .map(|i| {
            let mut t = vec![0u8; map.tensor_bytes()];
            fill_random(&mut t, seed.wrapping_add(i as u64));
            t
        })
        .collect()
}

fn zero_cache(spec: &KvCacheSpec) -> Vec<Vec<u8>> {
    let map = spec.chunk_map();
    vec![vec![0u8; map.tensor_bytes()]; map.num_tensors()]
}

/// A zero cache holding just `blocks` of `cache`, moved by the naive element-wise
/// reference alone: the expected result of a gather then scatter.
fn naive_round_trip(spec: &KvCacheSpec, cache: &[Vec<u8>], blocks: &[BlockId]) -> Vec<Vec<u8>> {
    let mut staging = vec![0u8; spec.chunk_map().staging_bytes(blocks.len()).unwrap()];
    naive_gather(spec, cache, blocks, &mut staging);
    let mut out = zero_cache(spec);
    naive_scatter(spec, &mut out, blocks, &staging);
    out
}

/// A small random shape, a layout index, a dtype and a block list (unique, shuffled).
fn case() -> impl Strategy<Value = (KvCacheSpec, Vec<BlockId>, u64)> {
    (
        1usize..4,
        1usize..4,
        1usize..12,
        1usize..5,
        2usize..9,
        1usize..40,
        0usize..4,
        0usize..3,
        any::<u64>(),
    )
        .prop_flat_map(
            |(heads, head_dim, latent, layers, blocks, block_size, li, di, seed)| {
                let spec = KvCacheSpec::try_new(
                    layouts(heads, head_dim, latent)[li],
                    DTYPES[di],
                    layers,
                    blocks,
                    block_size,
                )
                .expect("valid small shape");
                let ids = Just((0..blocks as BlockId).collect::<Vec<_>>()).prop_shuffle();
                (Just(spec), ids, 1usize..=blocks, Just(seed))
            },
        )
        .prop_map(|(spec, mut ids, n, seed)| {
            ids.truncate(n);
            (spec, ids, seed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The chunk-wise backend equals the element-wise reference written from the nd shapes.
    #[test]
    fn gather_matches_naive_reference((spec, blocks, seed) in case()) {
        let cache = random_cache(&spec, seed);
        let need = spec.chunk_map().staging_bytes(blocks.len()).unwrap();
        let (mut fast, mut slow) = (vec![0u8; need], vec![0u8; need]);
        CpuCopy.gather_blocks(&spec, &cache, &blocks, &mut fast).unwrap();
        naive_gather(&spec, &cache, &blocks, &mut slow);
        prop_assert_eq!(fast, slow);
    }

    /// Scatter writes exactly the requested blocks, byte for byte, and nothing else.
    #[test]
    fn gather_scatter_round_trip((spec, blocks, seed) in case()) {
        let cache = random_cache(&spec, seed);
        let mut staging = vec![0u8; spec.chunk_map().staging_bytes(blocks.len()).unwrap()];
        CpuCopy.gather_blocks(&spec, &cache, &blocks, &mut staging).unwrap();

        let mut restored = zero_cache(&spec);
        CpuCopy.scatter_blocks(&spec, &mut restored, &blocks, &staging).unwrap();
        let mut expected = zero_cache(&spec);
        naive_scatter(&spec, &mut expected, &blocks, &staging);
        prop_assert_eq!(&restored, &expected);

        // Re-gathering the restored cache reproduces the staging bytes.
        let mut again = vec![0u8; staging.len()];
        CpuCopy.gather_blocks(&spec, &restored, &blocks, &mut again).unwrap();
        prop_assert_eq!(again, staging);
    }

    /// A block gathered from one KV layout scatters into any other of the same shape
    /// parameters, and the bytes sit where the target's nd shape says.
    #[test]
    fn cross_layout_round_trip((spec, blocks, seed) in case()) {
        let (heads, head_dim) = match spec.layout() {
            KvLayout::Flash { num_kv_heads, head_dim }
            | KvLayout::FlashInfer { num_kv_heads, head_dim }
            | KvLayout::CrossLayer { num_kv_heads, head_dim } => (num_kv_heads, head_dim),
            KvLayout::Mla { .. } | KvLayout::Paged(_) => return Ok(()),
        };
        let mk = |layout| KvCacheSpec::try_new(layout, spec.dtype(), spec.num_layers(), spec.num_blocks(), spec.block_size()).unwrap();
        let flash = mk(KvLayout::Flash { num_kv_heads: heads, head_dim });
        let chain = [
            mk(KvLayout::CrossLayer { num_kv_heads: heads, head_dim }),
            mk(KvLayout::FlashInfer { num_kv_heads: heads, head_dim }),
            flash,
        ];
        let src = random_cache(&flash, seed);
        let mut staging = vec![0u8; flash.chunk_map().staging_bytes(blocks.len()).unwrap()];
        CpuCopy.gather_blocks(&flash, &src, &blocks, &mut staging).unwrap();
        let first = staging.clone();
        // Flash -> CrossLayer -> FlashInfer -> Flash: every hop lands where the target's nd
        // shape says, and the staging bytes never change.
        let mut last = Vec::new();
        for target in chain {
            let mut dst = zero_cache(&target);
            CpuCopy.scatter_blocks(&target, &mut dst, &blocks, &staging).unwrap();
            let mut reference = zero_cache(&target);
            naive_scatter(&target, &mut reference, &blocks, &staging);
            prop_assert_eq!(&dst, &reference, "{:?}", target.layout());
            CpuCopy.gather_blocks(&target, &dst, &blocks, &mut staging).unwrap();
            prop_assert_eq!(&staging, &first);
            last = dst;
        }
        // Home again: the requested blocks of the source and nothing else, placed by the
        // naive reference's own addressing (not through the chunk map under test).
        prop_assert_eq!(&last, &naive_round_trip(&flash, &src, &blocks));
    }

    /// State slabs: snapshot equals the byte-wise reference; restore puts them back.
    #[test]
    fn state_snapshot_round_trip(layers in 1usize..6, slots in 1usize..6, slab in 1usize..300, seed: u64, pick in any::<prop::sample::Index>()) {
        let spec = StateSpec::try_new(layers, slots, slab).unwrap();
        let map = spec.chunk_map();
        let state: Vec<Vec<u8>> = (0..layers).map(|l| { let mut v = vec![0u8; map.tensor_bytes()]; fill_random(&mut v, seed ^ l as u64); v }).collect();
        let slot = pick.index(slots) as BlockId;
        let mut staging = vec![0u8; map.staging_bytes(1).unwrap()];
        CpuCopy.snapshot_state(&spec, &state, &[slot], &mut staging).unwrap();
        let mut reference = vec![0u8; staging.len()];
        naive_snapshot(&spec, &state, &[slot], &mut reference);
        prop_assert_eq!(&staging, &reference);

        let mut restored: Vec<Vec<u8>> = vec![vec![0u8; map.tensor_bytes()]; layers];
        CpuCopy.restore_state(&spec, &mut restored, &[slot], &staging).unwrap();
        let s = slot as usize * slab;
        for l in 0..layers {
            prop_assert_eq!(&restored[l][s..s + slab], &state[l][s..s + slab]);
            prop_assert!(restored[l][..s].iter().chain(&restored[l][s + slab..]).all(|&b| b == 0));
        }
    }
}

/// Typed element data survives the round trip: bf16/f16 values compare equal as numbers.
#[test]
fn half_values_survive_round_trip() -> anyhow::Result<()> {
    for (dtype, encode) in [
        (
            Dtype::Bf16,
            (|x: f32| bf16::from_f32(x).to_le_bytes()) as fn(f32) -> [u8; 2],
        ),
        (Dtype::F16, |x: f32| f16::from_f32(x).to_le_bytes()),
    ] {
        let spec = KvCacheSpec::try_new(
            KvLayout::Flash {
                num_kv_heads: 2,
                head_dim: 8,
            },
            dtype,
            3,
            5,
            4,
        )?;
        let map = spec.chunk_map();
        let cache: Vec<Vec<u8>> = (0..3)
            .map(|l| {
                (0..map.tensor_bytes() / 2)
                    .flat_map(|i| encode((l * 1000 + i) as f32 * 0.25 - 7.0))
                    .collect()
            })
            .collect();
        let blocks = [4, 0, 2];
        let mut staging = vec![0u8; map.staging_bytes(3)?];
        CpuCopy.gather_blocks(&spec, &cache, &blocks, &mut staging)?;
        // First element of staging entry 0 (block 4, layer 0, K, token 0) is element 4*4*16 of layer 0.
        let first = [staging[0], staging[1]];
        assert_eq!(first, encode((4 * 4 * 16) as f32 * 0.25 - 7.0), "{dtype:?}");
        let mut back = zero_cache(&spec);
        CpuCopy.scatter_blocks(&spec, &mut back, &blocks, &staging)?;
        assert_eq!(back, naive_round_trip(&spec, &cache, &blocks), "{dtype:?}");
    }
    Ok(())
}

fn small_spec(layout: KvLayout) -> KvCacheSpec {
    KvCacheSpec::try_new(layout, Dtype::Fp8, 2, 4, 3).unwrap()
}

#[test]
fn out_of_range_block_is_a_typed_error_and_writes_nothing() {
    for layout in layouts(2, 4, 6) {
        let spec = small_spec(layout);
        let mut cache = random_cache(&spec, 7);
        let before = cache.clone();
        let mut staging = vec![0xAAu8; spec.chunk_map().staging_bytes(2).unwrap()];
        let err = CpuCopy
            .gather_blocks(&spec, &cache, &[1, 4], &mut staging)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CopyError::BlockOutOfRange {
                    block: 4,
                    num_blocks: 4
                }
            ),
            "{err}"
        );
        assert!(
            staging.iter().all(|&b| b == 0xAA),
            "gather wrote before failing"
        );
        let err = CpuCopy
            .scatter_blocks(&spec, &mut cache, &[0, u32::MAX], &staging)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CopyError::BlockOutOfRange {
                    block: u32::MAX,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(cache, before, "scatter wrote before failing");
    }
}

#[test]
fn staging_too_small_is_a_typed_error() {
    for layout in layouts(2, 4, 6) {
        let spec = small_spec(layout);
        let mut cache = random_cache(&spec, 9);
        let need = spec.chunk_map().staging_bytes(3).unwrap();
        let mut staging = vec![0u8; need - 1];
        let err = CpuCopy
            .gather_blocks(&spec, &cache, &[0, 1, 2], &mut staging)
            .unwrap_err();
        assert!(
            matches!(err, CopyError::StagingTooSmall { need: n, have } if n == need && have == need - 1),
            "{err}"
        );
        let err = CpuCopy
            .scatter_blocks(&spec, &mut cache, &[0, 1, 2], &staging)
            .unwrap_err();
        assert!(matches!(err, CopyError::StagingTooSmall { .. }), "{err}");
    }
}

#[test]
fn scatter_rejects_duplicate_blocks_gather_allows_them() {
    let spec = small_spec(KvLayout::Flash {
        num_kv_heads: 2,
        head_dim: 4,
    });
    let mut cache = random_cache(&spec, 3);
    let mut staging = vec![0u8; spec.chunk_map().staging_bytes(3).unwrap()];
    CpuCopy
        .gather_blocks(&spec, &cache, &[2, 0, 2], &mut staging)
        .unwrap();
    let bb = spec.chunk_map().block_bytes();
    assert_eq!(staging[..bb], staging[2 * bb..3 * bb]);
    let err = CpuCopy
        .scatter_blocks(&spec, &mut cache, &[2, 0, 2], &staging)
        .unwrap_err();
    assert!(
        matches!(err, CopyError::DuplicateBlock { block: 2 }),
        "{err}"
    );
}

#[test]
fn tensor_count_and_size_are_checked() {
    let spec = small_spec(KvLayout::Mla { latent_dim: 6 });
    let mut staging = vec![0u8; spec.chunk_map().staging_bytes(1).unwrap()];
    let mut cache = random_cache(&spec, 1);
    let err = CpuCopy
        .gather_blocks(&spec, &cache[..1], &[0], &mut staging)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CopyError::TensorCount {
                expected: 2,
                got: 1
            }
        ),
        "{err}"
    );
    cache[1].pop();
    let err = CpuCopy
        .gather_blocks(&spec, &cache, &[0], &mut staging)
        .unwrap_err();
    assert!(
        matches!(err, CopyError::TensorTooSmall { index: 1, .. }),
        "{err}"
    );
}

#[test]
fn invalid_shapes_are_rejected() {
    let flash = KvLayout::Flash {
        num_kv_heads: 8,
        head_dim: 128,
    };
    assert!(matches!(
        KvCacheSpec::try_new(flash, Dtype::F16, 0, 4, 16),
        Err(CopyError::InvalidShape(_))
    ));
    assert!(matches!(
        KvCacheSpec::try_new(KvLayout::Mla { latent_dim: 0 }, Dtype::F16, 1, 4, 16),
        Err(CopyError::InvalidShape(_))
    ));
    assert!(matches!(
        KvCacheSpec::try_new(flash, Dtype::Bf16, 1 << 20, 1 << 30, 1 << 20),
        Err(CopyError::InvalidShape(_))
    ));
    assert!(matches!(
        StateSpec::try_new(4, 0, 16),
        Err(CopyError::InvalidShape(_))
    ));
    // An 8B-class cache is fine: 32 layers, 8 KV heads of 128, bf16, 16-token blocks.
    let spec = KvCacheSpec::try_new(flash, Dtype::Bf16, 32, 4096, 16).unwrap();
    assert_eq!(spec.chunk_map().block_bytes(), 2 << 20);
}

#[test]
fn empty_request_is_a_no_op() {
    let spec = small_spec(KvLayout::CrossLayer {
        num_kv_heads: 1,
        head_dim: 2,
    });
    let mut cache = random_cache(&spec, 5);
    let before = cache.clone();
    let mut staging: Vec<u8> = Vec::new();
    CpuCopy
        .gather_blocks(&spec, &cache, &[], &mut staging)
        .unwrap();
    CpuCopy
        .scatter_blocks(&spec, &mut cache, &[], &staging)
        .unwrap();
    assert_eq!(cache, before);
}

/// The trait is object-free but generic: borrowed slices work as tensors too.
#[test]
fn borrowed_tensors_work() {
    let spec = small_spec(KvLayout::Flash {
        num_kv_heads: 1,
        head_dim: 4,
    });
    let mut owned = random_cache(&spec, 11);
    let src = owned.clone();
    let mut staging = vec![0u8; spec.chunk_map().staging_bytes(1).unwrap()];
    let views: Vec<&[u8]> = src.iter().map(Vec::as_slice).collect();
    CpuCopy
        .gather_from(&spec.chunk_map(), &views, &[3], &mut staging)
        .unwrap();
    let mut muts: Vec<&mut [u8]> = owned.iter_mut().map(Vec::as_mut_slice).collect();
    for m in muts.iter_mut() {
        m.fill(0);
    }
    KvCopy::scatter(&CpuCopy, &spec.chunk_map(), &mut muts, &[3], &staging).unwrap();
    let mut again = vec![0u8; staging.len()];
    CpuCopy
        .gather_blocks(&spec, &owned, &[3], &mut again)
        .unwrap();
    assert_eq!(again, staging);
}
