"""The worker side of a state pull (docs/vllm.md, "State pull (NIXL)"): one NIXL agent per
worker registers the host-payload arena (what a holder serves) and the staging region
(where a puller's READs land), reads notifications, and runs a puller's READs to the end:
verify every payload against the holder's checksum, scatter the verified leading run into
the blocks vLLM allocated, report the rest as load errors (vLLM recomputes them).

NIXL is used through its Python package (``nixl`` / ``nixl_cu12``): the calls here are
control only — registration, one READ per pull, status polls, notifications; the bytes
move in the agent's UCX threads, never through Python.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tether_vllm._native import CallerError, TetherError

logger = logging.getLogger("tether_vllm")

# The notification a READ carries to the holder: this prefix and the lease id.
NOTIF_PREFIX = b"tether-pull:"
# The agent's progress thread sleeps this long between polls. NIXL's Python wrapper sets
# 0: a busy loop that kept ~70 % of a core per engine (measured here, idle agent); at
# 100 µs an idle agent costs ~2 % and loopback READs were no slower (docs/vllm.md).
PROGRESS_DELAY_US = 100


def load_nixl() -> Any:
    """NIXL's Python API module (``nixl_agent`` and friends), or an ImportError saying why.

    The ``nixl`` meta package picks its backend by the CUDA version torch was built for,
    and refuses when that backend is not installed (torch 2.14's wheels are CUDA 13;
    ``nixl-cu12`` is what is installed here); its DRAM transfers do not depend on CUDA,
    so any installed backend will do.
    """
    errors = []
    for name in ("nixl._api", "nixl_cu12._api", "nixl_cu13._api"):
        try:
            return importlib.import_module(name)
        except ImportError as e:  # noqa: PERF203 — three tries at most
            errors.append(f"{name}: {e}")
    raise ImportError("no NIXL Python API importable (" + "; ".join(errors) + ")")


@contextlib.contextmanager
def _every_cpu() -> Iterator[None]:
    """Runs the body with the calling thread allowed on every CPU, then restores its mask.

    NIXL's progress thread and UCX's async thread inherit the CPU mask of the thread that
    creates them. vLLM's CPU worker pins its main thread to one core (``OMP_PROC_BIND``),
    where those threads starved behind the worker's own: a holder took 1.7 s to accept a
    puller's connection and READs timed out (seen here on two CPU engines). Made with
    every CPU allowed, they run wherever there is room; the kernel keeps them within the
    process's cpuset.
    """
    try:
        mask = os.sched_getaffinity(0)
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (AttributeError, OSError):
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, mask)


class Agent:
    """One worker's NIXL agent with its host regions registered once."""

    def __init__(self, regions: list[tuple[int, int]]):
        api = load_nixl()
        self.name = f"tether-{uuid.uuid4().hex[:16]}"
        self._agent = api.nixl_agent(self.name, api.nixl_agent_config(backends=[]))
        # The wrapper's own agent has no way to set the progress thread's delay: the
        # agent is made again with it, before any backend exists. The progress thread
        # moves the bytes of READs other agents post against our memory: without it
        # those READs hang (docs/vllm.md).
        cfg = api.nixlBind.nixlAgentConfig()
        cfg.useProgThread = True
        cfg.useListenThread = False
        cfg.pthrDelay = PROGRESS_DELAY_US
        cfg.syncMode = api.nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE.value
        with _every_cpu():
            self._agent.agent = api.nixlBind.nixlAgent(self.name, cfg)
            self._agent.create_backend("UCX", {})
        self._regs = []
        for addr, length in regions:
            if length:
                self._regs.append(self._agent.register_memory([(addr, length, 0, "")], "DRAM"))
        self.metadata: bytes = self._agent.get_agent_metadata()
        self._peers: set[str] = set()

    def peer(self, metadata: bytes) -> str:
        """Loads a holder's metadata once per agent name; returns the name."""
        name = self._agent.add_remote_agent(metadata)
        name = name.decode() if isinstance(name, bytes) else name
        self._peers.add(name)
        return name

    def read(
        self, peer: str, local: list[tuple[int, int]], remote: list[tuple[int, int]], notif: bytes
    ):
        """Posts one READ of ``remote`` into ``local`` ((address, bytes) pairs, DRAM);
        returns its handle, or raises ``RuntimeError`` when NIXL refuses it."""
        a = self._agent
        handle = a.initialize_xfer(
            "READ",
            a.get_xfer_descs([(addr, n, 0) for addr, n in local], "DRAM"),
            a.get_xfer_descs([(addr, n, 0) for addr, n in remote], "DRAM"),
            peer,
            notif,
        )
        if a.transfer(handle) == "ERR":
            self.release(handle)
            raise RuntimeError("NIXL refused to post the READ")
        return handle

    def state(self, handle) -> str:
        """``DONE``, ``PROC`` or ``ERR``."""
        return self._agent.check_xfer_state(handle)

    def release(self, handle) -> bool:
        """Frees a transfer handle; False when NIXL cannot (still active)."""
        try:
            self._agent.release_xfer_handle(handle)
            return True
        except Exception as e:  # noqa: BLE001 — NIXL raises its own types
            logger.warning("NIXL: cannot release a transfer handle (%s)", e)
            return False

    def notified(self) -> list[str]:
        """Lease ids of the pull notifications received since the last call."""
        out = []
        for msgs in self._agent.get_new_notifs().values():
            for m in msgs:
                if isinstance(m, bytes) and m.startswith(NOTIF_PREFIX):
                    out.append(m[len(NOTIF_PREFIX) :].decode("ascii", "replace"))
        return out


