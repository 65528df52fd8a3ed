//! KV-copy engine: moves paged KV blocks and linear-state slabs to and from a contiguous staging buffer.
//!
//! One trait, [`KvCopy`], is implemented by two backends with identical semantics:
//! [`CpuCopy`] (the reference, used by every CI test) and [`CudaCopy`] (NVRTC-compiled
//! kernels on `cudarc`, only touched when a CUDA driver is present). Every cache layout
//! is reduced to a [`ChunkMap`], so a backend only knows one addressing rule and the
//! staging format is the same for all layouts (see `docs/kv-copy.md`, included below).
#![doc = include_str!("../../../docs/kv-copy.md")]

mod cpu;
// STYLE.md §4 puts the crate's only unsafe code here, at the CUDA FFI edge. The crate root
// may `deny(unsafe_code)` but must not `forbid` it: no module can relax a `forbid`.
#[allow(
    unsafe_code,
    reason = "FFI edge: CUDA driver and NVRTC calls on raw device pointers"
)]
mod cuda;
mod error;
#[allow(unsafe_code, reason = "FFI edge: a dlopen probe of the NVRTC library")]
mod kernels;
mod layout;
pub mod naive;

pub use cpu::CpuCopy;
pub use cuda::{
    CudaCopy, CudaCopyConfig, DeviceBuffer, DeviceTensor, PTX_ENV, PinnedBuffer, PreparedCopy,
    cuda_driver_present,
};
pub use error::CopyError;
pub use kernels::{KERNEL_ENTRY_POINTS, KERNEL_SOURCES, KernelSource, compile_kernels_ptx};
pub use layout::{
    BlockId, ChunkMap, Dtype, KvCacheSpec, KvLayout, PageOrder, PagedView, StateSpec,
};

/// Moves whole blocks between a paged cache and a contiguous staging buffer.
///
/// `T` is how the backend sees one cache tensor (host bytes for [`CpuCopy`], a device
/// pointer for [`CudaCopy`]); `tensors` holds [`ChunkMap::num_tensors`] of them in layer
/// order. Staging entry `i` of a call is the `i`-th id of `blocks`; within an entry the
/// chunks follow layer order, K before V. All methods validate before they copy: on
/// error nothing has been written.
pub trait KvCopy<T> {
    /// The contiguous buffer blocks are packed into.
    type Staging: ?Sized;

    /// Copies the chunks of `blocks` (in list order) from `tensors` into `staging`.
    fn gather(
        &self,
        map: &ChunkMap,
        tensors: &[T],
        blocks: &[BlockId],
        staging: &mut Self::Staging,
    ) -> Result<(), CopyError>;

    /// Copies staging entries back into the chunks of `blocks`; the inverse of [`KvCopy::gather`].
    /// Duplicate ids are rejected: two entries racing for one block has no defined result.
    fn scatter(
        &self,
        map: &ChunkMap,
        tensors: &mut [T],
        blocks: &[BlockId],
        staging: &Self::Staging,
    ) -> Result<(), CopyError>;

    /// Gathers KV blocks of a paged cache described by `spec`.
    fn gather_blocks(
        &self,
        spec: &KvCacheSpec,
        tensors: &[T],
        blocks: &[BlockId],
        staging: &mut Self::Staging,
    ) -> Result<(), CopyError> {
        self.gather(&spec.chunk_map(), tensors, blocks, staging)
    }

    /// Scatters KV blocks into a paged cache described by `spec`.
    fn scatter_blocks(
        &self,
        spec: &KvCacheSpec,
        tensors: &mut [T],
        blocks: &[BlockId],
        staging: &Self::Staging,
    ) -> Result<(), CopyError> {
        self.scatter(&spec.chunk_map(), tensors, blocks, staging)
    }

    /// Snapshots the per-layer linear-state slabs of `slots` into staging.
    fn snapshot_state(
        &self,
        spec: &StateSpec,
        tensors: &[T],
        slots: &[BlockId],
        staging: &mut Self::Staging,
    ) -> Result<(), CopyError> {
        self.gather(&spec.chunk_map(), tensors, slots, staging)
    }

    /// Restores per-layer linear-state slabs of `slots` from staging.
    fn restore_state(
        &self,
        spec: &StateSpec,
        tensors: &mut [T],
        slots: &[BlockId],
        staging: &Self::Staging,
    ) -> Result<(), CopyError> {
        self.scatter(&spec.chunk_map(), tensors, slots, staging)
    }
}
