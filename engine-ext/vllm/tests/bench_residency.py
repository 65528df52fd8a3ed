"""What one residency-endpoint reply costs at N retained sessions (docs/vllm.md,
"Residency endpoint"): the reply's bytes and the time ``load_report`` takes, on the
native ledger alone (no vLLM). Run with the wheel ``make vllm-wheel`` builds (release):

    .venv/bin/python engine-ext/vllm/tests/bench_residency.py [sessions] [reports]
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time

from tether_vllm import Ledger, load_report, parse_marker, read_load_report


def main(sessions: int = 10_000, reports: int = 50) -> None:
    ledger = Ledger(16, 4 * sessions + 16, 1024, 0, max_interval_ms=10**9)
    for i in range(sessions):
        session = hashlib.sha256(str(i).encode()).hexdigest()[:32]
        marker = parse_marker({"session": session, "prompt_end": "1", "turn_kind": "tool"})
        hashes = [hashlib.sha256(f"{i}-{j}".encode()).digest() for j in range(2)]
        ledger.retain(marker, hashes, [2 * i, 2 * i + 1], 0)
    load = dict(
        dp_rank=0, running=3, waiting=1, restoring=0, queued_prefill_tokens=1234,
        kv_usage=0.5, kv_blocks=4 * sessions + 16, uptime_ms=1000.0,
    )
    times = []
    for _ in range(reports):
        t = time.perf_counter()
        body = load_report(ledger, **load)
        times.append(time.perf_counter() - t)
    listed = len(read_load_report(body)["residency"]["entries"])
    print(
        f"{sessions} retained sessions: {listed} entries, reply {len(body)} bytes, "
        f"load_report median {statistics.median(times) * 1000:.2f} ms over {reports}"
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