@dataclass
class _Read:
    """One puller's READ in flight."""

    rid: str
    lease: str
    block_ids: list[int]
    slots: list[int]
    checksums: list[int]
    handle: Any
    deadline: float
    started: float


@dataclass
class PullWorker:
    """A worker's pulls and notifications; ``copier`` is the attention group's copy engine
    (its arena and staging region are what ``agent`` registered)."""

    copier: Any
    agent: Agent
    timeout_s: float
    truncate_every: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    reads: dict[str, _Read] = field(default_factory=dict)
    # Lease ids notified since the last report, and finished pulls: (rid, lease, blocks
    # verified and loaded, the block ids vLLM allocated for the pull).
    notified: list[str] = field(default_factory=list)
    done: list[tuple[str, str, int, list[int]]] = field(default_factory=list)
    # Staging slots whose READ could not be released (never reused: a late write there
    # would land in another pull's bytes before its verification).
    quarantined: list[int] = field(default_factory=list)
    _pulled_payloads: int = 0

    def _count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def start(self, op: tuple) -> None:
        """A pull from the scheduler: ``(rid, lease, peer metadata, block ids, [(address,
        bytes, checksum)])``. A READ that cannot start fails the pull at once."""
        rid, lease, metadata, block_ids, blocks = op
        slots = self.copier.staging_alloc(len(blocks))
        if slots is None:
            logger.warning("request %s: pull staging region full; recomputing", rid)
            self._finish(rid, lease, block_ids, 0)
            return
        local, remote = [], []
        for (slot, addr), (raddr, length, _) in zip(slots, blocks):
            self._pulled_payloads += 1
            if self.truncate_every and self._pulled_payloads % self.truncate_every == 0:
                # Fault injection: this payload's READ ends half way; what the slot held
                # before stays behind it (zeroed here, so no earlier pull passes for it).
                length //= 2
                self.copier.staging_poison(slot, length)
                self._count("faults_injected")
            local.append((addr, length))
            remote.append((raddr, length))
        ids = [s for s, _ in slots]
        try:
            peer = self.agent.peer(metadata)
            handle = self.agent.read(peer, local, remote, NOTIF_PREFIX + lease.encode())
        except Exception as e:  # noqa: BLE001 — any NIXL failure is a recompute
            logger.warning("request %s: pull READ not started (%s); recomputing", rid, e)
            self.copier.staging_free(ids)
            self._finish(rid, lease, block_ids, 0)
            return
        now = time.monotonic()
        self.reads[rid] = _Read(
            rid, lease, list(block_ids), ids, [c for _, _, c in blocks], handle,
            now + self.timeout_s, now,
        )

    def poll(self) -> None:
        """Finishes every READ that completed, failed or ran past its deadline."""
        for rid, r in list(self.reads.items()):
            state = self.agent.state(r.handle)
            if state == "PROC" and time.monotonic() < r.deadline:
                continue
            del self.reads[rid]
            good = 0
            if state == "DONE":
                try:
                    good = self.copier.load_staged(r.block_ids, r.slots, r.checksums)
                except CallerError:
                    raise
                except TetherError as e:  # a copy that failed: recompute, never wrong KV
                    logger.warning("request %s: pulled blocks not restored (%s)", rid, e)
                if good < len(r.block_ids):
                    logger.warning(
                        "request %s: pulled payload %d of %d failed verification; "
                        "recomputing from there", rid, good, len(r.block_ids),
                    )
            else:
                logger.warning(
                    "request %s: pull READ %s; recomputing",
                    rid, "failed" if state == "ERR" else "timed out",
                )
            if self.agent.release(r.handle):
                self.copier.staging_free(r.slots)
            else:
                self.quarantined += r.slots
            if state == "DONE":
                self._count("pull_ms", int((time.monotonic() - r.started) * 1000))
            self._finish(rid, r.lease, r.block_ids, good)

    def _finish(self, rid: str, lease: str, block_ids: list[int], good: int) -> None:
        n = len(block_ids)
        self._count("pulls")
        self._count("pulled_blocks", good)
        self._count("pulled_bytes", good * self.copier.block_bytes)
        if good < n:
            self._count("pull_failed")
            self._count("pull_failed_blocks", n - good)
        self.done.append((rid, lease, good, list(block_ids)))

    def take_notified(self) -> list[str]:
        self.notified += self.agent.notified()
        out, self.notified = self.notified, []
        return out
