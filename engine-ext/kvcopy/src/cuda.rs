//! CUDA backend: NVRTC-compiled gather/scatter kernels and pinned-memory transfers on `cudarc`.
//!
//! This is the crate's FFI edge: raw device pointers (vLLM hands over tensor addresses)
//! and driver calls live here, each `unsafe` block with its reason. Nothing here touches
//! CUDA before [`cuda_driver_present`] says the driver library loads.

use crate::kernels::{GATHER_KERNEL, KERNEL_SOURCES, SCATTER_KERNEL, compile_kernels_ptx};
use crate::{BlockId, ChunkMap, CopyError, KvCopy};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use std::marker::PhantomData;
use std::sync::Arc;

/// Environment variable naming a PTX file to load instead of compiling at run time.
pub const PTX_ENV: &str = "TETHER_KVCOPY_PTX";

/// True when the CUDA driver library can be loaded. Creating a context without it panics
/// inside `cudarc`, so every entry point checks this first.
pub fn cuda_driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library; calls no CUDA function.
    unsafe { sys::is_culib_present() }
}

/// How the CUDA backend launches and where its kernels come from.
#[derive(Clone, Debug)]
pub struct CudaCopyConfig {
    /// Device ordinal.
    pub ordinal: usize,
    /// Upper bound on thread blocks per launch (grid-strided beyond it). Resident CTAs are
    /// what a copy steals from compute; 4 CTAs of 256 threads per SM, so 64 ≈ 16 SMs.
    pub max_ctas: u32,
    /// Threads per thread block.
    pub threads_per_cta: u32,
    /// PTX text to load. `None`: the file named by `TETHER_KVCOPY_PTX`, else NVRTC
    /// compiles the embedded `kernels/kv_copy.cu` for this device at run time.
    pub ptx: Option<String>,
}

impl Default for CudaCopyConfig {
    fn default() -> Self {
        Self {
            ordinal: 0,
            max_ctas: 64,
            threads_per_cta: 256,
            ptx: None,
        }
    }
}

/// A cache tensor in device memory, as vLLM exposes it: an address and a size.
/// The lifetime ties it to the allocation it came from.
#[derive(Clone, Copy, Debug)]
pub struct DeviceTensor<'a> {
    ptr: CUdeviceptr,
    bytes: usize,
    _owner: PhantomData<&'a ()>,
}

impl DeviceTensor<'static> {
    /// Wraps a raw device address (e.g. `tensor.data_ptr()` of a torch tensor).
    ///
    /// # Safety
    /// `ptr..ptr+bytes` must be device memory of the backend's context, valid for reads and
    /// writes until every copy that uses it has completed.
    pub unsafe fn from_raw(ptr: u64, bytes: usize) -> Self {
        Self {
            ptr,
            bytes,
            _owner: PhantomData,
        }
    }
}

impl DeviceTensor<'_> {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Device memory owned by the backend (staging buffers, test caches).
#[derive(Debug)]
pub struct DeviceBuffer {
    slice: CudaSlice<u8>,
}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// The buffer as a cache tensor, borrowed for as long as the buffer lives.
    pub fn tensor(&self) -> DeviceTensor<'_> {
        DeviceTensor {
            ptr: self.raw_ptr(),
            bytes: self.len(),
            _owner: PhantomData,
        }
    }

    fn raw_ptr(&self) -> CUdeviceptr {
        // All work on this buffer is issued on the allocating stream, so the read/write
        // events cudarc records through the guard carry no extra ordering.
        let (ptr, _guard) = self.slice.device_ptr(self.slice.stream());
        ptr
    }
}

/// Page-locked host memory mapped into the device address space: the host tier of
/// offload/restore. Device-side copies into and out of it are ordered by the copy stream
/// (use a buffer with one [`CudaCopy`]); host views wait for the last queued copy.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    device_ptr: CUdeviceptr,
    ctx: Arc<CudaContext>,
    pending: Option<CudaEvent>,
}

