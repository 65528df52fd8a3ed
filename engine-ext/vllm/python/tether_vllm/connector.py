"""TetherConnector: tether's turn-boundary retention as a vLLM 0.33 KV connector.

Scheduler side (one per engine): at a prompt end (``kv_transfer_params["tether"]``
from the gateway, or ``request.session_id``) it keeps the request's full blocks in
vLLM's own prefix cache by holding a reference on them for the turn's interval
(``BlockPool.touch``), and writes the blocks the host tier lacks through to host memory
(checksummed, one copy per block hash). The retention policy — intervals, supersede,
expiry, which retention yields under device pressure, which host records make room —
is tether's ``Ledger`` (Rust). A returning turn hits vLLM's prefix cache on the device;
what was let go is restored from the host tier before its prefill.

Worker side (one per worker): gathers and scatters vLLM's KV pages for every layer
through tether's KV-copy engine (CPU reference backend, CUDA backend for GPU caches),
with the GIL released; only block ids and hashes cross into Rust.

Hybrid models (attention + Mamba / linear-attention groups, vLLM's hybrid allocator,
``--mamba-cache-mode align``; ``SupportsHMA``): a prompt end retains, per group, the
blocks up to the last block boundary whose linear state vLLM snapshotted — the
attention KV and the state block at that boundary — so the next turn resumes there and
never past a snapshot; the host tier holds the state pages beside the KV, and hybrid
restores are asynchronous loads (docs/vllm.md, "Hybrid models").

Residency endpoint (``residency_port``): the scheduler side serves a ``/load`` reply
(``LoadReport``) from the engine-core process, listing what the ledger retains by
resident key, tokens and tier, so a gateway can place sessions where their state is
(docs/vllm.md, "Residency endpoint").

State pull (``pull``): a turn migrated to this engine reads its retained blocks from the
old holder with a one-sided NIXL READ of the holder's host tier, under a lease the holder
serves on the same listener (``lease.py``, ``pull.py``; docs/vllm.md, "State pull (NIXL)").

Every public behaviour is documented in docs/vllm.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

from vllm.v1.request import RequestStatus

from tether_vllm._native import (
    MARKER_KEY,
    RESIDENCY_MAX_ENTRIES,
    BusyShare,
    CallerError,
    KvCopier,
    Ledger,
    PrefillRate,
    TetherError,
    load_report,
    parse_marker,
)
from tether_vllm.lease import LeaseBook, Puller, chain_of, fingerprint
from tether_vllm.residency import ResidencyListener

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger("tether_vllm")

GIB = 1 << 30

# kv_connector_extra_config fields, their types and defaults (docs/vllm.md).
_DEFAULTS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "host_bytes": (int, 4 * GIB),
    "retention": (bool, True),
    "session_id_retention": (bool, True),
    "max_device_fraction": ((int, float), 0.5),
    "free_watermark": ((int, float), 0.02),
    "max_interval_ms": (int, 3_600_000),
    "intervals_ms": (dict, {}),
    "residency_port": ((int, type(None)), None),
    "residency_host": (str, "0.0.0.0"),
    "residency_max_entries": (int, RESIDENCY_MAX_ENTRIES),
    "fault_corrupt_every": (int, 0),
    "pull": (bool, False),
    "pull_port": ((int, type(None)), None),
    "pull_lease_ms": (int, 30_000),
    "pull_timeout_ms": (int, 10_000),
    "pull_staging_bytes": (int, 256 << 20),
    "fault_pull_truncate_every": (int, 0),
}
_KINDS = ("first", "user", "tool", "handoff")


@dataclass(frozen=True)
class TetherConfig:
    """``kv_connector_extra_config``, validated at start (a bad field fails with its name)."""

    host_bytes: int
    retention: bool
    session_id_retention: bool
    max_device_fraction: float
    free_watermark: float
    max_interval_ms: int
    intervals_ms: dict[str, int]
    residency_port: int | None
    residency_host: str
    residency_max_entries: int
    fault_corrupt_every: int
    pull: bool
    pull_port: int | None
    pull_lease_ms: int
    pull_timeout_ms: int
    pull_staging_bytes: int
    fault_pull_truncate_every: int

    @classmethod
    def parse(cls, extra: dict[str, Any] | None) -> TetherConfig:
        extra = dict(extra or {})
        values: dict[str, Any] = {}
        for name, (types, default) in _DEFAULTS.items():
            v = extra.pop(name, default)
            # bool is an int subclass: never accept it for a number, nor a number for it.
            if isinstance(v, bool) != (types is bool) or not isinstance(v, types):
                raise ValueError(
                    f"kv_connector_extra_config.{name}: expected {_type_name(types)}, "
                    f"got {v!r}"
                )
            values[name] = v
        if extra:
            raise ValueError(
                f"kv_connector_extra_config: unknown field(s) {sorted(extra)}; "
                f"known: {sorted(_DEFAULTS)}"
            )
        if values["host_bytes"] < 0:
            raise ValueError("kv_connector_extra_config.host_bytes: must be >= 0")
        if not 0.0 <= values["max_device_fraction"] <= 1.0:
            raise ValueError(
                "kv_connector_extra_config.max_device_fraction: must be in [0, 1]"
            )
        if not 0.0 <= values["free_watermark"] < 1.0:
            raise ValueError("kv_connector_extra_config.free_watermark: must be in [0, 1)")
        if values["max_interval_ms"] < 0:
            raise ValueError("kv_connector_extra_config.max_interval_ms: must be >= 0")
        port = values["residency_port"]
        if port is not None and not 0 <= port <= 65535:
            raise ValueError(
                "kv_connector_extra_config.residency_port: must be in [0, 65535] "
                "(0: any free port), or absent for no listener"
            )
        if not values["residency_host"]:
            raise ValueError("kv_connector_extra_config.residency_host: must not be empty")
        if not 1 <= values["residency_max_entries"] <= RESIDENCY_MAX_ENTRIES:
            raise ValueError(
                "kv_connector_extra_config.residency_max_entries: must be in "
                f"[1, {RESIDENCY_MAX_ENTRIES}]"
            )
        if values["fault_corrupt_every"] < 0:
            raise ValueError(
                "kv_connector_extra_config.fault_corrupt_every: must be >= 0 (0: off)"
            )
        _check_pull(values)
        for k, v in values["intervals_ms"].items():
            if k not in _KINDS:
                raise ValueError(
                    f"kv_connector_extra_config.intervals_ms.{k}: unknown turn kind "
                    f"(known: {', '.join(_KINDS)})"
                )
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(
                    f"kv_connector_extra_config.intervals_ms.{k}: expected an integer "
                    f">= 0, got {v!r}"
                )
        values["max_device_fraction"] = float(values["max_device_fraction"])
        values["free_watermark"] = float(values["free_watermark"])
        return cls(**values)


def _check_pull(values: dict[str, Any]) -> None:
    """The state pull's fields (docs/vllm.md, "State pull (NIXL)")."""
    for name in ("pull_lease_ms", "pull_timeout_ms"):
        if values[name] < 1:
            raise ValueError(f"kv_connector_extra_config.{name}: must be >= 1")
    for name in ("pull_staging_bytes", "fault_pull_truncate_every"):
        if values[name] < 0:
            raise ValueError(f"kv_connector_extra_config.{name}: must be >= 0")
    port = values["pull_port"]
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("kv_connector_extra_config.pull_port: must be in [1, 65535]")
    if not values["pull"]:
        return
    if values["residency_port"] is None:
        raise ValueError(
            "kv_connector_extra_config.pull: needs residency_port (the lease endpoints "
            "share its listener)"
        )
    if port is None and values["residency_port"] == 0:
        raise ValueError(
            "kv_connector_extra_config.pull_port: must be set when residency_port is 0 "
            "(a holder's port is not known otherwise)"
        )


