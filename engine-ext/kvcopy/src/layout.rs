//! Cache layouts and the one addressing rule ([`ChunkMap`]) every layout reduces to.

use crate::CopyError;

/// Index of a block in a paged cache (vLLM block ids are `int32`), or of a state slot.
pub type BlockId = u32;

/// Element type of a cache. Copies are type-agnostic; the type fixes the element size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE half (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    Bf16,
    /// Any 8-bit float (e4m3 / e5m2), moved as raw bytes.
    Fp8,
}

impl Dtype {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Fp8 => 1,
        }
    }
}

/// How a paged KV cache is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvLayout {
    /// vLLM's *pre-0.33* FlashAttention layout: one tensor per layer,
    /// `[2, num_blocks, block_size, num_kv_heads, head_dim]` (K plane, then V plane).
    /// vLLM 0.33 caches are [`KvLayout::Paged`]; this layout on a 0.33 cache saves the
    /// wrong bytes.
    Flash {
        num_kv_heads: usize,
        head_dim: usize,
    },
    /// vLLM FlashInfer: one tensor per layer,
    /// `[num_blocks, 2, block_size, num_kv_heads, head_dim]` (a block's K then V).
    FlashInfer {
        num_kv_heads: usize,
        head_dim: usize,
    },
    /// Multi-head latent attention (DeepSeek family): one tensor per layer,
    /// `[num_blocks, block_size, latent_dim]`, one latent vector per token
    /// (576 for DeepSeek-V3: 512 kv_lora + 64 rope).
    Mla { latent_dim: usize },
    /// vLLM 0.33 (and later): one strided view per layer, logical
    /// `[num_blocks, num_kv_heads, block_size, 2 * head_size]` (K then V on the last
    /// axis), physical order given by the view's strides (`KVCacheLayout`: NHD by default).
    /// A block's page of one layer is one or more dense runs; see [`PagedView`].
    Paged(PagedView),
    /// Cross-layer contiguous: one tensor for all layers,
    /// `[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]`, so a block is
    /// one contiguous run of bytes — what makes offload a single large transfer.
    CrossLayer {
        num_kv_heads: usize,
        head_dim: usize,
    },
}

/// Physical order of a dense vLLM page (`KVCacheLayout` of vLLM 0.33).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageOrder {
    /// Token-major `[block_size, num_kv_heads, 2 * head_size]` (vLLM `LBNHC`, alias `NHD`, the default).
    Nhd,
    /// Head-major `[num_kv_heads, block_size, 2 * head_size]` (vLLM `LBHNC`, alias `HND`).
    Hnd,
}

/// One layer's view of a vLLM 0.33 cache: logical `[num_blocks, num_kv_heads,
/// block_size, 2 * head_size]` with the given element strides (the last axis has
/// stride 1). Views of all layers share these strides; each layer is its own tensor
/// (its base address), so views into one shared allocation (vLLM's cross-layer
/// `BLNHC` / `BHLNC`, where `block_stride` spans every layer's page) work too.
///
/// A (block, layer) page is copied as dense runs: the whole page when heads and tokens
/// are dense in either order (NHD, HND), else one run per head (`LHBNC`, `BHLNC`).
/// Staging holds each page in that physical order (heads outer when they are runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedView {
    /// KV heads (after tensor-parallel split).
    pub num_kv_heads: usize,
    /// Head size; the last axis holds `2 * head_size` elements (K then V).
    pub head_size: usize,
    /// Elements between consecutive blocks.
    pub block_stride: usize,
    /// Elements between consecutive heads.
    pub head_stride: usize,
    /// Elements between consecutive tokens.
    pub token_stride: usize,
}

impl PagedView {
    /// The dense layer-compact view vLLM allocates by default (`LBNHC` or `LBHNC`).
    pub fn dense(
        num_kv_heads: usize,
        head_size: usize,
        block_size: usize,
        order: PageOrder,
    ) -> Self {
        let c = 2 * head_size;
        let (head_stride, token_stride) = match order {
            PageOrder::Nhd => (c, num_kv_heads * c),
            PageOrder::Hnd => (block_size * c, c),
        };
        Self {
            num_kv_heads,
            head_size,
            block_stride: num_kv_heads * block_size * c,
            head_stride,
            token_stride,
        }
    }

    /// Elements of one token of one head (K and V).
    pub fn content(&self) -> usize {
        2 * self.head_size
    }

