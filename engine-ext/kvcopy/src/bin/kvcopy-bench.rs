//! KV-copy benchmarks, measured side by side in one run.
//!
//! `kvcopy-bench cpu`: CPU backend vs the naive per-element reference (GB/s, ratio).
//! `kvcopy-bench gpu`: CUDA kernels vs HBM peak, offload/restore GB/s per direction, and
//! the same transfers as one `cuMemcpyAsync` per block (per contiguous chunk) — needs a
//! CUDA driver; prints why and exits 0 without one (exit 1 if `TETHER_REQUIRE_GPU=1`).
//! Figures are medians of several runs after a warm-up.

use anyhow::{Context, Result, bail};
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use std::time::Instant;
use tether_kvcopy::naive::{fill_random, naive_gather, naive_scatter};
use tether_kvcopy::{
    BlockId, CpuCopy, CudaCopy, CudaCopyConfig, DeviceBuffer, DeviceTensor, Dtype, KvCacheSpec,
    KvCopy, KvLayout, cuda_driver_present,
};

/// HBM3e peak of an H200, the reference for device-to-device copies.
const HBM_PEAK_GBS: f64 = 4800.0;
const GB: f64 = 1e9;

fn main() -> Result<()> {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    match mode.as_str() {
        "cpu" => cpu_bench(),
        "gpu" => gpu_bench(),
        other => bail!("unknown mode {other:?}; use `cpu` or `gpu`"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn llama8b(layout: KvLayout, num_blocks: usize) -> Result<KvCacheSpec> {
    Ok(KvCacheSpec::try_new(
        layout,
        Dtype::Bf16,
        32,
        num_blocks,
        16,
    )?)
}

const FLASH: KvLayout = KvLayout::Flash {
    num_kv_heads: 8,
    head_dim: 128,
};
const CROSS: KvLayout = KvLayout::CrossLayer {
    num_kv_heads: 8,
    head_dim: 128,
};

fn cpu_bench() -> Result<()> {
    println!(
        "CPU backend vs naive per-element reference (bf16, 32 layers, 16-token blocks; median of 5)"
    );
    println!(
        "{:<34} {:>6} {:>10} {:>10} {:>7}",
        "case", "op", "CpuCopy", "naive", "ratio"
    );
    let cases: [(&str, KvCacheSpec); 3] = [
        ("flash 8x128 (Llama-8B)", llama8b(FLASH, 24)?),
        ("cross-layer 8x128", llama8b(CROSS, 24)?),
        (
            "mla 576 (DeepSeek-V3, 61 layers)",
            KvCacheSpec::try_new(KvLayout::Mla { latent_dim: 576 }, Dtype::Bf16, 61, 24, 16)?,
        ),
    ];
    for (name, spec) in cases {
        let map = spec.chunk_map();
        let mut cache: Vec<Vec<u8>> = (0..map.num_tensors())
            .map(|i| {
                let mut t = vec![0u8; map.tensor_bytes()];
                fill_random(&mut t, i as u64);
                t
            })
            .collect();
        let blocks: Vec<BlockId> = (0..16).map(|i| (i * 7 % 24) as BlockId).collect();
        let bytes = map.staging_bytes(blocks.len())? as f64;
        let mut staging = vec![0u8; bytes as usize];
        let mut reference = staging.clone();
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            f()?;
            let mut runs = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                f()?;
                runs.push(t.elapsed().as_secs_f64());
            }
            Ok(bytes / median(runs) / GB)
        };
        let g_fast =
            time(&mut || Ok(CpuCopy.gather_blocks(&spec, &cache, &blocks, &mut staging)?))?;
        let g_slow = time(&mut || {
            naive_gather(&spec, &cache, &blocks, &mut reference);
            Ok(())
        })?;
        if staging != reference {
            bail!("{name}: CpuCopy and naive gather disagree");
        }
        let s_fast =
            time(&mut || Ok(CpuCopy.scatter_blocks(&spec, &mut cache, &blocks, &staging)?))?;
        let s_slow = time(&mut || {
            naive_scatter(&spec, &mut cache, &blocks, &reference);
            Ok(())
        })?;
        println!(
            "{name:<34} {:>6} {:>7.2} GB/s {:>5.2} GB/s {:>6.1}x",
            "gather",
            g_fast,
            g_slow,
            g_fast / g_slow
        );
        println!(
            "{name:<34} {:>6} {:>7.2} GB/s {:>5.2} GB/s {:>6.1}x",
            "scatter",
            s_fast,
            s_slow,
            s_fast / s_slow
        );
    }
    Ok(())
}

/// Times `op` on the copy stream with events: median milliseconds of `reps` after a warm-up.
fn time_gpu(e: &CudaCopy, reps: usize, op: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    op()?;
    e.synchronize()?;
    let mut runs = Vec::new();
    for _ in 0..reps {
        let start = e
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = e
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(e.stream())?;
        op()?;
        end.record(e.stream())?;
        end.synchronize()?;
        runs.push(f64::from(start.elapsed_ms(&end)?));
    }
    Ok(median(runs))
}

fn gpu_bench() -> Result<()> {
    let require = std::env::var("TETHER_REQUIRE_GPU").is_ok_and(|v| v == "1");
    if !cuda_driver_present() {
        if require {
            bail!("TETHER_REQUIRE_GPU=1 but no CUDA driver library found");
        }
        println!("gpu benchmark skipped: no CUDA driver library (libcuda.so) on this machine");
        return Ok(());
    }
    let mut e = CudaCopy::new(CudaCopyConfig::default()).context("starting the CUDA backend")?;
    let sms = e
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
        as u32;
    println!("device: {} ({sms} SMs)", e.context().name()?);
    let mut summary = Vec::new();

    // Device-to-device gather/scatter bandwidth against HBM peak (bytes read + written).
    println!(
        "\n== gather/scatter in HBM: 1024 of 2048 blocks, bf16 Llama-8B shape (2 MiB/block) =="
    );
    for (lname, layout) in [("flash", FLASH), ("cross-layer", CROSS)] {
        let spec = llama8b(layout, 2048)?;
        let map = spec.chunk_map();
        let cache: Vec<DeviceBuffer> = (0..map.num_tensors())
            .map(|_| e.alloc(map.tensor_bytes()))
            .collect::<Result<_, _>>()?;
        // 1024 distinct blocks scattered over the cache (an odd multiplier permutes 0..2048).
        let blocks: Vec<BlockId> = (0..1024u32).map(|i| i * 1031 % 2048).collect();
        let bytes = map.staging_bytes(blocks.len())?;
        let staging_buf = e.alloc(bytes)?;
        let mut staging = staging_buf.tensor();
        // Validation and the upload of the kernel arguments happen once, outside the
        // timed region: the events bracket nothing but the kernel launches.
        let t: Vec<DeviceTensor<'_>> = cache.iter().map(DeviceBuffer::tensor).collect();
        let gather = e.prepare(&map, &t, &blocks, bytes, false)?;
        let scatter = e.prepare(&map, &t, &blocks, bytes, true)?;
        for ctas in [64, 4 * sms, 16 * sms] {
            e.set_max_ctas(ctas)?;
            let g = time_gpu(&e, 5, &mut || Ok(e.gather_prepared(&gather, &mut staging)?))?;
            let s = time_gpu(&e, 5, &mut || Ok(e.scatter_prepared(&scatter, &staging)?))?;
            let (gb, sb) = (
                2.0 * bytes as f64 / (g / 1e3) / GB,
                2.0 * bytes as f64 / (s / 1e3) / GB,
            );
            println!(
                "{lname:<12} max_ctas={ctas:<5} gather {gb:>7.0} GB/s ({:>4.1}% of HBM peak)  scatter {sb:>7.0} GB/s ({:>4.1}%)",
                100.0 * gb / HBM_PEAK_GBS,
                100.0 * sb / HBM_PEAK_GBS
            );
            if ctas == 16 * sms {
                summary.push(format!(
                    "{lname} gather {:.1}% / scatter {:.1}% of HBM peak (target >= 80%)",
                    100.0 * gb / HBM_PEAK_GBS,
                    100.0 * sb / HBM_PEAK_GBS
                ));
            }
        }
    }

    // Offload and restore over PCIe: the kernel paths vs one cuMemcpyAsync per block.
    println!("\n== offload (D2H) / restore (H2D): 256 blocks = 512 MiB, bf16 Llama-8B shape ==");
    e.set_max_ctas(64)?;
    for (lname, layout) in [("flash", FLASH), ("cross-layer", CROSS)] {
        let spec = llama8b(layout, 1024)?;
        let map = spec.chunk_map();
        let cache: Vec<DeviceBuffer> = (0..map.num_tensors())
            .map(|_| e.alloc(map.tensor_bytes()))
            .collect::<Result<_, _>>()?;
        let t: Vec<DeviceTensor<'_>> = cache.iter().map(DeviceBuffer::tensor).collect();
        let mut tm = t.clone();
        let blocks: Vec<BlockId> = (0..256).map(|i| (i * 4 + 1) as BlockId).collect();
        let bytes = map.staging_bytes(blocks.len())?;
        let gbs = |ms: f64| bytes as f64 / (ms / 1e3) / GB;
        let staging_buf = e.alloc(bytes)?;
        let mut staging = staging_buf.tensor();
        let mut host = e.alloc_pinned(bytes)?;
        let off_k = time_gpu(&e, 5, &mut || {
            Ok(e.offload(&map, &t, &blocks, &mut staging, &mut host, 0)?)
        })?;
        let off_z = time_gpu(&e, 5, &mut || {
            Ok(e.gather_to_host(&map, &t, &blocks, &mut host)?)
        })?;
        let off_m = time_gpu(&e, 5, &mut || {
            Ok(e.offload_per_block(&map, &t, &blocks, &mut host)?)
        })?;
        let res_k = time_gpu(&e, 5, &mut || {
            Ok(e.restore(&map, &mut tm, &blocks, &mut staging, &mut host, 0)?)
        })?;
        let res_z = time_gpu(&e, 5, &mut || {
            Ok(e.scatter_from_host(&map, &mut tm, &blocks, &mut host)?)
        })?;
        let res_m = time_gpu(&e, 5, &mut || {
            Ok(e.restore_per_block(&map, &mut tm, &blocks, &mut host)?)
        })?;
        let runs = if map.block_is_contiguous() {
            blocks.len()
        } else {
            blocks.len() * map.num_layers() * map.planes()
        };
        println!(
            "{lname:<12} ({runs} memcpys of {} KiB in the per-block path)",
            bytes / runs / 1024
        );
        println!(
            "{:<12} offload: kernel+DMA {:>6.1} GB/s  zero-copy kernel {:>6.1} GB/s  per-block memcpy {:>6.1} GB/s",
            "",
            gbs(off_k),
            gbs(off_z),
            gbs(off_m)
        );
        println!(
            "{:<12} restore: DMA+kernel {:>6.1} GB/s  zero-copy kernel {:>6.1} GB/s  per-block memcpy {:>6.1} GB/s",
            "",
            gbs(res_k),
            gbs(res_z),
            gbs(res_m)
        );
        let best_off = gbs(off_k).max(gbs(off_z));
        let best_res = gbs(res_k).max(gbs(res_z));
        summary.push(format!(
            "{lname} offload {best_off:.1} GB/s, restore {best_res:.1} GB/s (target >= 45); vs per-block memcpy {:.2}x / {:.2}x (target >= 3x at 16-token blocks)",
            best_off / gbs(off_m),
            best_res / gbs(res_m)
        ));
    }
    println!("\n== summary ==");
    for line in summary {
        println!("{line}");
    }
    Ok(())
}
