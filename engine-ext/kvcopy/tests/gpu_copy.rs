//! GPU integration tests: the CUDA backend equals the CPU backend bit for bit on random
//! data, for every layout, element type and transfer path.
//!
//! Ignored by default (CI has no GPU). Run on a machine with a CUDA driver:
//! `cargo test -p tether-kvcopy --test gpu_copy -- --ignored --test-threads=1`
//! Without a driver or device each test prints why and passes, unless
//! `TETHER_REQUIRE_GPU=1` (set by scripts/gpu-check.sh), which turns a skip into a failure.

use anyhow::{Context, Result, bail};
use tether_kvcopy::naive::fill_random;
use tether_kvcopy::{
    BlockId, ChunkMap, CopyError, CpuCopy, CudaCopy, CudaCopyConfig, DeviceBuffer, DeviceTensor,
    Dtype, KvCacheSpec, KvCopy, KvLayout, PageOrder, PagedView, StateSpec, cuda_driver_present,
};

/// The backend, or `None` after printing why the test is skipped.
fn engine(max_ctas: u32) -> Result<Option<CudaCopy>> {
    let require = std::env::var("TETHER_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let reason = if !cuda_driver_present() {
        "no CUDA driver library (libcuda.so) on this machine".to_string()
    } else {
        match CudaCopy::new(CudaCopyConfig {
            max_ctas,
            ..Default::default()
        }) {
            Ok(e) => return Ok(Some(e)),
            Err(CopyError::CudaUnavailable(why)) => why,
            Err(e) => return Err(e).context("CUDA backend failed to start"),
        }
    };
    if require {
        bail!("TETHER_REQUIRE_GPU=1 but {reason}");
    }
    eprintln!("skipped: {reason}");
    Ok(None)
}

struct Case {
    spec: KvCacheSpec,
    blocks: Vec<BlockId>,
    host: Vec<Vec<u8>>,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut seed = 1u64;
    // (heads, head_dim, latent, layers, num_blocks, block_size): 16-byte aligned chunks,
    // odd sizes that take the byte path, and a DeepSeek-like MLA latent of 576.
    let shapes = [
        (8, 128, 576, 4, 24, 16),
        (2, 64, 576, 3, 17, 1),
        (3, 5, 7, 2, 9, 3),
        (1, 8, 512, 5, 40, 32),
    ];
    for (heads, head_dim, latent, layers, num_blocks, block_size) in shapes {
        for layout in [
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
            // vLLM 0.33's per-layer views (head_dim plays head_size: 2 * head_dim per token).
            KvLayout::Paged(PagedView::dense(
                heads,
                head_dim,
                block_size,
                PageOrder::Nhd,
            )),
            KvLayout::Paged(PagedView::dense(
                heads,
                head_dim,
                block_size,
                PageOrder::Hnd,
            )),
        ] {
            for dtype in [Dtype::F16, Dtype::Bf16, Dtype::Fp8] {
                let spec = KvCacheSpec::try_new(layout, dtype, layers, num_blocks, block_size)
                    .expect("valid shape");
                let map = spec.chunk_map();
                let host = (0..map.num_tensors())
                    .map(|_| {
                        let mut t = vec![0u8; map.tensor_bytes()];
                        seed += 1;
                        fill_random(&mut t, seed);
                        t
                    })
                    .collect();
                // A shuffled subset in a non-sorted order, deterministic from the seed.
                let mut ids: Vec<BlockId> = (0..num_blocks as BlockId).collect();
                let mut key = vec![0u8; ids.len() * 8];
                fill_random(&mut key, seed ^ 0xB10C);
                let mut keyed: Vec<_> = ids
                    .drain(..)
                    .zip(key.chunks(8).map(|c| c[0] as u32 * 256 + c[1] as u32))
                    .collect();
                keyed.sort_by_key(|&(_, k)| k);
                let blocks = keyed
                    .into_iter()
                    .map(|(b, _)| b)
                    .take(num_blocks / 2 + 1)
                    .collect();
                out.push(Case { spec, blocks, host });
            }
        }
    }
    out
}

fn upload_all(e: &CudaCopy, host: &[Vec<u8>]) -> Result<Vec<DeviceBuffer>> {
    host.iter()
        .map(|t| e.upload(t).map_err(Into::into))
        .collect()
}