def _type_name(types: type | tuple[type, ...]) -> str:
    if isinstance(types, tuple):
        return " or ".join(t.__name__ for t in types)
    return types.__name__


@dataclass
class TetherMetadata(KVConnectorMetadata):
    """Scheduler -> worker instructions for one step (plain lists: pickles as is).

    ``ops`` run in order before the loads: ``("save", req_id, group, block_ids,
    hashes)`` copies one KV cache group's device blocks to host payloads, ``("free",
    hashes16)`` frees host payloads. ``loads`` are ``(req_id, group, block_ids, hashes)``
    to restore (a hybrid request's loads are all-or-nothing, docs/vllm.md).
    """

    ops: list[tuple] = field(default_factory=list)
    loads: list[tuple[str, int, list[int], list[bytes]]] = field(default_factory=list)
    # State pulls to start: (req_id, lease, holder's agent metadata, block ids,
    # [(address, bytes, checksum)]) (docs/vllm.md, "State pull (NIXL)").
    pulls: list[tuple] = field(default_factory=list)


@dataclass
class _Pending:
    """A load the scheduler planned for a request, waiting for its block ids."""

    start_block: int
    hashes: list[bytes]
    pull: bool = False  # from a holder (a lease), not from this engine's host tier


@dataclass(frozen=True)
class _Groups:
    """Which KV cache groups hold attention KV and which hold linear state."""

    attention: tuple[int, ...]
    state: tuple[int, ...]

    @property
    def hybrid(self) -> bool:
        return bool(self.state)


def _classify_groups(kv_cache_config: KVCacheConfig | None, block_size: int) -> _Groups:
    """The groups of a model the connector can retain, or a ValueError naming why not.

    One group: attention KV (any spec vLLM gives one group). Several (vLLM's hybrid
    allocator): full-attention groups and Mamba / linear-attention groups in
    ``align`` mode, all with the scheduler's block size — the layout whose state
    snapshots fall on block boundaries. Anything else is refused at start.
    """
    groups = kv_cache_config.kv_cache_groups if kv_cache_config else []
    if not groups:
        raise ValueError("TetherConnector: the model has no KV cache groups")
    if len(groups) == 1:
        if isinstance(groups[0].kv_cache_spec, MambaSpec):
            raise ValueError(
                "TetherConnector: a model with only linear-state layers (no attention "
                "KV) is not supported"
            )
        return _Groups(attention=(0,), state=())
    attention, state = [], []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        name = (
            f"TetherConnector: KV cache group {i} ({type(spec).__name__}, "
            f"layers {g.layer_names[:2]}...)"
        )
        if isinstance(spec, MambaSpec):
            if spec.mamba_cache_mode != "align":
                raise ValueError(
                    f"{name}: mamba_cache_mode is {spec.mamba_cache_mode!r}; the connector "
                    "needs 'align' (--mamba-cache-mode align, prefix caching on), where "
                    "state snapshots fall on block boundaries"
                )
            if spec.num_speculative_blocks:
                raise ValueError(f"{name}: speculative state blocks are not supported")
            state.append(i)
        elif type(spec) is FullAttentionSpec and spec.sliding_window is None:
            attention.append(i)
        else:
            raise ValueError(
                f"{name}: unknown state layout for the connector (it knows full "
                "attention and Mamba/linear attention in align mode); for sliding-window "
                "models start vLLM with --disable-hybrid-kv-cache-manager"
            )
        if spec.block_size != block_size:
            raise ValueError(
                f"{name}: block size {spec.block_size} differs from the scheduler's "
                f"{block_size}"
            )
    if not attention:
        raise ValueError("TetherConnector: a hybrid model without attention groups")
    return _Groups(attention=tuple(attention), state=tuple(state))


