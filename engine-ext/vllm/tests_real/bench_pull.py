"""A state pull over NIXL/TCP loopback against recomputing the turn, on two real CPU engines
(``make bench-pull``; BENCHMARKS.md, "vLLM connector"; docs/vllm.md, "State pull (NIXL)").

Two ``vllm serve`` engines (the tiny Llama of ``tiny_model.py``, 64 blocks of 32 tokens,
``pull: true``): a holder ``pa`` and a new home ``pb``. For each turn size N (whole blocks)
and each repetition, two fresh sessions get turn 1 on ``pa`` (retained and written through
to its host tier), then turn 2 — the same prompt plus one token of reply and a short
message — goes to ``pb``: once with ``pull_from`` naming ``pa`` (pb READs the N blocks),
once without (pb recomputes them). The order alternates between repetitions. Measured per
turn 2 (``max_tokens`` 1, so the request's time is its time to first token): the wall time
of the request on ``pb``, and from ``pb``'s ``GET /stats`` the READ's own time (``pull_ms``)
and bytes; from ``pa``'s, the time its scheduler hooks spent meanwhile (``scheduler_us``).
The first pull of a run (it sets up the UCX connection) is reported apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import tiny_model
from engines import BLOCK, Server, post, serving
from fleet import ask, marker, stats

UCX = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
WORDS = "agent session state moves with its turn over the wire ".split()


def prompt_of(server: Server, blocks: int, tag: str) -> list[tuple[str, str]]:
    """A system prompt whose chat-templated turn 2 holds ``blocks`` whole blocks before
    its last few tokens (found with vLLM's ``/tokenize``)."""
    def tokens(n: int) -> int:
        text = f"{tag} " + " ".join(WORDS[i % len(WORDS)] for i in range(n))
        r = post(server.url, "/tokenize", {"model": "tiny", "add_generation_prompt": True,
                                          "messages": [{"role": "system", "content": text}]})
        return r["count"]

    lo, hi = 1, blocks * BLOCK
    while lo < hi:  # the most words whose prompt stays within `blocks` blocks
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if tokens(mid) <= blocks * BLOCK else (lo, mid - 1)
    text = f"{tag} " + " ".join(WORDS[i % len(WORDS)] for i in range(lo))
    return [("system", text)]


def turn(server: Server, history, session: str, n: int, **extra) -> tuple[float, object]:
    m = dict(marker(session, n), **extra)
    t = time.perf_counter()
    a = ask(server.url, "chat", history, marker=m, n=1)
    return time.perf_counter() - t, a


def one_pair(pa: Server, pb: Server, blocks: int, rep: int, pull: bool) -> dict:
    """Turn 1 on pa, then turn 2 on pb, pulled or recomputed."""
    tag = f"{'pull' if pull else 'recompute'}-{blocks}-{rep}"
    session = f"{blocks:04x}{rep:04x}{int(pull):08x}"
    first = prompt_of(pa, blocks, tag)
    saved = stats(pa)["saved_blocks"]
    _, one = turn(pa, first, session, 1)
    deadline = time.monotonic() + 10
    while stats(pa)["saved_blocks"] == saved:  # written through in the step after
        assert time.monotonic() < deadline
        time.sleep(0.02)
    history = first + [("assistant", one.text), ("user", "next")]
    a0, b0 = stats(pa), stats(pb)
    extra = {"pull_from": pa.address} if pull else {}
    wall, two = turn(pb, history, session, 2, **extra)
    a1, b1 = stats(pa), stats(pb)
    d = {k: b1.get(k, 0) - b0.get(k, 0) for k in ("pulled_blocks", "pulled_bytes", "pull_ms",
                                                 "pull_failed_blocks")}
    return {"blocks": blocks, "pull": pull, "wall_ms": wall * 1000, "prompt": two.prompt,
            "cached": two.cached, **d,
            "holder_sched_us": a1["scheduler_us"] - a0["scheduler_us"]}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(rows: list[dict], cold: dict) -> str:
    lines = [
        "| turn (blocks × 32 tokens) | prompt tokens | pulled: TTFT ms | READ ms | READ MB/s "
        "| recomputed: TTFT ms | prefill tokens/s | TTFT pull / recompute | holder scheduler µs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["blocks"] for r in rows}):
        p = [r for r in rows if r["blocks"] == n and r["pull"]]
        c = [r for r in rows if r["blocks"] == n and not r["pull"]]
        read_ms = median(p, "pull_ms")
        mb_s = median(p, "pulled_bytes") / 1e6 / (read_ms / 1000) if read_ms else float("nan")
        tok_s = median(c, "prompt") / (median(c, "wall_ms") / 1000)
        lines.append(
            f"| {n} | {median(c, 'prompt'):.0f} | {median(p, 'wall_ms'):.1f} | {read_ms:.1f} "
            f"| {mb_s:.1f} | {median(c, 'wall_ms'):.1f} | {tok_s:,.0f} "
            f"| {median(p, 'wall_ms') / median(c, 'wall_ms'):.2f} "
            f"| {median(p, 'holder_sched_us'):.0f} |"
        )
    lines.append("")
    lines.append(f"First pull of the run (UCX connection set-up): {cold['blocks']} blocks, "
                 f"TTFT {cold['wall_ms']:.1f} ms, READ {cold['pull_ms']} ms.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="8,24,56", help="turn sizes in whole blocks")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="target/bench-pull")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = tiny_model.make(out / "model")
    tether = {"host_bytes": 1 << 28, "pull": True}
    pa = Server("pa", "127.0.0.8", 64, tether, out / "pa.log", env=UCX)
    pb = Server("pb", "127.0.0.9", 64, tether, out / "pb.log", env=UCX)
    sizes = [int(x) for x in args.blocks.split(",")]
    rows = []
    with serving(model, [pa, pb]):
        cold = one_pair(pa, pb, sizes[0], 999, True)
        for rep in range(args.reps):
            for n in sizes:
                for pull in ((True, False) if rep % 2 == 0 else (False, True)):
                    rows.append(one_pair(pa, pb, n, rep, pull))
    bad = [r for r in rows if r["pull"] and (r["pull_failed_blocks"] or r["pulled_blocks"] == 0)]
    (out / "rows.json").write_text(json.dumps({"cold": cold, "rows": rows}, indent=1))
    text = report(rows, cold)
    if bad:
        text += f"\n\n{len(bad)} pulls did not load every block: {bad}"
    (out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
