//! Typed errors of the copy engine: what a caller did wrong, or what CUDA refused.

/// Why a copy was refused or failed. Validation errors are raised before any byte moves.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// A shape parameter is zero or the sizes overflow `usize`.
    #[error("invalid shape: {0}")]
    InvalidShape(&'static str),
    /// A block (or state slot) id is not below the number of blocks.
    #[error("block id {block} out of range: the cache has {num_blocks} blocks")]
    BlockOutOfRange { block: u32, num_blocks: usize },
    /// The same block appears twice in a scatter.
    #[error("block id {block} appears twice in one scatter")]
    DuplicateBlock { block: u32 },
    /// The staging buffer cannot hold the requested blocks.
    #[error("staging buffer holds {have} bytes, {need} needed")]
    StagingTooSmall { need: usize, have: usize },
    /// The number of tensors passed does not match the layout.
    #[error("layout needs {expected} tensors, got {got}")]
    TensorCount { expected: usize, got: usize },
    /// A tensor is smaller than its layout says.
    #[error("tensor {index} holds {have} bytes, layout needs {need}")]
    TensorTooSmall {
        index: usize,
        need: usize,
        have: usize,
    },
    /// No CUDA driver library could be loaded, or no device is usable.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// NVRTC is missing or a kernel did not compile.
    #[error("kernel compilation failed: {0}")]
    Compile(String),
}