fn tensors(bufs: &[DeviceBuffer]) -> Vec<DeviceTensor<'_>> {
    bufs.iter().map(DeviceBuffer::tensor).collect()
}

fn cpu_gather(map: &ChunkMap, host: &[Vec<u8>], blocks: &[BlockId]) -> Result<Vec<u8>> {
    let mut s = vec![0u8; map.staging_bytes(blocks.len())?];
    CpuCopy.gather(map, host, blocks, &mut s)?;
    Ok(s)
}

fn cpu_scatter_into_zero(
    map: &ChunkMap,
    blocks: &[BlockId],
    staging: &[u8],
) -> Result<Vec<Vec<u8>>> {
    let mut t = vec![vec![0u8; map.tensor_bytes()]; map.num_tensors()];
    CpuCopy.scatter(map, &mut t, blocks, staging)?;
    Ok(t)
}

fn download_all(e: &CudaCopy, bufs: &[DeviceBuffer]) -> Result<Vec<Vec<u8>>> {
    bufs.iter()
        .map(|b| e.download(b).map_err(Into::into))
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU; see the module docs for the command"]
fn kernels_match_cpu_for_every_layout_and_type() -> Result<()> {
    for max_ctas in [1, 7, 1024] {
        let Some(e) = engine(max_ctas)? else {
            return Ok(());
        };
        for case in cases() {
            let map = case.spec.chunk_map();
            let what = format!("{:?} ctas={max_ctas}", case.spec);
            let dev = upload_all(&e, &case.host)?;
            let expected = cpu_gather(&map, &case.host, &case.blocks)?;
            let staging = e.alloc(expected.len())?;
            e.gather_blocks(
                &case.spec,
                &tensors(&dev),
                &case.blocks,
                &mut staging.tensor(),
            )?;
            assert!(e.download(&staging)? == expected, "gather differs: {what}");

            let zeros = vec![vec![0u8; map.tensor_bytes()]; map.num_tensors()];
            let dst = upload_all(&e, &zeros)?;
            e.scatter_blocks(
                &case.spec,
                &mut tensors(&dst),
                &case.blocks,
                &staging.tensor(),
            )?;
            let expected_cache = cpu_scatter_into_zero(&map, &case.blocks, &expected)?;
            assert!(
                download_all(&e, &dst)? == expected_cache,
                "scatter differs: {what}"
            );
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU; see the module docs for the command"]
fn host_transfer_paths_match_cpu() -> Result<()> {
    let Some(e) = engine(64)? else { return Ok(()) };
    for case in cases() {
        let map = case.spec.chunk_map();
        let what = format!("{:?}", case.spec);
        let dev = upload_all(&e, &case.host)?;
        let expected = cpu_gather(&map, &case.host, &case.blocks)?;
        let expected_cache = cpu_scatter_into_zero(&map, &case.blocks, &expected)?;
        let offset = 48; // a non-zero offset into the host buffer is honoured
        let mut host = e.alloc_pinned(expected.len() + offset)?;
        let staging = e.alloc(expected.len())?;

        // Offload: kernel gather + one DMA; restore: one DMA + kernel scatter.
        e.offload(
            &map,
            &tensors(&dev),
            &case.blocks,
            &mut staging.tensor(),
            &mut host,
            offset,
        )?;
        assert!(
            host.as_slice()?[offset..] == expected[..],
            "offload differs: {what}"
        );
        let dst = upload_all(&e, &vec![vec![0u8; map.tensor_bytes()]; map.num_tensors()])?;
        let staging2 = e.alloc(expected.len())?;
        e.restore(
            &map,
            &mut tensors(&dst),
            &case.blocks,
            &mut staging2.tensor(),
            &mut host,
            offset,
        )?;
        assert!(
            download_all(&e, &dst)? == expected_cache,
            "restore differs: {what}"
        );

        // Zero-copy kernels on mapped pinned memory.
        let mut direct = e.alloc_pinned(expected.len())?;
        e.gather_to_host(&map, &tensors(&dev), &case.blocks, &mut direct)?;
        assert!(
            direct.as_slice()? == &expected[..],
            "gather_to_host differs: {what}"
        );
        let dst = upload_all(&e, &vec![vec![0u8; map.tensor_bytes()]; map.num_tensors()])?;
        e.scatter_from_host(&map, &mut tensors(&dst), &case.blocks, &mut direct)?;
        assert!(
            download_all(&e, &dst)? == expected_cache,
            "scatter_from_host differs: {what}"
        );

        // The per-block cuMemcpyAsync baseline moves the same bytes.
        let mut per_block = e.alloc_pinned(expected.len())?;
        e.offload_per_block(&map, &tensors(&dev), &case.blocks, &mut per_block)?;
        assert!(
            per_block.as_slice()? == &expected[..],
            "offload_per_block differs: {what}"
        );
        let dst = upload_all(&e, &vec![vec![0u8; map.tensor_bytes()]; map.num_tensors()])?;
        e.restore_per_block(&map, &mut tensors(&dst), &case.blocks, &mut per_block)?;
        assert!(
            download_all(&e, &dst)? == expected_cache,
            "restore_per_block differs: {what}"
        );
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU; see the module docs for the command"]
fn state_snapshots_match_cpu() -> Result<()> {
    let Some(e) = engine(64)? else { return Ok(()) };
    for (layers, slots, slab) in [(4, 8, 4096 + 16), (3, 5, 77), (48, 2, 1 << 16)] {
        let spec = StateSpec::try_new(layers, slots, slab)?;
        let map = spec.chunk_map();
        let host: Vec<Vec<u8>> = (0..layers)
            .map(|l| {
                let mut t = vec![0u8; map.tensor_bytes()];
                fill_random(&mut t, 99 + l as u64);
                t
            })
            .collect();
        let slots_req: Vec<BlockId> = vec![(slots - 1) as BlockId, 0];
        let mut expected = vec![0u8; map.staging_bytes(2)?];
        CpuCopy.snapshot_state(&spec, &host, &slots_req, &mut expected)?;
        let dev = upload_all(&e, &host)?;
        let staging = e.alloc(expected.len())?;
        e.snapshot_state(&spec, &tensors(&dev), &slots_req, &mut staging.tensor())?;
        assert!(
            e.download(&staging)? == expected,
            "snapshot differs: {spec:?}"
        );
        let dst = upload_all(&e, &vec![vec![0u8; map.tensor_bytes()]; layers])?;
        e.restore_state(&spec, &mut tensors(&dst), &slots_req, &staging.tensor())?;
        assert!(
            download_all(&e, &dst)? == cpu_scatter_into_zero(&map, &slots_req, &expected)?,
            "restore differs: {spec:?}"
        );
    }
    Ok(())
}

/// A copy ordered after the compute stream sees what the compute stream wrote.
#[test]
#[ignore = "needs a CUDA GPU; see the module docs for the command"]
fn copies_wait_for_the_compute_stream() -> Result<()> {
    let Some(e) = engine(64)? else { return Ok(()) };
    let spec = KvCacheSpec::try_new(
        KvLayout::CrossLayer {
            num_kv_heads: 8,
            head_dim: 128,
        },
        Dtype::Bf16,
        32,
        64,
        16,
    )?;
    let map = spec.chunk_map();
    let cache = e.alloc(map.tensor_bytes())?;
    e.synchronize()?;
    let mut fresh = vec![0u8; map.tensor_bytes()];
    fill_random(&mut fresh, 4242);
    let compute = e.context().new_stream()?;
    let fresh_dev = compute.clone_htod(&fresh)?; // large enough that it is still in flight
    let (src_ptr, _guard) = cudarc::driver::DevicePtr::device_ptr(&fresh_dev, &compute);
    // SAFETY: both ranges are live device allocations of `tensor_bytes`; the copy is queued
    // on `compute`, the stream both buffers are ordered by in this test.
    unsafe {
        cudarc::driver::sys::cuMemcpyDtoDAsync_v2(
            cache.tensor().ptr(),
            src_ptr,
            map.tensor_bytes(),
            compute.cu_stream(),
        )
    }
    .result()?;
    e.wait_for(&compute)?;
    let blocks: Vec<BlockId> = (0..64).rev().collect();
    let staging = e.alloc(map.staging_bytes(blocks.len())?)?;
    e.gather_blocks(&spec, &[cache.tensor()], &blocks, &mut staging.tensor())?;
    let expected = cpu_gather(&map, &[fresh], &blocks)?;
    assert!(
        e.download(&staging)? == expected,
        "gather ran before the compute stream's write"
    );
    Ok(())
}
