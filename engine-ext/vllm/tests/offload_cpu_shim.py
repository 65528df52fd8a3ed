"""Lets vLLM's own OffloadingConnector run on CPU tensors, for the benchmark only.

vLLM 0.33's ``CPUOffloadingSpec.get_worker`` refuses a CPU platform ("CPU Offloading
is currently only supported on CUDA-alike and XPU GPUs"). Everything that decides what
is offloaded, evicted (LRU/ARC) and loaded — the connector's scheduler side, the
offloading manager, the worker glue — is vLLM's; only the byte mover is replaced by
torch copies between the same KV views and a host buffer (one GPU block per chunk).
"""

from __future__ import annotations

import torch

from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class _TorchCopyWorker(OffloadingWorker):
    def __init__(self, kv_caches, blocks_per_chunk: int, num_chunks: int):
        assert blocks_per_chunk == 1, "the shim maps one GPU block per chunk"
        self.src = [t.tensor for t in kv_caches.tensors]
        self.host = [torch.empty((num_chunks, *t.shape[1:]), dtype=t.dtype) for t in self.src]
        self.done: list[TransferResult] = []

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        gpu = torch.as_tensor(src_spec.block_ids, dtype=torch.int64)
        cpu = torch.as_tensor(dst_spec.block_ids, dtype=torch.int64)
        for t, h in zip(self.src, self.host):
            h[cpu] = t[gpu]
        self.done.append(TransferResult(job_id=job_id, success=True))
        return True

    def submit_load(self, job_id, src_spec, dst_spec, expedited: bool = False) -> bool:
        cpu = torch.as_tensor(src_spec.block_ids, dtype=torch.int64)
        gpu = torch.as_tensor(dst_spec.block_ids, dtype=torch.int64)
        for t, h in zip(self.src, self.host):
            t[gpu] = h[cpu]
        self.done.append(TransferResult(job_id=job_id, success=True))
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self.done = self.done, []
        return done

    def wait(self, job_ids) -> None:
        return


class CPUTensorOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with a CPU-tensor byte mover."""

    def get_worker(self, kv_caches) -> OffloadingWorker:
        if not self._worker:
            self._worker = _TorchCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
        return self._worker
