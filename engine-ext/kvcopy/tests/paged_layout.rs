//! vLLM 0.33's per-layer paged views (`KvLayout::Paged`) against bytes computed without
//! the copy engine's address map: every element of the cache encodes its own logical
//! coordinates (block, head, token, c) and its layer, so the gathered staging is decoded
//! and compared with the order the layout documents — NHD, HND, head-major (`LHBNC`)
//! and block-outermost views into one shared allocation (`BLNHC`).

use tether_kvcopy::naive::{naive_gather, naive_scatter};
use tether_kvcopy::{
    BlockId, CopyError, CpuCopy, Dtype, KvCacheSpec, KvCopy, KvLayout, PageOrder, PagedView,
};

const HEADS: usize = 3;
const HEAD_SIZE: usize = 2; // content = 4 elements (K0 K1 V0 V1)
const BS: usize = 5;
const BLOCKS: usize = 7;
const LAYERS: usize = 2;

/// The 16-bit code of an element: layer, block, head, token, content index.
fn code(layer: usize, block: usize, head: usize, token: usize, c: usize) -> u16 {
    (((((layer * BLOCKS + block) * HEADS + head) * BS + token) * 2 * HEAD_SIZE) + c) as u16
}

/// Builds one byte buffer per layer holding `code(..)` (f16-sized, little endian) at
/// `block·sb + head·sh + token·sn + c` elements — the strides alone, as torch would.
fn coded_cache(view: &PagedView, layer_extent: usize) -> Vec<Vec<u8>> {
    (0..LAYERS)
        .map(|l| {
            let mut t = vec![0xFFu8; layer_extent * 2];
            for b in 0..BLOCKS {
                for h in 0..HEADS {
                    for n in 0..BS {
                        for c in 0..2 * HEAD_SIZE {
                            let e = b * view.block_stride
                                + h * view.head_stride
                                + n * view.token_stride
                                + c;
                            t[2 * e..2 * e + 2].copy_from_slice(&code(l, b, h, n, c).to_le_bytes());
                        }
                    }
                }
            }
            t
        })
        .collect()
}

/// The staging bytes the documented order implies, written from coordinates only.
fn expected_staging(blocks: &[BlockId], heads_outer: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in blocks {
        for l in 0..LAYERS {
            let (outer, inner) = if heads_outer {
                (HEADS, BS)
            } else {
                (BS, HEADS)
            };
            for o in 0..outer {
                for i in 0..inner {
                    let (h, n) = if heads_outer { (o, i) } else { (i, o) };
                    for c in 0..2 * HEAD_SIZE {
                        out.extend_from_slice(&code(l, b as usize, h, n, c).to_le_bytes());
                    }
                }
            }
        }
    }
    out
}

struct Case {
    name: &'static str,
    view: PagedView,
    heads_outer: bool,
    extent: usize,
}

fn cases() -> Vec<Case> {
    let c = 2 * HEAD_SIZE;
    let page = HEADS * BS * c;
    vec![
        Case {
            name: "NHD (LBNHC, vLLM default)",
            view: PagedView::dense(HEADS, HEAD_SIZE, BS, PageOrder::Nhd),
            heads_outer: false,
            extent: BLOCKS * page,
        },
        Case {
            name: "HND (LBHNC)",
            view: PagedView::dense(HEADS, HEAD_SIZE, BS, PageOrder::Hnd),
            heads_outer: true,
            extent: BLOCKS * page,
        },
        Case {
            name: "LHBNC (heads outside blocks)",
            view: PagedView {
                num_kv_heads: HEADS,
                head_size: HEAD_SIZE,
                block_stride: BS * c,
                head_stride: BLOCKS * BS * c,
                token_stride: c,
            },
            heads_outer: true,
            extent: BLOCKS * page,
        },
        Case {
            // Block-outermost cross-layer packing with a padded page: each layer's view
            // steps over every layer's page (and 8 elements of padding) per block.
            name: "BLNHC (block outermost, padded)",
            view: PagedView {
                num_kv_heads: HEADS,
                head_size: HEAD_SIZE,
                block_stride: LAYERS * page + 8,
                head_stride: c,
                token_stride: HEADS * c,
            },
            heads_outer: false,
            extent: (BLOCKS - 1) * (LAYERS * page + 8) + page,
        },
    ]
}

