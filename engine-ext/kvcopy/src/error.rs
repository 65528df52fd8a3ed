//! Typed errors of the copy engine: what a caller did wrong, or what CUDA refused.

use cudarc::driver::sys::cudaError_enum as CuResult;
use tether_engine::Fault;

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

impl CopyError {
    /// Who failed ([`Fault`]): validation errors are the caller's; an exhausted device
    /// memory or a not-yet-ready resource is transient; every other CUDA or NVRTC failure
    /// is the device's.
    pub fn fault(&self) -> Fault {
        match self {
            CopyError::InvalidShape(_)
            | CopyError::BlockOutOfRange { .. }
            | CopyError::DuplicateBlock { .. }
            | CopyError::StagingTooSmall { .. }
            | CopyError::TensorCount { .. }
            | CopyError::TensorTooSmall { .. } => Fault::Caller,
            CopyError::Driver(e) => match e.0 {
                CuResult::CUDA_ERROR_OUT_OF_MEMORY | CuResult::CUDA_ERROR_NOT_READY => {
                    Fault::Transient
                }
                CuResult::CUDA_ERROR_INVALID_VALUE => Fault::Caller,
                _ => Fault::Device,
            },
            CopyError::CudaUnavailable(_) | CopyError::Compile(_) => Fault::Device,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::DriverError;

    #[test]
    fn every_error_names_who_failed() {
        assert_eq!(CopyError::InvalidShape("x").fault(), Fault::Caller);
        assert_eq!(
            CopyError::BlockOutOfRange {
                block: 9,
                num_blocks: 4
            }
            .fault(),
            Fault::Caller
        );
        assert_eq!(
            CopyError::DuplicateBlock { block: 1 }.fault(),
            Fault::Caller
        );
        assert_eq!(
            CopyError::StagingTooSmall { need: 2, have: 1 }.fault(),
            Fault::Caller
        );
        assert_eq!(
            CopyError::TensorCount {
                expected: 2,
                got: 1
            }
            .fault(),
            Fault::Caller
        );
        assert_eq!(
            CopyError::TensorTooSmall {
                index: 0,
                need: 2,
                have: 1
            }
            .fault(),
            Fault::Caller
        );
        assert_eq!(
            CopyError::CudaUnavailable("none".into()).fault(),
            Fault::Device
        );
        assert_eq!(CopyError::Compile("log".into()).fault(), Fault::Device);
        let driver = |r| CopyError::Driver(DriverError(r)).fault();
        assert_eq!(driver(CuResult::CUDA_ERROR_OUT_OF_MEMORY), Fault::Transient);
        assert_eq!(driver(CuResult::CUDA_ERROR_INVALID_VALUE), Fault::Caller);
        assert_eq!(driver(CuResult::CUDA_ERROR_ILLEGAL_ADDRESS), Fault::Device);
        assert_eq!(driver(CuResult::CUDA_ERROR_INVALID_CONTEXT), Fault::Device);
    }
}
