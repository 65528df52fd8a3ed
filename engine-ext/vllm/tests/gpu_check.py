"""The connector on a GPU: vLLM's scheduler with KV views in device memory, moved by
tether's CUDA backend. Run by scripts/vllm-gpu-check.sh on the accelerator machine.

1. Bit-exact: the eviction/return scenario and the free/save race of the CPU suite,
   with the KV cache on CUDA (NHD and HND views), every attended position checked.
2. Hybrid: an attention + linear-state model (vLLM's hybrid allocator, align mode) with
   KV and state in device memory: a retained turn survives a flood and resumes at its
   last snapshot boundary; evicted to the host tier, it is restored (KV blocks and the
   state page, by the CUDA backend); every KV position and state element checked.
3. Copy rate: save (gather kernel + D2H + xxh3 per block) and load (verify + H2D +
   scatter kernel) of 512 blocks of a Llama-8B-shaped cache (32 layers, 8 KV heads of
   128, bf16, 16-token blocks = 2 MiB per block, 1 GiB per call), end to end as the
   connector sees it, and the restored blocks compared with the originals.

TETHER_REQUIRE_GPU=1 turns "no GPU" into a failure (exit 1); without it the script runs
the bit-exact part on CPU and says so (what the build machine checks).
"""

from __future__ import annotations

import os
import sys
import time

import torch

import harness
from harness import Engine
from tether_vllm import KvCopier, cuda_available

BS = 16
REQUIRE = os.environ.get("TETHER_REQUIRE_GPU") == "1"


def tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 997 + 1 for i in range(n)]


def tether(session: str) -> dict:
    return {"tether": {"session": session, "prompt_end": "1", "turn_kind": "user"}}


def eviction_and_return(device: str, layout: str) -> str:
    e = Engine(
        extra={"host_bytes": 1 << 22, "max_device_fraction": 0.25},
        num_blocks=24,
        layout=layout,
        device=device,
    )
    first = tokens(1, 5 * BS + 3)
    out = e.serve("a1", first, tether("a1"), max_tokens=2)
    for i in range(3):
        e.serve(f"f{i}", tokens(100 + i, 20 * BS))
    e.serve("a2", first + out + tokens(2, 20), tether("a1"))
    loaded = e.worker.stats["loaded_blocks"]
    if loaded < 5 or e.mismatched_positions:
        raise SystemExit(
            f"FAIL {device} {layout}: restored {loaded} blocks, "
            f"{e.mismatched_positions} wrong positions"
        )
    return f"{device} {layout}: restored {loaded} blocks after eviction, 0 wrong positions"


def race(device: str) -> str:
    e = Engine(
        extra={"host_bytes": 1 << 22, "max_device_fraction": 1.0, "free_watermark": 0.0},
        num_blocks=24,
        device=device,
    )
    a = tokens(11, 5 * BS + 4)
    e.add("a1", a, tether("b2"), max_tokens=1)
    while "a1" not in e.finished:
        e.step()
    e.add("b1", tokens(12, 22 * BS - 1))
    e.run()
    e.serve("a2", a + e.finished["a1"] + tokens(13, 8), tether("b2"))
    if e.mismatched_positions or e.worker.stats["loaded_blocks"] < 3:
        raise SystemExit(f"FAIL {device} race: {e.mismatched_positions} wrong positions")
    return f"{device} free/save race: restored {e.worker.stats['loaded_blocks']} blocks, 0 wrong positions"