def _group_hash(group: int, block_hash: bytes) -> bytes:
    """A block's identity in the ledger: vLLM's hash for the first group, a derived
    one for the others (every group's block at a position has the same vLLM hash)."""
    if group == 0:
        return block_hash
    return hashlib.sha256(b"tether-group" + bytes([group]) + block_hash).digest()[:16]


class TetherConnector(KVConnectorBase_V1, SupportsHMA):
    """tether's KV connector for vLLM 0.33 (see the module docs and docs/vllm.md)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ):
        super().__init__(vllm_config, role, kv_cache_config)
        self.config = TetherConfig.parse(
            vllm_config.kv_transfer_config.kv_connector_extra_config
        )
        self.block_size: int = vllm_config.cache_config.block_size
        self.groups = _classify_groups(kv_cache_config, self.block_size)
        groups = kv_cache_config.kv_cache_groups
        spec = groups[0].kv_cache_spec
        self.num_blocks: int = kv_cache_config.num_blocks
        # One block across every layer of this worker: what a host payload holds.
        self.block_bytes: int = spec.page_size_bytes * len(groups[0].layer_names)
        self.stats: dict[str, int] = {
            "loaded_blocks": 0,
            "load_failed_blocks": 0,
            "saved_blocks": 0,
            "bad_markers": 0,
            "no_snapshot": 0,
            "scheduler_us": 0,
            "faults_injected": 0,
        }
        self._now_ms = lambda: int(time.monotonic() * 1000)
        if getattr(self._kv_transfer_config, "kv_load_failure_policy", "fail") != "recompute":
            logger.warning(
                "kv_load_failure_policy is not 'recompute': a host block that fails its "
                "checksum will fail its request instead of being recomputed (docs/vllm.md)"
            )
        if self.config.pull:
            self._check_pull()
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler()
        else:
            self._init_worker()

    def _check_pull(self) -> None:
        """What a state pull needs, checked at start (a ValueError naming ``pull``)."""
        why = None
        parallel = self._vllm_config.parallel_config
        sizes = {
            name: int(getattr(parallel, name, 1) or 1)
            for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        }
        if self.groups.hybrid:
            why = "hybrid models (several KV cache groups) are not pulled"
        elif any(n > 1 for n in sizes.values()):
            why = f"pulls need one worker and one engine core ({sizes})"
        else:
            try:
                from tether_vllm.pull import load_nixl

                load_nixl()
            except ImportError as e:
                why = f"the nixl package does not import ({e})"
        if why:
            raise ValueError(f"kv_connector_extra_config.pull: {why}")

    # ------------------------------------------------------------------ scheduler

    def _init_scheduler(self) -> None:
        iv = self.config.intervals_ms
        self.ledger = Ledger(
            self.block_size,
            self.num_blocks,
            self.block_bytes,
            self.config.host_bytes,
            retention=self.config.retention,
            max_interval_ms=self.config.max_interval_ms,
            first_ms=iv.get("first"),
            user_ms=iv.get("user"),
            tool_ms=iv.get("tool"),
            handoff_ms=iv.get("handoff"),
            attention_groups=len(self.groups.attention),
            state_groups=len(self.groups.state),
        )
        self.pool: BlockPool | None = None
        self._markers: dict[str, Any] = {}
        self._pending: dict[str, _Pending] = {}
        self._ops: list[tuple] = []
        self._loads: list[tuple[str, int, list[int], list[bytes]]] = []
        self._pulls: list[tuple] = []
        # Hashes whose save is not in a built metadata yet: not loadable this step.
        self._unsaved: set[bytes] = set()
        # Requests whose blocks vLLM must not free until the worker saved them.
        self._saving: set[str] = set()
        # Requests added and not finished (vLLM's own objects: their status and
        # computed tokens are current whenever the listener reads them).
        self._inflight: dict[str, Request] = {}
        # Busy while any request is in flight: the /load report's busy share.
        self._busy = BusyShare()
        # Prompt tokens per second over this core's own steps: the /load report's
        # prefill rate, which the gateway turns queued prefill tokens into a wait with.
        self._prefill_rate = PrefillRate()
        self._started_ms = time.monotonic() * 1000
        self.book: LeaseBook | None = None
        self.puller: Puller | None = None
        if self.config.pull:
            self._init_pull()
        self.residency: ResidencyListener | None = None
        if self.config.residency_port is not None:
            self._start_residency()

    def _init_pull(self) -> None:
        """The holder's lease book and the puller (docs/vllm.md, "State pull (NIXL)")."""
        fp = fingerprint(self._vllm_config, self._kv_cache_config)
        self.book = LeaseBook(self.ledger, self.config.pull_lease_ms, fp, self.block_bytes)
        port = self.config.pull_port or self.config.residency_port
        self.puller = Puller(
            port,
            self.config.pull_timeout_ms,
            fp,
            self.block_size,
            self.block_bytes,
            self.config.pull_staging_bytes // max(self.block_bytes, 1),
        )
        logger.info("state pull: on (holders' lease endpoints on port %d; %s)", port, fp)

    def _start_residency(self) -> None:
        """The ``/load`` listener, in this (engine-core) process where the ledger lives;
        each data-parallel engine core listens on the port plus its local DP rank."""
        parallel = self._vllm_config.parallel_config
        self._dp_rank = int(getattr(parallel, "data_parallel_rank", 0) or 0)
        port = self.config.residency_port
        if port:
            port += int(getattr(parallel, "data_parallel_rank_local", 0) or 0)
        get, post = self.book.routes() if self.book is not None else ({}, {})
        try:
            self.residency = ResidencyListener(
                self.config.residency_host, port, self.load_report, self.stats_report,
                get=get, post=post,
            )
        except OSError as e:
            raise ValueError(
                f"kv_connector_extra_config.residency_port: cannot listen on "
                f"{self.config.residency_host}:{port} ({e})"
            ) from e
        logger.info(
            "residency endpoint: http://%s:%d/load", self.config.residency_host, self.residency.port
        )

    def load_report(self) -> bytes:
        """This engine core's ``/load`` reply (JSON bytes, ``LoadReport``; docs/vllm.md,
        "Residency endpoint"): the requests the connector saw added and not finished,
        by vLLM's status, and the residency summary of what the ledger retains."""
        running = waiting = restoring = 0
        queued = 0
        admitted = []
        for rid, req in list(self._inflight.items()):
            # Listed from admission: a next turn that arrives while this one runs (or
            # within a poll of its end) finds its holder (docs/vllm.md).
            marker = self._markers.get(rid)
            if self.config.retention and marker is not None and marker.prompt_end:
                admitted.append((marker, req.num_prompt_tokens))
            status = req.status
            if status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                running += 1
                restoring += 1
            elif status == RequestStatus.RUNNING:
                running += 1
            elif not RequestStatus.is_finished(status):
                waiting += 1
            queued += max(0, req.num_prompt_tokens - req.num_computed_tokens)
        pool = self.pool
        return load_report(
            self.ledger,
            dp_rank=getattr(self, "_dp_rank", 0),
            running=running,
            waiting=waiting,
            restoring=restoring,
            queued_prefill_tokens=queued,
            kv_usage=pool.get_usage() if pool is not None else 0.0,
            kv_blocks=self.num_blocks,
            uptime_ms=self._uptime_ms(),
            max_entries=self.config.residency_max_entries,
            admitted=admitted,
            busy=self._busy.share(self._uptime_ms()),
            prefill_tokens_per_s=self._prefill_rate.tokens_per_s,
        )

    def _uptime_ms(self) -> float:
        return time.monotonic() * 1000 - self._started_ms

    def stats_report(self) -> bytes:
        """``GET /stats``: ``connector_stats()`` as JSON — the ledger's counters and both
        sides' counters (the worker's arrive with its reports), for operators and tests
        that only see the engine from outside."""
        return json.dumps(self.connector_stats(), sort_keys=True).encode()

    def shutdown(self) -> None:
        if getattr(self, "residency", None) is not None:
            self.residency.close()
            self.residency = None

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        self.pool = gpu_block_pool

    def _marker(self, request: Request):
        """The request's turn marker (parsed once), or None. Bad params never raise."""
        rid = request.request_id
        if rid in self._markers:
            return self._markers[rid]
        marker = None
        params = request.kv_transfer_params
        try:
            if isinstance(params, dict) and MARKER_KEY in params:
                marker = parse_marker(params[MARKER_KEY])
            elif params is not None and not isinstance(params, dict):
                raise CallerError("kv_transfer_params must be an object")
        except CallerError as e:
            self.stats["bad_markers"] += 1
            logger.warning("request %s: %s; treated as untracked", rid, e)
            marker = None
        if marker is None and self.config.session_id_retention:
            sid = getattr(request, "session_id", None)
            if isinstance(sid, str) and sid:
                digest = hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()
                marker = parse_marker({"session": digest[:32], "prompt_end": "1"})
        self._markers[rid] = marker
        return marker

    def on_new_request(self, request: Request) -> None:
        t0 = time.thread_time_ns()
        if not self._inflight:
            self._busy.set(self._uptime_ms(), True)
        self._inflight[request.request_id] = request
        marker = self._marker(request)
        if marker is not None:
            self.ledger.touch(marker, self._now_ms())
        self._tick(t0)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        t0 = time.thread_time_ns()
        try:
            n = self._matched(request, num_computed_tokens)
            if n is None:
                return None, False  # a lease request is in flight: ask again later
            pending = self._pending.get(request.request_id)
            # Hybrid loads are asynchronous: vLLM 0.33 can recompute a failed load
            # of a multi-group model only as a failed receive (docs/vllm.md); so are
            # pulls (the READ runs between steps).
            return n, bool(n) and (self.groups.hybrid or (pending is not None and pending.pull))
        finally:
            self._tick(t0)

    def _matched(self, request: Request, num_computed_tokens: int) -> int | None:
        self._pending.pop(request.request_id, None)
        bs = self.block_size
        start = num_computed_tokens // bs
        # At least one prompt token must be computed: never load the last block of an
        # exactly block-aligned prompt.
        usable = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        # Blocks this request will hold: its whole sequence plus the next token's slot
        # in every attention group, and a hybrid model's two state blocks per group.
        need = (-(-(request.num_tokens + 1) // bs) - start) * len(self.groups.attention)
        self._make_room(request, need + 2 * len(self.groups.state))
        if start >= usable or num_computed_tokens % bs:
            return 0
        chain = list(request.block_hashes[start:usable])
        n = len(chain)
        for g in self.groups.attention:
            n = self._on_host([_group_hash(g, h) for h in chain[:n]])
        # Hybrid: the hit ends at the last boundary whose state is on host too.
        while n and not all(
            self._on_host([_group_hash(g, chain[n - 1])]) for g in self.groups.state
        ):
            n -= 1
        if n == 0:
            if self.puller is None:
                return 0
            # Nothing to restore here: the holder the gateway named may have it.
            k = self._pull(request, start, usable)
            if not k:
                return k
            self._pending[request.request_id] = _Pending(start, chain[:k], pull=True)
            return k * bs
        self._pending[request.request_id] = _Pending(start, chain[:n])
        return n * bs

    def _pull(self, request: Request, start: int, usable: int) -> int | None:
        """Blocks from ``start`` a holder leased to this request (0: no pull; None: its
        answer is not in yet). A request asks once, and only when its marker names
        ``pull_from`` (docs/vllm.md, "State pull (NIXL)")."""
        rid = request.request_id
        if rid in self.puller.pulls:
            return self.puller.granted(rid, start)
        marker = self._markers.get(rid)
        if (
            marker is None
            or marker.pull_from is None
            or getattr(request, "lora_request", None) is not None
        ):
            return 0
        tokens = request.all_token_ids[: usable * self.block_size]
        chain = chain_of(tokens, self.block_size, getattr(request, "cache_salt", None))
        self.puller.want(rid, marker.pull_from[0], marker.resident_key, chain, start)
        return None

    def _on_host(self, hashes: list[bytes]) -> int:
        """Leading hashes the host tier holds and whose save is not still queued."""
        n = self.ledger.host_prefix(hashes)
        for i, h in enumerate(hashes[:n]):
            if h in self._unsaved:
                return i
        return n

    def _make_room(self, request: Request, need_blocks: int) -> None:
        """Device pressure: let retentions go (their turns are on the host tier) until
        the free queue holds what this request needs plus the watermark."""
        if self.pool is None:
            return
        want = max(need_blocks, 0) + 1 + int(self.config.free_watermark * self.num_blocks)
        free = self.pool.get_num_free_blocks()
        if free >= want:
            return
        spare = self._markers.get(request.request_id)
        self._release(self.ledger.yield_blocks(want - free, self._now_ms(), spare))

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        pending = self._pending.pop(request.request_id, None)
        if pending is not None and pending.pull:
            self._pull_allocated(request, blocks, num_external_tokens, pending)
            return
        if num_external_tokens == 0 or pending is None:
            return
        n = num_external_tokens // self.block_size
        start = pending.start_block
        table = blocks.get_block_ids()
        loads = []
        for g in self.groups.attention:
            loads.append((g, table[g][start : start + n], pending.hashes[:n]))
        # A state group's table holds one real block for the hit: at its last index.
        for g in self.groups.state:
            loads.append((g, table[g][start + n - 1 : start + n], pending.hashes[n - 1 : n]))
        null = self.pool.null_block.block_id if self.pool is not None else 0
        for g, ids, hashes in loads:
            if len(ids) != len(hashes) or null in ids:
                # Never restore into a block vLLM did not allocate for it.
                raise RuntimeError(
                    f"TetherConnector: request {request.request_id}: group {g} has "
                    f"blocks {ids} for {len(hashes)} to load"
                )
        for g, ids, hashes in loads:
            self._loads.append(
                (request.request_id, g, list(ids), [_group_hash(g, h) for h in hashes])
            )

    def _pull_allocated(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int, pending: _Pending
    ) -> None:
        """vLLM allocated the blocks of a granted pull: the worker READs into them."""
        rid = request.request_id
        n = num_external_tokens // self.block_size
        start = pending.start_block
        ids = list(blocks.get_block_ids()[0][start : start + n])
        null = self.pool.null_block.block_id if self.pool is not None else 0
        if n == 0 or len(ids) != n or null in ids:
            if n:
                # Never READ into a block vLLM did not allocate for it.
                raise RuntimeError(
                    f"TetherConnector: request {rid}: blocks {ids} for {n} to pull"
                )
            self.puller.finish(rid)
            return
        op = self.puller.allocated(rid, start, ids)
        if op is not None:
            self._pulls.append(op)

    def _free_op(self) -> None:
        """The ledger's host frees into the metadata, in order with the saves queued
        before and after them (a payload freed and stored again in one step ends stored);
        a payload a lease holds is freed when its lease ends."""
        freed = self.ledger.take_freed()
        if self.book is not None:
            freed = self.book.frees(freed)
        if freed:
            self._ops.append(("free", freed))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        t0 = time.thread_time_ns()
        now = self._now_ms()
        self._release(self.ledger.release_expired(now))
        self._enforce_device_share(now)
        if self.book is not None:
            self.book.tick()
        if self.puller is not None:
            self.puller.heartbeat()
        self._free_op()
        meta = TetherMetadata(ops=self._ops, loads=self._loads, pulls=self._pulls)
        self._ops, self._loads, self._pulls = [], [], []
        self._unsaved.clear()
        for rid in scheduler_output.finished_req_ids:
            self._markers.pop(rid, None)
        self._prefill_rate.step(self._uptime_ms(), self._prompt_tokens_scheduled(scheduler_output))
        self._tick(t0)
        return meta

    def _prompt_tokens_scheduled(self, scheduler_output: SchedulerOutput) -> int:
        """New prompt tokens in this step: the scheduled tokens of requests that have
        no output yet (decoding requests have; a preempted request that recomputes
        is not counted, a small undercount)."""
        tokens = 0
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            req = self._inflight.get(rid)
            if req is not None and getattr(req, "num_output_tokens", 1) == 0:
                tokens += n
        return tokens

    def _enforce_device_share(self, now: int) -> None:
        cap = int(self.config.max_device_fraction * self.num_blocks)
        over = self.ledger.held_blocks - cap
        if over > 0:
            self._release(self.ledger.yield_blocks(over, now, None))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """``SupportsHMA``: vLLM calls this (not ``request_finished``) once per request
        with every group's block ids, before freeing them."""
        t0 = time.thread_time_ns()
        try:
            return self._finished(request, block_ids), None
        finally:
            self._tick(t0)

    def _finished(self, request: Request, block_ids: tuple[list[int], ...]) -> bool:
        marker = self._marker(request)
        self._markers.pop(request.request_id, None)
        self._pending.pop(request.request_id, None)
        self._inflight.pop(request.request_id, None)
        if not self._inflight:
            self._busy.set(self._uptime_ms(), False)
        if self.puller is not None:
            if self.puller.loading(request.request_id):
                # Its READ is in flight: the blocks hold no verified KV yet (nothing to
                # retain) and vLLM must not reuse them before the worker reports it.
                return True
            self.puller.forget(request.request_id)
        if marker is None or not marker.prompt_end or self.pool is None:
            return False
        n = min(
            len(request.block_hashes),
            request.num_computed_tokens // self.block_size,
            *(len(block_ids[g]) for g in self.groups.attention),
        )
        hashes, ids, groups = self._retained_blocks(request, block_ids, n)
        if not ids:
            return False
        hold, release, store, _on_host = self.ledger.retain(marker, hashes, ids, self._now_ms())
        # Hold the new retention before letting the superseded one go (shared prefix
        # blocks never touch the free queue).
        self.pool.touch([self.pool.blocks[i] for i in hold])
        self._release(release)
        # What the host tier evicted to take this turn is freed before it is saved.
        self._free_op()
        if self.book is not None and getattr(request, "lora_request", None) is None:
            self.book.record(marker.resident_key, hashes, request.all_token_ids,
                             self.block_size, getattr(request, "cache_salt", None))
        if not store:
            return False
        for g in sorted({groups[i] for i in store}):
            save = [i for i in store if groups[i] == g]
            save_hashes = [hashes[i] for i in save]
            self._ops.append(("save", request.request_id, g, [ids[i] for i in save], save_hashes))
            self._unsaved.update(save_hashes)
        # The worker copies these blocks in a later step; until it reports the request
        # in finished_sending vLLM must not free (and reuse) them.
        self._saving.add(request.request_id)
        return True

    def _retained_blocks(
        self, request: Request, block_ids: tuple[list[int], ...], n: int
    ) -> tuple[list[bytes], list[int], list[int]]:
        """The ledger hash, block id and group of every block a prompt end retains.

        Attention-only: the first n blocks. Hybrid: every attention group's blocks up
        to the last boundary with a state snapshot, and each state group's snapshot
        block at it.
        """
        chain = request.block_hashes
        if not self.groups.hybrid:
            return list(chain[:n]), list(block_ids[0][:n]), [0] * n
        k, states = self._snapshot_boundary(request, n)
        if k == 0:
            if n:
                self.stats["no_snapshot"] += 1
            return [], [], []
        hashes: list[bytes] = []
        ids: list[int] = []
        groups: list[int] = []
        for g in self.groups.attention:
            hashes += [_group_hash(g, h) for h in chain[:k]]
            ids += block_ids[g][:k]
            groups += [g] * k
        for g, block in zip(self.groups.state, states):
            hashes.append(_group_hash(g, chain[k - 1]))
            ids.append(block.block_id)
            groups.append(g)
        return hashes, ids, groups

    def _snapshot_boundary(self, request: Request, n: int) -> tuple[int, list]:
        """The largest k <= n at which vLLM's prefix cache holds every state group's
        snapshot of this request's first k blocks, with those blocks (0 if none).

        In align mode a finished request's table has nulls where earlier states
        were retired, so the snapshot is looked up by hash, as vLLM's own prefix hit
        does; a retained turn never offers KV past the last state it can resume from.
        """
        pool = self.pool
        if pool is None:
            return 0, []
        for k in range(n, 0, -1):
            blocks = pool.get_cached_block(
                request.block_hashes[k - 1], list(self.groups.state)
            )
            if blocks is not None and all(
                b.block_hash_num_tokens in (None, k * self.block_size) for b in blocks
            ):
                return k, blocks
        return 0, []

    def _release(self, block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        if ids and self.pool is not None:
            # Tails first: the free queue evicts its front first.
            self.pool.free_blocks([self.pool.blocks[i] for i in reversed(ids)])

    def update_connector_output(self, connector_output) -> None:
        for rid in connector_output.finished_sending or ():
            self._saving.discard(rid)
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, TetherWorkerReport):
            for h in meta.corrupt:
                self.ledger.host_payload_lost(h)
            for name, n in meta.counts.items():
                self.stats[name] = self.stats.get(name, 0) + n
            if self.book is not None:
                lost = [bytes(h[:16]) for h in meta.corrupt]
                self.book.worker_report(meta.saved, lost, meta.agents, meta.notified)
            if self.puller is not None:
                for rid, *_ in meta.pulled:
                    self.puller.finish(rid)
                    if rid not in self._inflight:
                        self.puller.forget(rid)

    def _tick(self, t0: int) -> None:
        self.stats["scheduler_us"] += (time.thread_time_ns() - t0) // 1000

    def connector_stats(self) -> dict[str, int]:
        """Ledger counters plus this side's counters (scheduler side)."""
        out = dict(self.ledger.stats())
        out.update(self.stats)
        if self.book is not None:
            out.update(self.book.counters())
        if self.puller is not None:
            out.update(self.puller.stats)
        return out

    # ------------------------------------------------------------------ worker

    def _init_worker(self) -> None:
        # One copy engine per KV cache group: block ids are per group, and a state
        # group's pages overlay an attention group's memory.
        self.copiers: dict[int, KvCopier] = {}
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._sent: set[str] = set()
        self._recved: set[str] = set()
        self._failed_recv: set[str] = set()
        self._load_errors: set[int] = set()
        self._corrupt: list[bytes] = []
        self._device: torch.device | None = None
        # The worker's counters as last reported to the scheduler (deltas travel).
        self._reported: dict[str, int] = {}
        self._saved_payloads = 0
        self.pull_worker = None  # tether_vllm.pull.PullWorker, with `pull`
        self._agent_reported = False
        self._pulled: list[tuple[str, str, int, int]] = []

    @property
    def copier(self) -> KvCopier | None:
        """The first attention group's copy engine (the only one of a one-group model)."""
        return self.copiers.get(self.groups.attention[0])

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Describes every layer's view (address, strides) to the copy engine once."""
        if not kv_caches:
            raise ValueError("TetherConnector: no KV cache tensors to register")
        groups = self._kv_cache_config.kv_cache_groups
        if not self.groups.hybrid:
            self.copiers[0] = self._copier(kv_caches)
        else:
            for g in self.groups.attention:
                self.copiers[g] = self._copier({n: kv_caches[n] for n in groups[g].layer_names})
            for g in self.groups.state:
                self.copiers[g] = self._state_copier(g, kv_caches)
        self._kv_caches = dict(kv_caches)  # keeps the tensors (and their addresses) alive
        self._device = next(iter(kv_caches.values())).device
        if self.config.pull:
            self._init_pull_worker()

    def _init_pull_worker(self) -> None:
        """A NIXL agent over the attention group's payload arena and staging region,
        registered once (docs/vllm.md, "State pull (NIXL)")."""
        from tether_vllm.pull import Agent, PullWorker

        copier = self.copier
        if copier.block_bytes != self.block_bytes:
            raise ValueError(
                f"kv_connector_extra_config.pull: the copy engine's payload is "
                f"{copier.block_bytes} bytes, the scheduler's block {self.block_bytes}"
            )
        arena, staging = copier.regions()
        self.pull_worker = PullWorker(
            copier,
            Agent([arena, staging]),
            self.config.pull_timeout_ms / 1000,
            self.config.fault_pull_truncate_every,
            stats=self.stats,
        )
        logger.info("state pull: NIXL agent %s registered %d + %d bytes",
                    self.pull_worker.agent.name, arena[1], staging[1])

    def _copier(self, kv_caches: dict[str, torch.Tensor]) -> KvCopier:
        """The copy engine of one attention group's layer views."""
        views = list(kv_caches.values())
        first = views[0]
        if first.dim() != 4:
            raise ValueError(
                f"TetherConnector: expected [num_blocks, num_kv_heads, block_size, "
                f"2*head_size] views, got shape {tuple(first.shape)}"
            )
        nb, heads, bs, content = first.shape
        for name, v in kv_caches.items():
            if v.shape != first.shape or v.stride() != first.stride() or v.dtype != first.dtype:
                raise ValueError(f"TetherConnector: layer {name} differs in shape/stride/dtype")
            if v.stride(3) != 1:
                raise ValueError(f"TetherConnector: layer {name}: last axis not contiguous")
        return _new_copier(views, nb, bs, heads, content // 2, self._host_bytes(),
                           self.config.pull_staging_bytes if self.config.pull else 0)

    def _state_copier(self, group: int, kv_caches: dict[str, torch.Tensor]) -> KvCopier:
        """The copy engine of one state group: each layer's state page is moved as
        opaque bytes, a [num_blocks, 1, 1, state bytes] view checked against its spec
        so nothing reads or writes state by guesswork."""
        g = self._kv_cache_config.kv_cache_groups[group]
        want = g.kv_cache_spec.state_content_size_bytes
        views = []
        for name in g.layer_names:
            view = kv_caches.get(name)
            if (
                view is None
                or view.dim() != 4
                or view.shape[1:] != (1, 1, want)
                or view.element_size() != 1
                or view.stride(3) != 1
                or want % 2
            ):
                shape = None if view is None else (tuple(view.shape), view.dtype)
                raise ValueError(
                    f"TetherConnector: state layer {name}: expected a [num_blocks, 1, 1, "
                    f"{want}] byte view of its state page (an even size), got {shape}"
                )
            if views and view.stride() != views[0].stride():
                raise ValueError(f"TetherConnector: state layer {name} differs in strides")
            views.append(view)
        # One "token" of one "head" per block, of want bytes: the state page.
        return _new_copier(views, views[0].shape[0], 1, 1, want // 2, self._host_bytes())

    def _host_bytes(self) -> int:
        """The host tier's capacity, which sizes each copy engine's payload arena."""
        return self.config.host_bytes

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, TetherMetadata) or not self.copiers:
            return
        if self._device is not None and self._device.type == "cuda":
            # Saves read what earlier forwards wrote: order after the compute stream.
            torch.cuda.current_stream(self._device).synchronize()
        for op in meta.ops:
            if op[0] == "save":
                _, rid, g, ids, hashes = op
                try:
                    self.copiers[g].save(ids, hashes)
                    self.stats["saved_blocks"] += len(ids)
                    self._inject_faults(g, hashes)
                except TetherError as e:
                    # A failed save is a future miss, never wrong KV: skip it.
                    logger.warning("request %s: host save failed (%s)", rid, e)
                self._sent.add(rid)
            elif op[0] == "free":
                for copier in self.copiers.values():
                    copier.free(op[1])
        for op in meta.pulls:
            if self.pull_worker is not None:
                self.pull_worker.start(op)
        for rid, g, ids, hashes in meta.loads:
            try:
                good = self.copiers[g].load(ids, hashes)
            except CallerError:
                raise
            except TetherError as e:
                logger.warning("request %s: host restore failed (%s); recomputing", rid, e)
                good = 0
            if good < len(ids):
                # The payload that broke the run is gone (missing, or freed as corrupt):
                # the scheduler forgets it and every host record that needs it.
                self._corrupt.append(hashes[good])
                self.stats["load_failed_blocks"] += len(ids) - good
                if self.groups.hybrid:
                    # vLLM recomputes a multi-group model's failed load as a whole
                    # (a failed receive): the request starts again from its device hit.
                    self._failed_recv.add(rid)
                else:
                    # vLLM recomputes from the first failed block.
                    self._load_errors.update(ids[good:])
            self.stats["loaded_blocks"] += good
            if self.groups.hybrid:
                self._recved.add(rid)

    def _inject_faults(self, group: int, hashes: list[bytes]) -> None:
        """``fault_corrupt_every`` = N > 0: every N-th saved payload is corrupted in place
        after its checksum was taken, so its restore must fail verification and be
        recomputed (the end-to-end fault test; off by default)."""
        n = self.config.fault_corrupt_every
        if not n:
            return
        for h in hashes:
            self._saved_payloads += 1
            if self._saved_payloads % n == 0 and self.copiers[group].corrupt(h):
                self.stats["faults_injected"] += 1

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        self._poll_pulls()
        sent, self._sent = self._sent, set()
        recved, self._recved = self._recved, set()
        return (sent or None), (recved or None)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """As vLLM's default, plus the hybrid loads that failed (also finished)."""
        sent, recved = self.get_finished(finished_req_ids)
        failed, self._failed_recv = self._failed_recv, set()
        return KVConnectorTransferResults(
            finished_sending=set(sent or ()),
            finished_recving=set(recved or ()),
            failed_recving=failed,
        )

    def _poll_pulls(self) -> None:
        """Finished pulls: received (vLLM schedules them), their unverified blocks load
        errors (vLLM recomputes from the first), reported to the scheduler."""
        if self.pull_worker is None:
            return
        self.pull_worker.poll()
        for rid, lease, good, ids in self.pull_worker.done:
            self._recved.add(rid)
            self._load_errors.update(ids[good:])
            self._pulled.append((rid, lease, good, len(ids)))
        self.pull_worker.done = []

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self):
        counts = {k: v - self._reported.get(k, 0) for k, v in self.stats.items()}
        counts = {k: d for k, d in counts.items() if d}
        saved, agents, notified = [], [], []
        for copier in self.copiers.values():
            s = copier.take_saved()  # drained every step: the list must not grow
            if copier is self.copier and self.pull_worker is not None:
                saved = s
        if self.pull_worker is not None:
            notified = self.pull_worker.take_notified()
            if not self._agent_reported:
                agents = [(self.pull_worker.agent.name, self.pull_worker.agent.metadata)]
                self._agent_reported = True
        if not (self._corrupt or counts or saved or agents or notified or self._pulled):
            return None
        self._reported = dict(self.stats)
        report = TetherWorkerReport(
            corrupt=self._corrupt, counts=counts, saved=saved, agents=agents,
            notified=notified, pulled=self._pulled,
        )
        self._corrupt, self._pulled = [], []
        return report

    @property
    def requires_kv_delivery(self) -> bool:
        # A dropped save is a future cache miss, not lost output.
        return False


def _new_copier(
    views: list[torch.Tensor], nb: int, bs: int, heads: int, head: int, host_bytes: int,
    staging_bytes: int = 0,
) -> KvCopier:
    """A copy engine over same-shaped views ([num_blocks, heads, block_size, 2*head]),
    its payload arena sized for ``host_bytes`` and a pull staging region of
    ``staging_bytes``."""
    first = views[0]
    es = first.element_size()
    available = [v.untyped_storage().nbytes() - v.storage_offset() * es for v in views]
    device = first.device
    return KvCopier(
        [v.data_ptr() for v in views],
        available,
        nb,
        bs,
        heads,
        head,
        (first.stride(0), first.stride(1), first.stride(2)),
        es,
        device="cuda" if device.type == "cuda" else "cpu",
        device_index=device.index or 0,
        host_bytes=host_bytes,
        staging_bytes=staging_bytes,
    )


@dataclass
class TetherWorkerReport(KVConnectorWorkerMetadata):
    """Worker -> scheduler: host payloads found corrupt (their records are dropped), the
    worker's counters since its last report (``connector_stats`` sums them), and, with
    ``pull``: payloads saved (id, address, checksum: what a lease names), the worker's
    NIXL agent (name, metadata; once), lease ids the holders' notifications released,
    and pulls finished (req_id, lease, blocks loaded, blocks pulled)."""

    corrupt: list[bytes]
    counts: dict[str, int] = field(default_factory=dict)
    saved: list[tuple[bytes, int, int]] = field(default_factory=list)
    agents: list[tuple[str, bytes]] = field(default_factory=list)
    notified: list[str] = field(default_factory=list)
    pulled: list[tuple[str, str, int, int]] = field(default_factory=list)

    def aggregate(self, other: TetherWorkerReport) -> TetherWorkerReport:
        counts = dict(self.counts)
        for k, n in other.counts.items():
            counts[k] = counts.get(k, 0) + n
        return TetherWorkerReport(
            corrupt=self.corrupt + other.corrupt,
            counts=counts,
            saved=self.saved + other.saved,
            agents=self.agents + other.agents,
            notified=self.notified + other.notified,
            pulled=self.pulled + other.pulled,
        )
