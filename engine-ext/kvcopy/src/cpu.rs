//! CPU reference backend: the exact semantics of the copy engine, on host byte slices.

use crate::{BlockId, ChunkMap, CopyError, KvCopy};

/// Reference backend over host memory. Each tensor is any byte container
/// (`Vec<u8>`, `&mut [u8]`, a pinned host buffer); staging is a byte slice.
///
/// Copies are `memcpy`s of whole chunks; a cross-layer cache copies a block at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuCopy;

impl CpuCopy {
    /// [`KvCopy::gather`] for read-only tensors (e.g. `&[u8]`).
    pub fn gather_from<T: AsRef<[u8]>>(
        &self,
        map: &ChunkMap,
        tensors: &[T],
        blocks: &[BlockId],
        staging: &mut [u8],
    ) -> Result<(), CopyError> {
        map.validate(
            tensors.iter().map(|t| t.as_ref().len()),
            blocks,
            staging.len(),
            false,
        )?;
        for_each_run(map, blocks, |tensor, src, dst, len| {
            staging[dst..dst + len].copy_from_slice(&tensors[tensor].as_ref()[src..src + len]);
        });
        Ok(())
    }

    /// [`KvCopy::scatter`] for any writable tensors.
    pub fn scatter_into<T: AsMut<[u8]>>(
        &self,
        map: &ChunkMap,
        tensors: &mut [T],
        blocks: &[BlockId],
        staging: &[u8],
    ) -> Result<(), CopyError> {
        let sizes: Vec<usize> = tensors.iter_mut().map(|t| t.as_mut().len()).collect();
        map.validate(sizes.into_iter(), blocks, staging.len(), true)?;
        for_each_run(map, blocks, |tensor, dst, src, len| {
            tensors[tensor].as_mut()[dst..dst + len].copy_from_slice(&staging[src..src + len]);
        });
        Ok(())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> KvCopy<T> for CpuCopy {
    type Staging = [u8];

    fn gather(
        &self,
        map: &ChunkMap,
        tensors: &[T],
        blocks: &[BlockId],
        staging: &mut [u8],
    ) -> Result<(), CopyError> {
        self.gather_from(map, tensors, blocks, staging)
    }

    fn scatter(
        &self,
        map: &ChunkMap,
        tensors: &mut [T],
        blocks: &[BlockId],
        staging: &[u8],
    ) -> Result<(), CopyError> {
        self.scatter_into(map, tensors, blocks, staging)
    }
}

/// Calls `copy(tensor, tensor_offset, staging_offset, len)` for every contiguous run of a
/// validated request, in staging order.
fn for_each_run(
    map: &ChunkMap,
    blocks: &[BlockId],
    mut copy: impl FnMut(usize, usize, usize, usize),
) {
    for (entry, &block) in blocks.iter().enumerate() {
        let block = block as usize;
        if map.block_is_contiguous() {
            let (tensor, _) = map.layer_base(0);
            copy(
                tensor,
                map.chunk_offset(block, 0, 0),
                map.staging_offset(entry, 0, 0),
                map.block_bytes(),
            );
            continue;
        }
        for layer in 0..map.num_layers() {
            let (tensor, _) = map.layer_base(layer);
            for plane in 0..map.planes() {
                copy(
                    tensor,
                    map.chunk_offset(block, layer, plane),
                    map.staging_offset(entry, layer, plane),
                    map.chunk_bytes(),
                );
            }
        }
    }
}
