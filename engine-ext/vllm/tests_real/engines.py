"""Real vLLM servers (the CPU build in .venv-engine) for the end-to-end tests and the demo.

Each server is ``python -m vllm.entrypoints.openai.api_server`` on its own loopback address
(127.0.0.N, so every rank can use the same residency port: the gateway's load cluster
overrides the port and keeps the address, docs/vllm.md), serving the tiny model of
``tiny_model.py`` with a small, fixed KV budget (``--num-gpu-blocks-override``) so that a
flood evicts what plain prefix caching holds. Started in parallel, ready when ``/health``
answers, stopped (process group) on exit; a server that dies or is not ready within its
deadline fails the test with its log tail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BLOCK = 32  # tokens per KV block (--block-size; the CPU attention backend needs a multiple of 32)
API_PORT = 8000  # every rank's API port, on its own address
RESIDENCY_PORT = 8101  # every rank's residency endpoint, on its own address
START_S = float(os.environ.get("TETHER_ENGINE_START_S", "240"))
# On a CUDA vLLM (scripts/vllm-gpu-check.sh real): each engine's share of the one GPU.
GPU_MEMORY = os.environ.get("TETHER_ENGINE_GPU_MEMORY")


@dataclass
class Server:
    """One vLLM server: where it listens, how it was started, its log."""

    name: str
    host: str
    blocks: int
    connector: dict | None  # kv_connector_extra_config; None = plain vLLM
    log: Path
    max_len: int | None = None  # --max-model-len; default: the whole pool but vLLM's null block
    args: tuple[str, ...] = ()  # more vLLM flags
    proc: subprocess.Popen | None = None
    env: dict[str, str] | None = None  # more environment (the state pull's UCX_* settings)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{API_PORT}"

    @property
    def address(self) -> str:
        return f"{self.host}:{API_PORT}"

    def argv(self, model: Path) -> list[str]:
        argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", "tiny",
            "--host", self.host, "--port", str(API_PORT),
            "--dtype", "bfloat16", "--enforce-eager", "--seed", "0",
            "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(self.blocks),
            "--max-model-len", str(self.max_len or (self.blocks - 1) * BLOCK), "--max-num-seqs", "8",
            "--enable-prompt-tokens-details", "--enable-prefix-caching", *self.args,
        ]
        if GPU_MEMORY:
            argv += ["--gpu-memory-utilization", GPU_MEMORY]
        if self.connector is not None:
            extra = dict(self.connector)
            extra.setdefault("residency_port", RESIDENCY_PORT)
            extra.setdefault("residency_host", self.host)
            argv += ["--kv-transfer-config", json.dumps({
                "kv_connector": "TetherConnector", "kv_connector_module_path": "tether_vllm",
                "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": extra})]
        return argv

    def start(self, model: Path) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_LOGGING_LEVEL="INFO", OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1",
                   **(self.env or {}))
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(self.argv(model), stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """The whole process group (API server, engine core, worker)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL to the group: a crash, not a shutdown."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    # ---- what the engine says -------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """vLLM's own Prometheus counters (summed over label sets)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for m in re.finditer(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
        return out

    def load(self, tries: int = 3) -> dict:
        """The connector's residency endpoint (``/load``).

        Tried up to ``tries`` times: the listener serves one connection at a time and closes
        one that sends nothing within a second, and on a saturated 2-core CI box this test
        process was once descheduled that long between connect and send (RemoteDisconnected).
        """
        for attempt in range(tries):
            try:
                url = f"http://{self.host}:{RESIDENCY_PORT}/load"
                with urllib.request.urlopen(url, timeout=10) as r:
                    return json.load(r)
            except (ConnectionError, urllib.error.URLError, TimeoutError):
                if attempt + 1 == tries:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable: the last try raises")


def post(base: str, path: str, body: dict, headers: dict | None = None, timeout: float = 300) -> dict:
    req = urllib.request.Request(f"{base}{path}", json.dumps(body).encode(),
                                 {"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = json.load(r)
            out["_headers"] = dict(r.headers)
            return out
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path}: HTTP {e.code}: {e.read()[:2000]!r}") from None


def wait_ready(servers: list[Server]) -> None:
    """Until every server answers ``/health``; one that exits or is not ready within
    ``START_S`` fails the test with its log tail."""
    deadline = time.monotonic() + START_S
    waiting = list(servers)
    while waiting:
        for s in list(waiting):
            if not s.alive():
                pytest.fail(f"vLLM {s.name} exited at start:\n{s.tail()}")
            if s.ready():
                waiting.remove(s)
        if waiting and time.monotonic() > deadline:
            pytest.fail(f"vLLM {waiting[0].name} not ready after {START_S:.0f} s:\n{waiting[0].tail()}")
        time.sleep(0.5)


@contextlib.contextmanager
def serving(model: Path, servers: list[Server]) -> Iterator[list[Server]]:
    """Start every server at once; yield when all are ready; stop them all."""
    try:
        for s in servers:
            s.start(model)
        wait_ready(servers)
        yield servers
    finally:
        for s in servers:
            s.stop()


def restart(model: Path, server: Server) -> None:
    """Start a stopped or killed server again and wait until it serves."""
    server.start(model)
    wait_ready([server])