def hybrid(device: str, host: bool) -> str:
    """A hybrid turn after a flood: kept on the device (floods that fit beside it), or
    yielded to the host tier and restored (5 KV blocks + 1 state page)."""
    extra = {"host_bytes": 1 << 22, "max_device_fraction": 0.25} if host else {"host_bytes": 0}
    e = Engine(extra=extra, num_blocks=40, hybrid=True, device=device)
    first = tokens(21, 5 * BS + 3)
    out = e.serve("h1", first, tether("c3"), max_tokens=2)
    for i in range(3):
        e.serve(f"hf{i}", tokens(200 + i, (33 if host else 28) * BS))
    before = e.stats.cached_tokens
    e.serve("h2", first + out + tokens(22, 20), tether("c3"))
    resumed = e.stats.cached_tokens - before
    loaded = e.worker.stats["loaded_blocks"]
    tier = "host" if host else "device"
    wrong = e.mismatched_positions + e.mismatched_states
    if resumed != 5 * BS or loaded != (6 if host else 0) or wrong:
        raise SystemExit(
            f"FAIL {device} hybrid {tier}: resumed at {resumed} (want {5 * BS}), restored "
            f"{loaded} blocks, {e.mismatched_positions} wrong positions, "
            f"{e.mismatched_states} wrong states"
        )
    return (
        f"{device} hybrid {tier}: resumed at the {resumed}-token snapshot, restored {loaded} "
        "blocks, 0 wrong positions, 0 wrong states"
    )


def copy_rate() -> list[str]:
    layers, heads, head, blocks = 32, 8, 128, 2048
    views = [
        torch.randint(-100, 100, (blocks, BS, heads, 2 * head), device="cuda")
        .to(torch.bfloat16)
        .permute(0, 2, 1, 3)  # logical [B, H, N, C], physically NHD like vLLM's LBNHC
        for _ in range(layers)
    ]
    v = views[0]
    es = v.element_size()
    copier = KvCopier(
        [t.data_ptr() for t in views],
        [t.untyped_storage().nbytes() - t.storage_offset() * es for t in views],
        blocks,
        BS,
        heads,
        head,
        (v.stride(0), v.stride(1), v.stride(2)),
        es,
        device="cuda",
    )
    n = 512
    src = list(range(1, 2 * n, 2))  # odd blocks
    dst = list(range(2, 2 * n + 1, 2))  # even blocks
    hashes = [i.to_bytes(32, "little") for i in range(n)]
    torch.cuda.synchronize()
    out = []
    for rep in range(3):
        copier.free(hashes)
        t0 = time.perf_counter()
        moved = copier.save(src, hashes)
        t1 = time.perf_counter()
        good = copier.load(dst, hashes)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if good != n:
            raise SystemExit(f"FAIL copy rate: loaded {good} of {n}")
        gb = moved / 1e9
        out.append((gb / (t1 - t0), gb / (t2 - t1)))
    for t in views:
        if not torch.equal(t[src], t[dst]):
            raise SystemExit("FAIL copy rate: restored blocks differ from the originals")
    save = sorted(x[0] for x in out)[1]
    load = sorted(x[1] for x in out)[1]
    return [
        f"cuda copy: {n} blocks x {copier.block_bytes >> 20} MiB = {n * copier.block_bytes / 1e9:.2f} GB per call, "
        f"save {save:.1f} GB/s, load {load:.1f} GB/s (median of 3, end to end incl. xxh3 and pageable host copies); "
        "restored blocks bit-exact"
    ]


def main() -> int:
    have_gpu = torch.cuda.is_available() and cuda_available()
    if not have_gpu:
        msg = f"no GPU (torch.cuda.is_available()={torch.cuda.is_available()}, CUDA driver loads: {cuda_available()})"
        if REQUIRE:
            print(f"FAIL: TETHER_REQUIRE_GPU=1 but {msg}")
            return 1
        print(f"{msg}: running the bit-exact part on CPU only")
    device = "cuda" if have_gpu else "cpu"
    lines = [f"vllm {harness.__name__}: torch {torch.__version__}"]
    if have_gpu:
        lines.append(f"device: {torch.cuda.get_device_name()}")
    for layout in ("LBNHC", "LBHNC"):
        lines.append(eviction_and_return(device, layout))
    lines.append(race(device))
    lines.append(hybrid(device, host=False))
    lines.append(hybrid(device, host=True))
    if have_gpu:
        lines += copy_rate()
    for line in lines:
        print(line)
    print("gpu_check: all checks passed" + ("" if have_gpu else " (CPU only)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