    /// (planes, elements per run, plane stride in elements): how a page splits into
    /// dense runs, or `None` when the strides are not one of the supported shapes.
    fn runs(&self, block_size: usize) -> Option<(usize, usize, usize)> {
        let (h, n, c) = (self.num_kv_heads, block_size, self.content());
        // A size-1 axis has no meaningful stride.
        let tokens_dense = n == 1 || self.token_stride == c;
        let nhd = (h == 1 || self.head_stride == c) && (n == 1 || self.token_stride == h * c);
        let hnd = tokens_dense && (h == 1 || self.head_stride == n * c);
        if nhd || hnd {
            return Some((1, h * n * c, 0));
        }
        // Tokens of a head dense, heads elsewhere (head-major outside the block).
        tokens_dense.then_some((h, n * c, self.head_stride))
    }
}

/// Shape of a paged KV cache; validated by [`KvCacheSpec::try_new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheSpec {
    layout: KvLayout,
    dtype: Dtype,
    num_layers: usize,
    num_blocks: usize,
    block_size: usize,
}

impl KvCacheSpec {
    /// Checks that every dimension is non-zero and that every size fits in `usize`.
    pub fn try_new(
        layout: KvLayout,
        dtype: Dtype,
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, CopyError> {
        let spec = Self {
            layout,
            dtype,
            num_layers,
            num_blocks,
            block_size,
        };
        let (a, b) = match layout {
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
            } => (num_kv_heads, head_dim),
            KvLayout::Mla { latent_dim } => (latent_dim, 1),
            KvLayout::Paged(v) => (v.num_kv_heads, v.head_size),
        };
        if [a, b, num_layers, num_blocks, block_size].contains(&0) {
            return Err(CopyError::InvalidShape("every dimension must be non-zero"));
        }
        if let KvLayout::Paged(v) = layout {
            if v.runs(block_size).is_none() {
                return Err(CopyError::InvalidShape(
                    "paged view: tokens of a head must be dense (token stride = 2 * head_size) or the page dense in NHD/HND order",
                ));
            }
            let page = v.num_kv_heads as u128 * block_size as u128 * v.content() as u128;
            let (planes, run, plane_stride) = v.runs(block_size).unwrap_or((1, 0, 0));
            // Runs of one page must not overlap, and pages of two blocks must not either.
            if planes > 1 && (plane_stride as u128) < run as u128 {
                return Err(CopyError::InvalidShape("paged view: head runs overlap"));
            }
            if num_blocks > 1 && planes == 1 && (v.block_stride as u128) < page {
                return Err(CopyError::InvalidShape(
                    "paged view: block stride smaller than a page",
                ));
            }
            if num_blocks > 1 && planes > 1 && v.block_stride < run {
                return Err(CopyError::InvalidShape(
                    "paged view: block stride smaller than a run",
                ));
            }
        }
        // Build the map once to prove every size (incl. whole tensors) fits.
        ChunkMap::try_from_parts(spec.parts())?;
        Ok(spec)
    }

    /// The layout.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Number of attention layers.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Number of blocks the cache holds.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The addressing rule of this cache; infallible because `try_new` validated it.
    pub fn chunk_map(&self) -> ChunkMap {
        ChunkMap::from_parts_unchecked(self.parts())
    }

    fn parts(&self) -> MapParts {
        let (per_token, planes) = match self.layout {
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
            } => (num_kv_heads as u128 * head_dim as u128, 2),
            KvLayout::Mla { latent_dim } => (latent_dim as u128, 1),
            KvLayout::Paged(_) => (0, 1),
        };
        let chunk = per_token * self.block_size as u128 * self.dtype.size() as u128;
        let (layers, blocks) = (self.num_layers as u128, self.num_blocks as u128);
        match self.layout {
            KvLayout::Flash { .. } | KvLayout::Mla { .. } => MapParts {
                per_layer_tensors: true,
                num_layers: layers,
                num_blocks: blocks,
                planes,
                chunk,
                layer_stride: 0,
                plane_stride: blocks * chunk,
                block_stride: chunk,
            },
            KvLayout::FlashInfer { .. } => MapParts {
                per_layer_tensors: true,
                num_layers: layers,
                num_blocks: blocks,
                planes,
                chunk,
                layer_stride: 0,
                plane_stride: chunk,
                block_stride: planes * chunk,
            },
            KvLayout::Paged(v) => {
                let es = self.dtype.size() as u128;
                let (planes, run, plane_stride) = v.runs(self.block_size).unwrap_or((1, 0, 0));
                MapParts {
                    per_layer_tensors: true,
                    num_layers: layers,
                    num_blocks: blocks,
                    planes: planes as u128,
                    chunk: run as u128 * es,
                    layer_stride: 0,
                    plane_stride: plane_stride as u128 * es,
                    block_stride: v.block_stride as u128 * es,
                }
            }
            KvLayout::CrossLayer { .. } => MapParts {
                per_layer_tensors: false,
                num_layers: layers,
                num_blocks: blocks,
                planes,
                chunk,
                layer_stride: planes * chunk,
                plane_stride: chunk,
                block_stride: layers * planes * chunk,
            },
        }
    }
}

