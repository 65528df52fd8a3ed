"""A vLLM 0.33 engine on CPU with a deterministic fake forward, for tests and the benchmark.

Everything but the model is vLLM's own: the real ``Scheduler`` (prefix caching, block
pool, connector hooks), the connector built by vLLM's ``KVConnectorFactory`` from a
``KVTransferConfig``, KV cache views from vLLM's ``allocate_kv_cache`` for the chosen
``KVCacheLayout``, and the worker glue ``KVConnectorModelRunnerMixin`` around each
forward. The connector metadata is pickled between the two sides every step, as
between vLLM's scheduler and worker processes.

The fake forward writes, for every scheduled token position p, KV values that are a
fixed function of the token prefix ``tokens[0..=p]`` (a rolling hash), so a block's KV
is the same whichever request computed it — what makes prefix caching valid. Before
writing, it checks every position the model would attend to (``0..num_computed``)
against that function: a wrong cache hit, a corrupted or misplaced restore, or a block
overwritten while another request still used it is counted in ``mismatched_positions``.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.worker.kv_connector_model_runner_mixin import (  # noqa: E402
    KVConnectorModelRunnerMixin,
)
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

LAYERS = 2
KV_HEADS = 2
HEAD_SIZE = 16
VOCAB = 1000
MOD = (1 << 31) - 1
# The hybrid model: LAYERS attention layers (group 0) and as many linear-attention
# layers (group 1) whose per-block state is a short conv state (bf16) and a recurrent
# state (fp32), as in a Gated DeltaNet layer; each pair shares one page of memory.
STATE_SHAPES = ((3, 8), (2, 8, 8))
STATE_DTYPES = (torch.bfloat16, torch.float32)

_none_hash = False


def tiny_model_dir() -> str:
    """A hand-written Llama-shaped config.json (no weights, no tokenizer, no hub)."""
    d = tempfile.mkdtemp(prefix="tether-tiny-llama-")
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": KV_HEADS * 2 * HEAD_SIZE,
        "intermediate_size": 128,
        "num_attention_heads": KV_HEADS * 2,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_SIZE,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


_MODEL_DIR: str | None = None


def _model_dir() -> str:
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = tiny_model_dir()
    return _MODEL_DIR


def prefix_hashes(tokens: list[int]) -> list[int]:
    """Rolling hash of every prefix: position p's KV is a function of tokens[0..=p]."""
    out, h = [], 1469598103
    for t in tokens:
        h = (h * 1000003 + t + 1) % MOD
        out.append(h)
    return out


