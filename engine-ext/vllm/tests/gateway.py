"""Real Envoy with the built tether filter, for the tests that run the deployment chain:
the bootstrap rendered by ``tether gateway``, Envoy started against a deadline and
stopped by its guard. Needs ``make wasm``, ``make envoy-install`` and the ``tether``
CLI (``make test-vllm`` builds them first); a missing piece is a failure, never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def built(env: str, default: Path) -> Path:
    """A built artifact: ``$env`` or ``default``; missing fails the test."""
    p = Path(os.environ.get(env) or default)
    if not p.is_file():
        pytest.fail(f"{p} is missing ({env}); `make test-vllm` builds it first")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(work: str, ranks: str, plugin: dict, listen: int, admin: int, mode: str = "pick") -> Path:
    """``tether gateway --mode MODE`` for these rank addresses, with this plugin config."""
    plugin_path = Path(work, "plugin.json")
    plugin_path.write_text(json.dumps(plugin))
    bootstrap = Path(work, "envoy.yaml")
    wasm = built(
        "TETHER_FILTER_WASM", ROOT / "target/wasm32-wasip1/wasm-release/tether_filter.wasm"
    )
    subprocess.run(
        [
            str(built("TETHER_CLI", ROOT / "target/debug/tether")), "gateway",
            "--ranks", ranks,
            "--mode", mode,
            "--plugin-config", str(plugin_path),
            "--listen", f"127.0.0.1:{listen}",
            "--admin", f"127.0.0.1:{admin}",
            "--filter-wasm", str(wasm),
            "--output", str(bootstrap),
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    return bootstrap


@contextlib.contextmanager
def running(bootstrap: Path, admin: int, log: Path) -> Iterator[subprocess.Popen]:
    """Envoy on ``bootstrap``, ready (admin ``/ready`` says LIVE within 60 s), stopped
    on exit."""
    envoy = built("TETHER_ENVOY", ROOT / ".venv/bin/envoy")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(envoy), "-c", str(bootstrap), "--concurrency", "1", "-l", "warning",
             "--use-dynamic-base-id"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"envoy exited: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=2) as r:
                    if r.read().strip() == b"LIVE":
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("envoy not ready after 60 s")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
