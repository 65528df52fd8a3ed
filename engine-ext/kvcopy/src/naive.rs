//! Naive per-element gather/scatter written from the tensor shapes alone: the independent
//! reference that tests check both backends against and benchmarks compare to.

use crate::{BlockId, KvCacheSpec, KvLayout, PagedView, StateSpec};

/// Element offset of (block, layer, plane, token, element-in-token) in its tensor, and
/// which tensor, straight from the documented nd shapes.
fn source_index(
    spec: &KvCacheSpec,
    block: usize,
    layer: usize,
    plane: usize,
    token: usize,
    e: usize,
) -> (usize, usize) {
    let (nb, bs, nl) = (spec.num_blocks(), spec.block_size(), spec.num_layers());
    match spec.layout() {
        // [2, num_blocks, block_size, heads, head_dim]
        KvLayout::Flash {
            num_kv_heads,
            head_dim,
        } => {
            let hd = num_kv_heads * head_dim;
            (layer, ((plane * nb + block) * bs + token) * hd + e)
        }
        // [num_blocks, 2, block_size, heads, head_dim]
        KvLayout::FlashInfer {
            num_kv_heads,
            head_dim,
        } => {
            let hd = num_kv_heads * head_dim;
            (layer, ((block * 2 + plane) * bs + token) * hd + e)
        }
        // [num_blocks, block_size, latent_dim]
        KvLayout::Mla { latent_dim } => (layer, (block * bs + token) * latent_dim + e),
        KvLayout::Paged(_) => unreachable!("paged views are walked by for_each_paged_element"),
        // [num_blocks, num_layers, 2, block_size, heads, head_dim]
        KvLayout::CrossLayer {
            num_kv_heads,
            head_dim,
        } => {
            let hd = num_kv_heads * head_dim;
            (
                0,
                (((block * nl + layer) * 2 + plane) * bs + token) * hd + e,
            )
        }
    }
}

fn per_token(spec: &KvCacheSpec) -> (usize, usize) {
    match spec.layout() {
        KvLayout::Flash {
            num_kv_heads,
            head_dim,
        }
        | KvLayout::FlashInfer {
            num_kv_heads,
            head_dim,
        }
        | KvLayout::CrossLayer {
            num_kv_heads,
            head_dim,
        } => (num_kv_heads * head_dim, 2),
        KvLayout::Mla { latent_dim } => (latent_dim, 1),
        KvLayout::Paged(v) => (v.num_kv_heads * v.content(), 1),
    }
}

/// A vLLM 0.33 view, element by element: source offset `block·block_stride +
/// head·head_stride + token·token_stride + c` (what `torch.as_strided` means), staging
/// = each page in physical order (of head and token, the one with the larger stride
/// outer), entries then layers outer.
fn for_each_paged_element(
    spec: &KvCacheSpec,
    v: &PagedView,
    blocks: &[BlockId],
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    let es = spec.dtype().size();
    let (h, n, c) = (v.num_kv_heads, spec.block_size(), v.content());
    let heads_outer = n == 1 || (h > 1 && v.head_stride > v.token_stride);
    let mut dst = 0;
    for &block in blocks {
        for layer in 0..spec.num_layers() {
            let (outer, inner) = if heads_outer { (h, n) } else { (n, h) };
            for o in 0..outer {
                for i in 0..inner {
                    let (head, token) = if heads_outer { (o, i) } else { (i, o) };
                    for e in 0..c {
                        let src = block as usize * v.block_stride
                            + head * v.head_stride
                            + token * v.token_stride
                            + e;
                        f(layer, src * es, dst * es, es);
                        dst += 1;
                    }
                }
            }
        }
    }
}

/// Calls `f(tensor, tensor_byte, staging_byte, elem_bytes)` element by element, staging
/// being `[entries, layers, planes, block_size, elements_per_token]`.
fn for_each_element(
    spec: &KvCacheSpec,
    blocks: &[BlockId],
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    if let KvLayout::Paged(v) = spec.layout() {
        return for_each_paged_element(spec, &v, blocks, f);
    }
    let (pt, planes) = per_token(spec);
    let es = spec.dtype().size();
    let (nl, bs) = (spec.num_layers(), spec.block_size());
    for (entry, &block) in blocks.iter().enumerate() {
        for layer in 0..nl {
            for plane in 0..planes {
                for token in 0..bs {
                    for e in 0..pt {
                        let (t, src) = source_index(spec, block as usize, layer, plane, token, e);
                        let dst = (((entry * nl + layer) * planes + plane) * bs + token) * pt + e;
                        f(t, src * es, dst * es, es);
                    }
                }
            }
        }
    }
}

/// Gathers element by element; panics on bad input (a test/benchmark reference only).
pub fn naive_gather<T: AsRef<[u8]>>(
    spec: &KvCacheSpec,
    tensors: &[T],
    blocks: &[BlockId],
    staging: &mut [u8],
) {
    for_each_element(spec, blocks, |t, src, dst, n| {
        staging[dst..dst + n].copy_from_slice(&tensors[t].as_ref()[src..src + n]);
    });
}

/// Scatters element by element; panics on bad input (a test/benchmark reference only).
pub fn naive_scatter<T: AsMut<[u8]>>(
    spec: &KvCacheSpec,
    tensors: &mut [T],
    blocks: &[BlockId],
    staging: &[u8],
) {
    for_each_element(spec, blocks, |t, dst, src, n| {
        tensors[t].as_mut()[dst..dst + n].copy_from_slice(&staging[src..src + n]);
    });
}

/// Snapshots state slabs byte by byte: slot `s` of layer `l` to staging `(entry * layers + l) * slab`.
pub fn naive_snapshot<T: AsRef<[u8]>>(
    spec: &StateSpec,
    tensors: &[T],
    slots: &[BlockId],
    staging: &mut [u8],
) {
    let map = spec.chunk_map();
    let slab = map.chunk_bytes();
    for (entry, &slot) in slots.iter().enumerate() {
        for (layer, tensor) in tensors.iter().enumerate().take(map.num_layers()) {
            for i in 0..slab {
                staging[(entry * map.num_layers() + layer) * slab + i] =
                    tensor.as_ref()[slot as usize * slab + i];
            }
        }
    }
}

/// Fills `buf` with deterministic pseudo-random bytes (SplitMix64), so test and benchmark
/// data is reproducible from a seed without a dependency.
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut state = seed;
    for chunk in buf.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}