/// Per-layer linear-attention / SSM state: one tensor per layer, `[num_slots, slab_bytes]`.
/// A snapshot copies slot `s` of every layer into staging, layer after layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateSpec {
    num_layers: usize,
    num_slots: usize,
    slab_bytes: usize,
}

impl StateSpec {
    /// Checks that every dimension is non-zero and that sizes fit in `usize`.
    pub fn try_new(
        num_layers: usize,
        num_slots: usize,
        slab_bytes: usize,
    ) -> Result<Self, CopyError> {
        if [num_layers, num_slots, slab_bytes].contains(&0) {
            return Err(CopyError::InvalidShape("every dimension must be non-zero"));
        }
        let spec = Self {
            num_layers,
            num_slots,
            slab_bytes,
        };
        ChunkMap::try_from_parts(spec.parts())?;
        Ok(spec)
    }

    /// The addressing rule (one plane, a slot is a block).
    pub fn chunk_map(&self) -> ChunkMap {
        ChunkMap::from_parts_unchecked(self.parts())
    }

    fn parts(&self) -> MapParts {
        MapParts {
            per_layer_tensors: true,
            num_layers: self.num_layers as u128,
            num_blocks: self.num_slots as u128,
            planes: 1,
            chunk: self.slab_bytes as u128,
            layer_stride: 0,
            plane_stride: self.num_slots as u128 * self.slab_bytes as u128,
            block_stride: self.slab_bytes as u128,
        }
    }
}

/// Sizes in `u128` so overflow is detected once, at construction.
#[derive(Clone, Copy)]
struct MapParts {
    per_layer_tensors: bool,
    num_layers: u128,
    num_blocks: u128,
    planes: u128,
    chunk: u128,
    layer_stride: u128,
    plane_stride: u128,
    block_stride: u128,
}

/// The addressing rule every layout reduces to.
///
/// A *chunk* is the bytes of one (block, layer, plane) — plane 0 is K (or the MLA latent /
/// the state slab), plane 1 is V. Chunk (b, l, p) starts at byte
/// `layer_offset(l) + p * plane_stride + b * block_stride` of tensor `tensor_of(l)`.
/// Staging entry `i` (the `i`-th requested block) holds its chunks at
/// `((i * num_layers + l) * planes + p) * chunk_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkMap {
    per_layer_tensors: bool,
    num_layers: usize,
    num_blocks: usize,
    planes: usize,
    chunk_bytes: usize,
    layer_stride: usize,
    plane_stride: usize,
    block_stride: usize,
    tensor_bytes: usize,
}

impl ChunkMap {
    fn try_from_parts(p: MapParts) -> Result<Self, CopyError> {
        let fit = |v: u128| {
            usize::try_from(v).map_err(|_| CopyError::InvalidShape("sizes overflow usize"))
        };
        // The furthest byte a chunk of the tensor reaches (dense layouts: their size;
        // strided views: their extent inside a shared allocation).
        let last_layer = if p.per_layer_tensors {
            0
        } else {
            p.num_layers - 1
        };
        let tensor_bytes = last_layer * p.layer_stride
            + (p.planes - 1) * p.plane_stride
            + (p.num_blocks - 1) * p.block_stride
            + p.chunk;
        // Offsets are also computed in i64 on the GPU and staging sizes may cover every block.
        let staging_all = p.num_blocks * p.num_layers * p.planes * p.chunk;
        if tensor_bytes.max(staging_all) > i64::MAX as u128 {
            return Err(CopyError::InvalidShape("sizes overflow i64"));
        }
        Ok(Self {
            per_layer_tensors: p.per_layer_tensors,
            num_layers: fit(p.num_layers)?,
            num_blocks: fit(p.num_blocks)?,
            planes: fit(p.planes)?,
            chunk_bytes: fit(p.chunk)?,
            layer_stride: fit(p.layer_stride)?,
            plane_stride: fit(p.plane_stride)?,
            block_stride: fit(p.block_stride)?,
            tensor_bytes: fit(tensor_bytes)?,
        })
    }