def expected_kv(hashes: list[int], dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
    """[positions, layers, heads, 2*head_size] KV values (small integers, exact in bf16)."""
    hp = torch.tensor(hashes, dtype=torch.int64, device=device)
    idx = torch.arange(LAYERS * KV_HEADS * 2 * HEAD_SIZE, dtype=torch.int64, device=device)
    idx = idx.view(LAYERS, KV_HEADS, 2 * HEAD_SIZE)
    v = (hp.view(-1, 1, 1, 1) * 7919 + idx.view(1, *idx.shape) * 104729) % 251
    return (v - 125).to(dtype)


def expected_state(prefix_hash: int, device="cpu") -> torch.Tensor:
    """[layers, state_bytes] linear state after the prefix whose rolling hash is given."""
    size = sum(
        torch.Size(shape).numel() * dtype.itemsize
        for shape, dtype in zip(STATE_SHAPES, STATE_DTYPES)
    )
    idx = torch.arange(LAYERS * size, dtype=torch.int64, device=device).view(LAYERS, size)
    return ((prefix_hash * 6151 + idx * 49157) % 253 - 126).to(torch.int8)


@dataclass
class StepStats:
    computed_tokens: int = 0  # prompt tokens the fake model computed (prefill work)
    cached_tokens: int = 0  # prompt tokens served from the cache at admission
    steps: int = 0


@dataclass
class Engine:
    """One rank: vLLM's scheduler + a worker with real KV views + a fake model."""

    connector: str | None = "TetherConnector"
    extra: dict[str, Any] | None = None
    num_blocks: int = 64
    block_size: int = 16
    layout: str = "LBNHC"
    hybrid: bool = False
    max_batched_tokens: int = 4096
    device: str = "cpu"
    pickle_metadata: bool = True
    check_every_step: bool = True
    module_path: str = "tether_vllm.connector"
    # The model name vLLM serves (a state pull's fingerprint includes it; the model
    # directory differs between processes). None: vLLM's default, the directory.
    served_model_name: str | None = None
    now_ms: int = 0
    stats: StepStats = field(default_factory=StepStats)
    mismatched_positions: int = 0
    # Hybrid: an admitted request resumed where no snapshot of its prefix was (a hit
    # not on a block boundary, a null state block, or a state that is not its prefix's).
    mismatched_states: int = 0
    finished: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    restored_blocks: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self):
        global _none_hash
        if not _none_hash:
            init_none_hash(sha256)
            _none_hash = True
        model_config = ModelConfig(
            model=_model_dir(),
            dtype="bfloat16",
            seed=0,
            skip_tokenizer_init=True,
            max_model_len=65536,
            **({"served_model_name": self.served_model_name} if self.served_model_name else {}),
        )
        scheduler_config = SchedulerConfig(
            max_num_seqs=64,
            max_num_batched_tokens=self.max_batched_tokens,
            max_model_len=65536,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        )
        cache_config = CacheConfig(
            block_size=self.block_size,
            gpu_memory_utilization=0.9,
            enable_prefix_caching=True,
        )
        cache_config.kv_cache_layout = self.layout
        if self.hybrid:
            # What MambaModelConfig.verify_and_update_config sets with prefix caching.
            cache_config.mamba_cache_mode = "align"
            cache_config.mamba_block_size = self.block_size
        cache_config.num_gpu_blocks = self.num_blocks
        kv_transfer = None
        if self.connector is not None:
            kv_transfer = KVTransferConfig(
                kv_connector=self.connector,
                kv_connector_module_path=self.module_path,
                kv_role="kv_both",
                kv_connector_extra_config=self.extra or {},
                kv_load_failure_policy="recompute",
            )
        self.vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            kv_transfer_config=kv_transfer,
            device_config=DeviceConfig("cpu"),
        )
        spec = FullAttentionSpec(
            block_size=self.block_size,
            num_kv_heads=KV_HEADS,
            head_size=HEAD_SIZE,
            dtype=torch.bfloat16,
        )
        page = spec.page_size_bytes
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        lay = KVCacheLayout[self.layout]
        order = lay.stride_order
        if lay.is_block_outermost:
            layer_stride, block_stride = page, page * LAYERS
        elif order.index(2) < order.index(1):
            # Heads outside blocks (LHBNC): a block of one head is one N x C run.
            layer_stride, block_stride = page * self.num_blocks, page // KV_HEADS
        else:
            layer_stride, block_stride = page * self.num_blocks, page
        tensors = [
            KVCacheTensor(
                size=page * self.num_blocks * LAYERS,
                layers=names,
                layer_stride=layer_stride,
                block_stride=block_stride,
            )
        ]
        groups = [KVCacheGroupSpec(names, spec)]
        self.state_names: list[str] = []
        if self.hybrid:
            # vLLM's hybrid allocator: a state page is padded to the attention page and
            # overlays the same memory (a block id belongs to one group at a time).
            state_spec = MambaSpec(
                block_size=self.block_size,
                shapes=STATE_SHAPES,
                dtypes=STATE_DTYPES,
                page_size_padded=page,
                mamba_cache_mode="align",
            )
            self.state_names = [f"model.layers.{i}.linear_attn" for i in range(LAYERS)]
            tensors.append(replace(tensors[0], layers=self.state_names))
            groups.append(KVCacheGroupSpec(self.state_names, state_spec))
        self.kv_cache_config = KVCacheConfig(
            num_blocks=self.num_blocks,
            kv_cache_tensors=tensors,
            kv_cache_groups=groups,
        )
        self.scheduler = Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config,
            log_stats=False,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=self.block_size,
        )
        self.kv = allocate_kv_cache(
            self.kv_cache_config,
            torch.device(self.device),
            lay,
            kernel_block_sizes=[self.block_size],
        )
        self.layers = [self.kv[n] for n in names]
        # [num_blocks, 1, 1, state_bytes] int8 views of each linear layer's state.
        self.state_layers = [self.kv[n] for n in self.state_names]
        self.worker = None
        if self.connector is not None:
            self.worker = KVConnectorFactory.create_connector(
                config=self.vllm_config,
                role=KVConnectorRole.WORKER,
                kv_cache_config=self.kv_cache_config,
            )
            self.worker.register_kv_caches(self.kv)
            self.scheduler.connector._now_ms = lambda: self.now_ms
        self._hashes: dict[str, list[int]] = {}
        self._step_mismatch: dict[str, int] = {}

    @property
    def sched_connector(self):
        return self.scheduler.connector

    def add(
        self,
        req_id: str,
        tokens: list[int],
        params: Any = None,
        session_id: str | None = None,
        max_tokens: int = 1,
    ) -> Request:
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        req = Request(
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=sp,
            pooling_params=None,
            block_hasher=get_request_block_hasher(self.block_size, sha256),
            session_id=session_id,
        )
        req.kv_transfer_params = params
        self.scheduler.add_request(req)
        return req

    def step(self) -> None:
        out = self.scheduler.schedule()
        if self.pickle_metadata and out.kv_connector_metadata is not None:
            out = replace(
                out, kv_connector_metadata=pickle.loads(pickle.dumps(out.kv_connector_metadata))
            )
        for new in out.scheduled_new_reqs:
            self.stats.cached_tokens += new.num_computed_tokens
        meta = out.kv_connector_metadata
        for rid, group, ids, _ in getattr(meta, "loads", ()):
            if group == 0:
                self.restored_blocks[rid] = list(ids)
        kvo = None
        # The worker connector must be the process-wide one vLLM's glue looks up.
        kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
        try:
            if self.worker is not None:
                with (
                    set_forward_context(None, self.vllm_config),
                    KVConnectorModelRunnerMixin._get_kv_connector_output(out) as kvo,
                ):
                    sampled = self._forward(out)
            else:
                sampled = self._forward(out)
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = None
        # vLLM discards a step's result for a request whose loaded blocks failed
        # (kv_load_failure_policy=recompute) and recomputes them: what the model read
        # there was never served. Count mismatches of every other request.
        invalid = set(kvo.invalid_block_ids) if kvo is not None else set()
        for rid, bad in self._step_mismatch.items():
            blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0] if rid in self.scheduler.requests else []
            if bad and not invalid.intersection(blocks):
                self.mismatched_positions += bad
        self._step_mismatch = {}
        req_ids = list(sampled)
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[sampled[r] for r in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
            kv_connector_output=kvo,
        )
        outputs = self.scheduler.update_from_output(out, mro)
        for rid in out.finished_req_ids:
            self._hashes.pop(rid, None)
        for eco in outputs.values():
            for o in eco.outputs:
                self.outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished[o.request_id] = self.outputs.pop(o.request_id)
        self.stats.steps += 1

    def _forward(self, out) -> dict[str, list[int]]:
        sampled: dict[str, list[int]] = {}
        # Where each scheduled request starts this step (the scheduler has already
        # advanced its own counters).
        starts = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
        new_ids = set(starts)
        cached = out.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        for rid, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            tokens = req.all_token_ids
            start = starts[rid]
            hashes = self._hashes.get(rid)
            if hashes is None:
                hashes = self._hashes[rid] = prefix_hashes(tokens)
            elif len(hashes) < len(tokens):
                h = hashes[-1]
                for t in tokens[len(hashes) :]:
                    h = (h * 1000003 + t + 1) % MOD
                    hashes.append(h)
            blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
            # The model attends to every earlier position: they must hold their KV
            # (checked at every step, or only when the request is admitted).
            if start > 0 and (self.check_every_step or rid in new_ids):
                self._step_mismatch[rid] = self._check(blocks, hashes, 0, start)
            self._write(blocks, hashes, start, start + n)
            if self.hybrid:
                states = self.scheduler.kv_cache_manager.get_block_ids(rid)[1]
                if rid in new_ids and start > 0:
                    self.mismatched_states += self._check_state(states, hashes, start)
                self._write_state(states, hashes, start + n)
            if start < req.num_prompt_tokens:
                self.stats.computed_tokens += min(start + n, req.num_prompt_tokens) - start
            done = start + n >= len(tokens)
            sampled[rid] = [hashes[start + n - 1] % VOCAB] if done else []
        return sampled

    def _index(self, blocks: list[int], lo: int, hi: int):
        pos = torch.arange(lo, hi)
        bt = torch.tensor(blocks, dtype=torch.int64)
        return bt[pos // self.block_size], pos % self.block_size

    def _write(self, blocks, hashes, lo, hi) -> None:
        b, o = self._index(blocks, lo, hi)
        vals = expected_kv(hashes[lo:hi]).to(self.layers[0].device)
        for layer, view in enumerate(self.layers):
            view[b, :, o, :] = vals[:, layer]

    def _check(self, blocks, hashes, lo, hi) -> int:
        b, o = self._index(blocks, lo, hi)
        vals = expected_kv(hashes[lo:hi]).to(self.layers[0].device)
        bad = torch.zeros(hi - lo, dtype=torch.bool, device=vals.device)
        for layer, view in enumerate(self.layers):
            got = view[b, :, o, :]
            bad |= (got != vals[:, layer]).flatten(1).any(dim=1)
        return int(bad.sum())

    def _write_state(self, states: list[int], hashes: list[int], end: int) -> None:
        """The state after position end-1 goes to the block holding that position
        (vLLM's align mode: a block-aligned chunk end is a cacheable snapshot)."""
        idx = (end - 1) // self.block_size
        if idx >= len(states) or states[idx] == 0:
            return
        vals = expected_state(hashes[end - 1]).to(self.state_layers[0].device)
        for layer, view in enumerate(self.state_layers):
            view[states[idx], 0, 0, :] = vals[layer]

    def _check_state(self, states: list[int], hashes: list[int], start: int) -> int:
        """1 unless the state the request resumes from is its prefix's, at a boundary."""
        idx = start // self.block_size - 1
        if start % self.block_size or idx >= len(states) or states[idx] == 0:
            return 1
        vals = expected_state(hashes[start - 1]).to(self.state_layers[0].device)
        ok = all(
            torch.equal(view[states[idx], 0, 0, :], vals[layer])
            for layer, view in enumerate(self.state_layers)
        )
        return 0 if ok else 1

    def run(self, timeout_s: float = 60.0) -> None:
        """Steps until nothing is waiting, running or being saved. Bounded by wall time,
        not steps: a pull waits on another process (a lease over HTTP, a NIXL READ), and
        on a loaded machine 10,000 idle steps passed before it answered (CI)."""
        deadline = time.monotonic() + timeout_s
        while self.scheduler.has_requests():
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine did not drain in {timeout_s:.0f} s")
            self.step()

    def serve(self, req_id, tokens, params=None, session_id=None, max_tokens=1) -> list[int]:
        """Adds one request, runs to completion, returns its output tokens."""
        self.add(req_id, tokens, params, session_id, max_tokens)
        self.run()
        return self.finished.get(req_id, [])