impl PinnedBuffer {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host view, after waiting for queued copies into or out of the buffer.
    pub fn as_slice(&mut self) -> Result<&[u8], CopyError> {
        self.wait()?;
        // SAFETY: `ptr` is a live allocation of `len` bytes (freed only in Drop), and no
        // device work on it is pending after `wait`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// Mutable host view, after waiting for queued copies into or out of the buffer.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], CopyError> {
        self.wait()?;
        // SAFETY: as in `as_slice`; `&mut self` makes the view unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    fn wait(&mut self) -> Result<(), CopyError> {
        if let Some(ev) = self.pending.take() {
            ev.synchronize()?;
        }
        Ok(())
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        // Freeing memory a copy still writes into would corrupt the heap: wait first.
        let _ = self.wait();
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` came from `cuMemHostAlloc` in this context and is freed once.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

/// The CUDA copy backend: one context, one copy stream of its own, the two kernels.
///
/// Every operation is queued on the copy stream and returns at once. Order it against
/// the compute stream with [`CudaCopy::wait_for`] (copy after compute) and
/// [`CudaCopy::signal`] (compute after copy), or block with [`CudaCopy::synchronize`].
#[derive(Debug)]
pub struct CudaCopy {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    gather_fn: CudaFunction,
    scatter_fn: CudaFunction,
    config: CudaCopyConfig,
}

impl CudaCopy {
    /// Opens device `config.ordinal` and loads the kernels.
    /// Fails with [`CopyError::CudaUnavailable`] when there is no driver or device.
    pub fn new(config: CudaCopyConfig) -> Result<Self, CopyError> {
        if !cuda_driver_present() {
            return Err(CopyError::CudaUnavailable(
                "no CUDA driver library (libcuda.so) found".into(),
            ));
        }
        let ctx = CudaContext::new(config.ordinal)
            .map_err(|e| CopyError::CudaUnavailable(format!("device {}: {e}", config.ordinal)))?;
        Self::with_context(ctx, config)
    }

    /// Uses an existing context (e.g. the primary context the serving engine runs in).
    pub fn with_context(ctx: Arc<CudaContext>, config: CudaCopyConfig) -> Result<Self, CopyError> {
        if config.max_ctas == 0 || config.threads_per_cta == 0 || config.threads_per_cta > 1024 {
            return Err(CopyError::InvalidShape(
                "max_ctas must be > 0 and threads_per_cta in 1..=1024",
            ));
        }
        let ptx = match (&config.ptx, std::env::var_os(PTX_ENV)) {
            (Some(text), _) => text.clone(),
            (None, Some(path)) => std::fs::read_to_string(&path).map_err(|e| {
                CopyError::Compile(format!("reading {PTX_ENV}={}: {e}", path.to_string_lossy()))
            })?,
            (None, None) => {
                let (major, minor) = ctx.compute_capability()?;
                compile_kernels_ptx(&KERNEL_SOURCES[0], &format!("compute_{major}{minor}"))?
            }
        };
        // cudarc turns PTX text into a C string and panics on an interior NUL.
        if ptx.contains('\0') {
            return Err(CopyError::Compile("PTX text contains a NUL byte".into()));
        }
        let module = ctx.load_module(Ptx::from_src(ptx))?;
        let gather_fn = module.load_function(GATHER_KERNEL)?;
        let scatter_fn = module.load_function(SCATTER_KERNEL)?;
        let stream = ctx.new_stream()?;
        Ok(Self {
            ctx,
            stream,
            gather_fn,
            scatter_fn,
            config,
        })
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The copy stream every operation is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The launch configuration.
    pub fn config(&self) -> &CudaCopyConfig {
        &self.config
    }

    /// Changes the CTA bound of later launches (benchmarks sweep it).
    pub fn set_max_ctas(&mut self, max_ctas: u32) -> Result<(), CopyError> {
        if max_ctas == 0 {
            return Err(CopyError::InvalidShape("max_ctas must be > 0"));
        }
        self.config.max_ctas = max_ctas;
        Ok(())
    }

    /// Copies start only after everything queued so far on `compute` (e.g. the forward pass
    /// that wrote the blocks).
    pub fn wait_for(&self, compute: &CudaStream) -> Result<(), CopyError> {
        let ev = compute.record_event(None)?;
        self.stream.wait(&ev)?;
        Ok(())
    }

    /// Work queued later on `compute` starts only after every copy queued so far
    /// (e.g. attention that reads restored blocks). Returns the event for host-side polling.
    pub fn signal(&self, compute: &CudaStream) -> Result<CudaEvent, CopyError> {
        let ev = self.stream.record_event(None)?;
        compute.wait(&ev)?;
        Ok(ev)
    }

    /// Blocks until every queued copy has finished.
    pub fn synchronize(&self) -> Result<(), CopyError> {
        self.stream.synchronize()?;
        Ok(())
    }

    /// Allocates zeroed device memory on the copy stream.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CopyError> {
        Ok(DeviceBuffer {
            slice: self.stream.alloc_zeros::<u8>(bytes)?,
        })
    }

    /// Allocates device memory holding a copy of `data`.
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer, CopyError> {
        Ok(DeviceBuffer {
            slice: self.stream.clone_htod(data)?,
        })
    }

    /// Copies device memory back to the host, after all queued copies.
    pub fn download(&self, buf: &DeviceBuffer) -> Result<Vec<u8>, CopyError> {
        Ok(self.stream.clone_dtoh(&buf.slice)?)
    }

    /// Allocates zeroed pinned host memory the device can address directly.
    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer, CopyError> {
        self.ctx.bind_to_thread()?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: allocates `bytes` of page-locked memory; ownership passes to PinnedBuffer.
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes.max(1), flags) }?.cast::<u8>();
        let mut buf = PinnedBuffer {
            ptr,
            len: bytes,
            device_ptr: 0,
            ctx: self.ctx.clone(),
            pending: None,
        };
        let mut dptr: CUdeviceptr = 0;
        self.ctx.bind_to_thread()?;
        // SAFETY: `ptr` was allocated with DEVICEMAP in this context; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr.cast(), 0) }.result()?;
        buf.device_ptr = dptr;
        buf.as_mut_slice()?.fill(0);
        Ok(buf)
    }

    /// Gathers into device staging, then moves staging to `host[host_offset..]` with one
    /// DMA on the copy stream (offload). The host buffer waits for it before host reads.
    pub fn offload(
        &self,
        map: &ChunkMap,
        tensors: &[DeviceTensor<'_>],
        blocks: &[BlockId],
        staging: &mut DeviceTensor<'_>,
        host: &mut PinnedBuffer,
        host_offset: usize,
    ) -> Result<(), CopyError> {
        let bytes = map.staging_bytes(blocks.len())?;
        check_host_range(host, host_offset, bytes)?;
        map.validate(
            tensors.iter().map(|t| t.bytes),
            blocks,
            staging.bytes,
            false,
        )?;
        self.launch(&self.gather_fn, map, tensors, blocks, staging.ptr)?;
        // Raw driver calls act on the calling thread's current context (a Python worker
        // thread may have none bound): bind ours first.
        self.ctx.bind_to_thread()?;
        // SAFETY: the host range was checked above and stays allocated until `pending`
        // completes (Drop and every host view wait for it); the device range is staging.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                host.ptr.add(host_offset).cast(),
                staging.ptr,
                bytes,
                self.stream.cu_stream(),
            )
        }
        .result()?;
        host.pending = Some(self.stream.record_event(None)?);
        Ok(())
    }

    /// Moves `host[host_offset..]` to device staging with one DMA, then scatters (restore).
    pub fn restore(
        &self,
        map: &ChunkMap,
        tensors: &mut [DeviceTensor<'_>],
        blocks: &[BlockId],
        staging: &mut DeviceTensor<'_>,
        host: &mut PinnedBuffer,
        host_offset: usize,
    ) -> Result<(), CopyError> {
        let bytes = map.staging_bytes(blocks.len())?;
        check_host_range(host, host_offset, bytes)?;
        map.validate(tensors.iter().map(|t| t.bytes), blocks, staging.bytes, true)?;
        self.ctx.bind_to_thread()?;
        // SAFETY: ranges checked above; the host buffer is kept alive and unwritten from the
        // host side until `pending` completes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                staging.ptr,
                host.ptr.add(host_offset).cast(),
                bytes,
                self.stream.cu_stream(),
            )
        }
        .result()?;
        host.pending = Some(self.stream.record_event(None)?);
        self.launch(&self.scatter_fn, map, tensors, blocks, staging.ptr)
    }

    /// Gather kernel writing straight into mapped pinned memory (no device staging, no
    /// DMA engine; the kernel's stores cross PCIe).
    pub fn gather_to_host(
        &self,
        map: &ChunkMap,
        tensors: &[DeviceTensor<'_>],
        blocks: &[BlockId],
        host: &mut PinnedBuffer,
    ) -> Result<(), CopyError> {
        map.validate(tensors.iter().map(|t| t.bytes), blocks, host.len, false)?;
        self.launch(&self.gather_fn, map, tensors, blocks, host.device_ptr)?;
        host.pending = Some(self.stream.record_event(None)?);
        Ok(())
    }

    /// Scatter kernel reading straight from mapped pinned memory.
    pub fn scatter_from_host(
        &self,
        map: &ChunkMap,
        tensors: &mut [DeviceTensor<'_>],
        blocks: &[BlockId],
        host: &mut PinnedBuffer,
    ) -> Result<(), CopyError> {
        map.validate(tensors.iter().map(|t| t.bytes), blocks, host.len, true)?;
        self.launch(&self.scatter_fn, map, tensors, blocks, host.device_ptr)?;
        host.pending = Some(self.stream.record_event(None)?);
        Ok(())
    }

    /// The baseline the kernels are measured against: one `cuMemcpyAsync` per contiguous
    /// run (per block for a cross-layer cache, per (block, layer, plane) otherwise),
    /// device to host, same staging format.
    pub fn offload_per_block(
        &self,
        map: &ChunkMap,
        tensors: &[DeviceTensor<'_>],
        blocks: &[BlockId],
        host: &mut PinnedBuffer,
    ) -> Result<(), CopyError> {
        map.validate(tensors.iter().map(|t| t.bytes), blocks, host.len, false)?;
        self.ctx.bind_to_thread()?;
        for (tensor_off, staging_off, len, tensor) in runs(map, blocks) {
            // SAFETY: validate() proved both ranges lie inside their buffers.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    host.ptr.add(staging_off).cast(),
                    tensors[tensor].ptr + tensor_off as u64,
                    len,
                    self.stream.cu_stream(),
                )
            }
            .result()?;
        }
        host.pending = Some(self.stream.record_event(None)?);
        Ok(())
    }

    /// Host-to-device counterpart of [`CudaCopy::offload_per_block`].
    pub fn restore_per_block(
        &self,
        map: &ChunkMap,
        tensors: &mut [DeviceTensor<'_>],
        blocks: &[BlockId],
        host: &mut PinnedBuffer,
    ) -> Result<(), CopyError> {
        map.validate(tensors.iter().map(|t| t.bytes), blocks, host.len, true)?;
        self.ctx.bind_to_thread()?;
        for (tensor_off, staging_off, len, tensor) in runs(map, blocks) {
            // SAFETY: validate() proved both ranges lie inside their buffers.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    tensors[tensor].ptr + tensor_off as u64,
                    host.ptr.add(staging_off).cast(),
                    len,
                    self.stream.cu_stream(),
                )
            }
            .result()?;
        }
        host.pending = Some(self.stream.record_event(None)?);
        Ok(())
    }

    /// Validates a request and uploads its kernel arguments once, so it can be launched
    /// repeatedly with nothing but the launch on the host path (what the benchmark
    /// times). `scatter` applies the scatter checks (no duplicate ids).
    pub fn prepare<'a>(
        &self,
        map: &ChunkMap,
        tensors: &[DeviceTensor<'a>],
        blocks: &[BlockId],
        staging_bytes: usize,
        scatter: bool,
    ) -> Result<PreparedCopy<'a>, CopyError> {
        map.validate(
            tensors.iter().map(|t| t.bytes),
            blocks,
            staging_bytes,
            scatter,
        )?;
        let ptrs: Vec<u64> = tensors.iter().map(|t| t.ptr).collect();
        let params = KernelParams::new(map, &ptrs, blocks.len())?;
        let (d_base, d_blocks) = if blocks.is_empty() {
            (None, None)
        } else {
            (
                Some(self.stream.clone_htod(&params.layer_base)?),
                Some(self.stream.clone_htod(blocks)?),
            )
        };
        Ok(PreparedCopy {
            params,
            d_base,
            d_blocks,
            staging_bytes: map.staging_bytes(blocks.len())?,
            scatter,
            _tensors: PhantomData,
        })
    }

    /// Launches a prepared gather (cache → `staging`).
    pub fn gather_prepared(
        &self,
        p: &PreparedCopy<'_>,
        staging: &mut DeviceTensor<'_>,
    ) -> Result<(), CopyError> {
        if p.scatter {
            return Err(CopyError::InvalidShape(
                "request was prepared for a scatter",
            ));
        }
        self.launch_prepared(&self.gather_fn, p, staging.ptr, staging.bytes)
    }

    /// Launches a prepared scatter (`staging` → cache).
    pub fn scatter_prepared(
        &self,
        p: &PreparedCopy<'_>,
        staging: &DeviceTensor<'_>,
    ) -> Result<(), CopyError> {
        if !p.scatter {
            return Err(CopyError::InvalidShape("request was prepared for a gather"));
        }
        self.launch_prepared(&self.scatter_fn, p, staging.ptr, staging.bytes)
    }

    /// Launches `func` over a validated request; `staging` is any device-addressable pointer.
    fn launch(
        &self,
        func: &CudaFunction,
        map: &ChunkMap,
        tensors: &[DeviceTensor<'_>],
        blocks: &[BlockId],
        staging: CUdeviceptr,
    ) -> Result<(), CopyError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let ptrs: Vec<u64> = tensors.iter().map(|t| t.ptr).collect();
        let params = KernelParams::new(map, &ptrs, blocks.len())?;
        let p = PreparedCopy {
            d_base: Some(self.stream.clone_htod(&params.layer_base)?),
            d_blocks: Some(self.stream.clone_htod(blocks)?),
            staging_bytes: 0,
            params,
            scatter: false,
            _tensors: PhantomData,
        };
        self.launch_prepared(func, &p, staging, usize::MAX)
    }

    fn launch_prepared(
        &self,
        func: &CudaFunction,
        prepared: &PreparedCopy<'_>,
        staging: CUdeviceptr,
        staging_len: usize,
    ) -> Result<(), CopyError> {
        let (Some(d_base), Some(d_blocks)) = (&prepared.d_base, &prepared.d_blocks) else {
            return Ok(());
        };
        if staging_len < prepared.staging_bytes {
            return Err(CopyError::StagingTooSmall {
                need: prepared.staging_bytes,
                have: staging_len,
            });
        }
        let p = &prepared.params;
        let grid = p.items().min(u64::from(self.config.max_ctas)) as u32;
        let (num_entries, num_layers, planes) = (p.num_entries, p.num_layers, p.planes);
        let (chunk, plane_stride, block_stride) = (p.chunk_bytes, p.plane_stride, p.block_stride);
        let mut args = self.stream.launch_builder(func);
        args.arg(d_base)
            .arg(d_blocks)
            .arg(&staging)
            .arg(&num_entries)
            .arg(&num_layers)
            .arg(&planes)
            .arg(&chunk)
            .arg(&plane_stride)
            .arg(&block_stride);
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (self.config.threads_per_cta, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the argument list matches the kernel signature in kernels/kv_copy.cu
        // (u64*, u32*, u8*, u32, u32, u32, u64, u64, u64); the request was validated
        // (every block id, every tensor and the staging range large enough).
        unsafe { args.launch(cfg) }?;
        Ok(())
    }
}

/// A validated copy request with its kernel arguments already in device memory
/// ([`CudaCopy::prepare`]); launch it with [`CudaCopy::gather_prepared`] or
/// [`CudaCopy::scatter_prepared`] as often as needed. The tensors it was prepared for
/// must outlive every launch.
#[derive(Debug)]
pub struct PreparedCopy<'a> {
    params: KernelParams,
    d_base: Option<CudaSlice<u64>>,
    d_blocks: Option<CudaSlice<u32>>,
    staging_bytes: usize,
    scatter: bool,
    _tensors: PhantomData<&'a ()>,
}

/// Staging is a [`DeviceTensor`] too, so a serving engine's own buffer (a torch tensor)
/// works as well as a [`DeviceBuffer`] (`buffer.tensor()`).
impl<'a> KvCopy<DeviceTensor<'a>> for CudaCopy {
    type Staging = DeviceTensor<'a>;

    fn gather(
        &self,
        map: &ChunkMap,
        tensors: &[DeviceTensor<'a>],
        blocks: &[BlockId],
        staging: &mut DeviceTensor<'a>,
    ) -> Result<(), CopyError> {
        map.validate(
            tensors.iter().map(|t| t.bytes),
            blocks,
            staging.bytes,
            false,
        )?;
        self.launch(&self.gather_fn, map, tensors, blocks, staging.ptr)
    }

    fn scatter(
        &self,
        map: &ChunkMap,
        tensors: &mut [DeviceTensor<'a>],
        blocks: &[BlockId],
        staging: &DeviceTensor<'a>,
    ) -> Result<(), CopyError> {
        map.validate(tensors.iter().map(|t| t.bytes), blocks, staging.bytes, true)?;
        self.launch(&self.scatter_fn, map, tensors, blocks, staging.ptr)
    }
}

/// The scalar arguments of both kernels, computed on the host from a [`ChunkMap`].
#[derive(Debug)]
struct KernelParams {
    /// Device address where each layer starts (tensor address + layer offset).
    layer_base: Vec<u64>,
    num_entries: u32,
    num_layers: u32,
    planes: u32,
    chunk_bytes: u64,
    plane_stride: u64,
    block_stride: u64,
}

impl KernelParams {
    fn new(map: &ChunkMap, tensor_ptrs: &[u64], num_entries: usize) -> Result<Self, CopyError> {
        let too_big = |_| CopyError::InvalidShape("block count or layer count exceeds u32");
        Ok(Self {
            layer_base: (0..map.num_layers())
                .map(|l| {
                    let (t, off) = map.layer_base(l);
                    tensor_ptrs[t] + off as u64
                })
                .collect(),
            num_entries: u32::try_from(num_entries).map_err(too_big)?,
            num_layers: u32::try_from(map.num_layers()).map_err(too_big)?,
            planes: u32::try_from(map.planes()).map_err(too_big)?,
            chunk_bytes: map.chunk_bytes() as u64,
            plane_stride: map.plane_stride() as u64,
            block_stride: map.block_stride() as u64,
        })
    }

    /// Work items: one chunk each.
    fn items(&self) -> u64 {
        u64::from(self.num_entries) * u64::from(self.num_layers) * u64::from(self.planes)
    }

    /// The kernel's `cache_chunk`: device address of the cache chunk of work item `item`.
    #[cfg(test)]
    fn cache_chunk(&self, blocks: &[BlockId], item: u64) -> u64 {
        let planes = u64::from(self.planes);
        let (plane, rest) = (item % planes, item / planes);
        let layers = u64::from(self.num_layers);
        let (layer, entry) = (rest % layers, rest / layers);
        self.layer_base[layer as usize]
            + plane * self.plane_stride
            + u64::from(blocks[entry as usize]) * self.block_stride
    }
}

fn check_host_range(host: &PinnedBuffer, offset: usize, bytes: usize) -> Result<(), CopyError> {
    let have = host.len.saturating_sub(offset);
    if have < bytes {
        return Err(CopyError::StagingTooSmall { need: bytes, have });
    }
    Ok(())
}

/// Contiguous runs of a request: (tensor offset, staging offset, length, tensor index).
fn runs<'m>(
    map: &'m ChunkMap,
    blocks: &'m [BlockId],
) -> impl Iterator<Item = (usize, usize, usize, usize)> + 'm {
    let per_block = map.block_is_contiguous();
    blocks.iter().enumerate().flat_map(move |(entry, &block)| {
        let block = block as usize;
        let chunks = if per_block {
            1
        } else {
            map.num_layers() * map.planes()
        };
        (0..chunks).map(move |c| {
            let (layer, plane) = (c / map.planes(), c % map.planes());
            let len = if per_block {
                map.block_bytes()
            } else {
                map.chunk_bytes()
            };
            (
                map.chunk_offset(block, layer, plane),
                map.staging_offset(entry, layer, plane),
                len,
                map.layer_base(layer).0,
            )
        })
    })
}

#[cfg(test)]
mod tests;