    fn from_parts_unchecked(p: MapParts) -> Self {
        match Self::try_from_parts(p) {
            Ok(map) => map,
            // Specs are only constructed through `try_new`, which ran the same check.
            Err(e) => unreachable!("validated spec produced an invalid map: {e}"),
        }
    }

    /// Number of tensors a caller passes: one per layer, or one for a cross-layer cache.
    pub fn num_tensors(&self) -> usize {
        if self.per_layer_tensors {
            self.num_layers
        } else {
            1
        }
    }

    /// Bytes each tensor must hold at least (from its base address to its last chunk's end).
    pub fn tensor_bytes(&self) -> usize {
        self.tensor_bytes
    }

    /// Layers per block.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Blocks (or slots) in the cache; valid ids are `0..num_blocks`.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Planes per layer: 2 (K, V) or 1 (MLA latent, state slab).
    pub fn planes(&self) -> usize {
        self.planes
    }

    /// Bytes of one (block, layer, plane) chunk.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Distance between consecutive planes of a layer.
    pub fn plane_stride(&self) -> usize {
        self.plane_stride
    }

    /// Distance between consecutive blocks of a layer and plane.
    pub fn block_stride(&self) -> usize {
        self.block_stride
    }

    /// Staging bytes of one block: all its layers and planes.
    pub fn block_bytes(&self) -> usize {
        self.num_layers * self.planes * self.chunk_bytes
    }

    /// Staging bytes needed for `n` blocks.
    pub fn staging_bytes(&self, n: usize) -> Result<usize, CopyError> {
        n.checked_mul(self.block_bytes())
            .ok_or(CopyError::InvalidShape("staging size overflows usize"))
    }

    /// Which tensor holds layer `layer`, and where the layer starts inside it.
    pub fn layer_base(&self, layer: usize) -> (usize, usize) {
        if self.per_layer_tensors {
            (layer, 0)
        } else {
            (0, layer * self.layer_stride)
        }
    }

    /// Byte offset of chunk (`block`, `layer`, `plane`) inside its tensor.
    pub fn chunk_offset(&self, block: usize, layer: usize, plane: usize) -> usize {
        self.layer_base(layer).1 + plane * self.plane_stride + block * self.block_stride
    }

    /// Byte offset of a chunk of staging entry `entry`.
    pub fn staging_offset(&self, entry: usize, layer: usize, plane: usize) -> usize {
        ((entry * self.num_layers + layer) * self.planes + plane) * self.chunk_bytes
    }

    /// True when a block's chunks are one contiguous run in staging order (cross-layer).
    pub fn block_is_contiguous(&self) -> bool {
        !self.per_layer_tensors && self.plane_stride == self.chunk_bytes
    }

    /// Validates a request shared by every backend: tensor count and sizes, ids, staging size.
    /// `check_duplicates` is set for scatters.
    pub fn validate(
        &self,
        tensor_sizes: impl ExactSizeIterator<Item = usize>,
        blocks: &[BlockId],
        staging_len: usize,
        check_duplicates: bool,
    ) -> Result<(), CopyError> {
        if tensor_sizes.len() != self.num_tensors() {
            return Err(CopyError::TensorCount {
                expected: self.num_tensors(),
                got: tensor_sizes.len(),
            });
        }
        for (index, have) in tensor_sizes.enumerate() {
            if have < self.tensor_bytes {
                return Err(CopyError::TensorTooSmall {
                    index,
                    need: self.tensor_bytes,
                    have,
                });
            }
        }
        if let Some(&block) = blocks.iter().find(|&&b| b as usize >= self.num_blocks) {
            return Err(CopyError::BlockOutOfRange {
                block,
                num_blocks: self.num_blocks,
            });
        }
        let need = self.staging_bytes(blocks.len())?;
        if staging_len < need {
            return Err(CopyError::StagingTooSmall {
                need,
                have: staging_len,
            });
        }
        if check_duplicates {
            let mut sorted = blocks.to_vec();
            sorted.sort_unstable();
            if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
                return Err(CopyError::DuplicateBlock { block: w[0] });
            }
        }
        Ok(())
    }
}
