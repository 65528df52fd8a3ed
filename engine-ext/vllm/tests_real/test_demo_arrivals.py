"""`make demo-vllm`'s simulator check replays the ranks at the arrivals the engine run saw
(``demo_vllm.as_sent``) and joins the two runs request by request through
``demo_vllm.replay_order``. Both rest on how the trace loader numbers requests; this checks
them against the loader itself (``tether trace synth`` prints requests in its order), on a
bundled trace with subagents whose arrivals are moved as a lagging engine run moves them."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import demo_vllm

ROOT = Path(__file__).resolve().parents[3]
CLI = os.environ.get("TETHER_CLI", str(ROOT / "target/debug/tether"))


def loader_order(trace: Path) -> list[tuple[str, str, int]]:
    out = subprocess.run([CLI, "trace", "synth", str(trace)], check=True, capture_output=True,
                         text=True).stdout
    rows = (json.loads(line) for line in out.splitlines() if line.strip())
    return [(r["session"], r["agent"], r["turn"]) for r in rows]


def identities(records: list[dict]) -> list[tuple[str, str, int]]:
    """(session, agent, turn within the agent) of every request, in file order."""
    turns: dict[tuple[str, str], int] = {}
    out = []
    for r in records:
        if r["type"] == "request":
            key = (r["session"], r["agent"])
            out.append((*key, turns.get(key, 0)))
            turns[key] = turns.get(key, 0) + 1
    return out


def sessions_slice(src: Path, n: int, out: Path) -> Path:
    return demo_vllm.slice_trace(src, n, 32, out)


def test_replay_order_is_the_loaders_and_as_sent_keeps_the_format(tmp_path):
    trace = sessions_slice(ROOT / "examples/traces/agent-subagents.jsonl", 6,
                           tmp_path / "slice.jsonl")
    records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    ids = identities(records)
    order = demo_vllm.replay_order(records)
    assert [ids[i] for i in order] == loader_order(trace)

    # An "engine run": every request sent after its trace time, by a lag that grows and
    # varies, as CPU engines behind the trace's clock do — enough to reorder sessions and
    # interleave agents differently.
    origin = min(r["start_ms"] for r in records if r["type"] == "session")
    starts = {r["id"]: r["start_ms"] for r in records if r["type"] == "session"}
    rng = random.Random(26)
    requests = [r for r in records if r["type"] == "request"]
    lag = {i: rng.uniform(0, 60_000) * (1 + i / 10) for i in range(len(requests))}
    due = {i: starts[r["session"]] + r["at_ms"] - origin for i, r in enumerate(requests)}
    engine_out = tmp_path / "engine"
    engine_out.mkdir()
    with (engine_out / "requests.jsonl").open("w") as f:
        for n, i in enumerate(order):
            f.write(json.dumps({"request": n, "sent_ms": due[i] + lag[i]}) + "\n")

    moved = demo_vllm.as_sent(trace, engine_out, tmp_path / "arrivals.jsonl")
    new = [json.loads(line) for line in moved.read_text().splitlines() if line.strip()]
    new_requests = [r for r in new if r["type"] == "request"]
    assert identities(new) == ids  # the same requests, in the same file positions
    new_order = demo_vllm.replay_order(new)
    assert new_order != order, "the lags should have renumbered some requests"
    assert [ids[i] for i in new_order] == loader_order(moved)
    last: dict[tuple[str, str], int] = {}
    for i, (old, r) in enumerate(zip(requests, new_requests)):
        assert r["at_ms"] >= old["at_ms"]  # never before its trace time
        assert abs(starts[r["session"]] + r["at_ms"] - origin - (due[i] + lag[i])) <= 1 or \
            r["at_ms"] == last.get((r["session"], r["agent"]))
        assert r["at_ms"] >= last.get((r["session"], r["agent"]), 0)
        last[(r["session"], r["agent"])] = r["at_ms"]

    # The join: rows keyed by replay number on either side land on the same file position.
    rows = {n: (requests[i]["input_tokens"], n) for n, i in enumerate(new_order)}
    joined = demo_vllm.by_file_position(rows, moved)
    assert all(joined[i][0] == requests[i]["input_tokens"] for i in joined)