#[test]
fn gather_and_scatter_follow_the_strides_for_every_vllm_layout() {
    let blocks: [BlockId; 4] = [6, 0, 3, 5];
    for case in cases() {
        let spec = KvCacheSpec::try_new(KvLayout::Paged(case.view), Dtype::F16, LAYERS, BLOCKS, BS)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let map = spec.chunk_map();
        assert_eq!(map.tensor_bytes(), case.extent * 2, "{}: extent", case.name);
        let cache = coded_cache(&case.view, case.extent);
        let mut staging = vec![0u8; map.staging_bytes(blocks.len()).expect("fits")];
        CpuCopy
            .gather_blocks(&spec, &cache, &blocks, &mut staging)
            .expect("gather");
        assert_eq!(
            staging,
            expected_staging(&blocks, case.heads_outer),
            "{}: gather",
            case.name
        );

        // The element-wise reference (strides only) agrees too.
        let mut naive = vec![0u8; staging.len()];
        naive_gather(&spec, &cache, &blocks, &mut naive);
        assert_eq!(naive, staging, "{}: naive", case.name);

        // Scatter into a blank cache: exactly the requested blocks' elements come back,
        // every other byte (other blocks, padding) is untouched.
        let mut restored: Vec<Vec<u8>> = vec![vec![0xFFu8; case.extent * 2]; LAYERS];
        CpuCopy
            .scatter_blocks(&spec, &mut restored, &blocks, &staging)
            .expect("scatter");
        let mut reference: Vec<Vec<u8>> = vec![vec![0xFFu8; case.extent * 2]; LAYERS];
        naive_scatter(&spec, &mut reference, &blocks, &staging);
        assert_eq!(restored, reference, "{}: scatter vs naive", case.name);
        // Every written element holds the original's value at the same position, and
        // exactly the requested blocks' elements were written.
        for (l, t) in restored.iter().enumerate() {
            let mut written = 0;
            for (e, pair) in t.chunks(2).enumerate() {
                if pair != [0xFF, 0xFF] {
                    assert_eq!(
                        pair,
                        &cache[l][2 * e..2 * e + 2],
                        "{}: layer {l} element {e}",
                        case.name
                    );
                    written += 1;
                }
            }
            assert_eq!(
                written,
                blocks.len() * HEADS * BS * 2 * HEAD_SIZE,
                "{}: layer {l}",
                case.name
            );
        }
    }
}

#[test]
fn unsupported_or_overlapping_views_are_rejected() {
    let c = 2 * HEAD_SIZE;
    let bad = [
        // tokens of a head not dense and the page not dense either
        PagedView {
            num_kv_heads: HEADS,
            head_size: HEAD_SIZE,
            block_stride: 1000,
            head_stride: c,
            token_stride: HEADS * c + 1,
        },
        // pages of consecutive blocks overlap
        PagedView {
            block_stride: HEADS * BS * c - 1,
            ..PagedView::dense(HEADS, HEAD_SIZE, BS, PageOrder::Nhd)
        },
        // head runs overlap
        PagedView {
            num_kv_heads: HEADS,
            head_size: HEAD_SIZE,
            block_stride: 10_000,
            head_stride: BS * c - 1,
            token_stride: c,
        },
    ];
    for v in bad {
        let err = KvCacheSpec::try_new(KvLayout::Paged(v), Dtype::Bf16, 2, BLOCKS, BS).unwrap_err();
        assert!(matches!(err, CopyError::InvalidShape(_)), "{v:?}: {err}");
    }
}
