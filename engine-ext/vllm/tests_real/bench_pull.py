"""A state pull over NIXL/TCP loopback against recomputing the turn, on two real CPU engines
(``make bench-pull``; BENCHMARKS.md, "vLLM connector"; docs/vllm.md, "State pull (NIXL)").

**Engines.** Two ``vllm serve`` engines (the tiny Llama of ``tiny_model.py``, 64 blocks of
32 tokens, ``pull: true``): a holder ``pa`` and a new home ``pb``. For each turn size N
(whole blocks) and each repetition, two fresh sessions get turn 1 on ``pa`` (retained and
written through to its host tier), then turn 2 — the same prompt plus one token of reply
and a short message — goes to ``pb``: once with ``pull_from`` naming ``pa`` (pb READs the
blocks), once without (pb recomputes them); the order alternates between repetitions.
Per turn 2 (``max_tokens`` 1): the client's time to the answer; vLLM's own time to first
token and prefill time (``/metrics``: ``vllm:time_to_first_token_seconds``,
``vllm:request_prefill_time_seconds``); from ``pb``'s ``GET /stats`` the lease round trip
(``pull_lease_ms``) and the READ as the engine saw it (``pull_ms``: polled once per engine
step), bytes; from ``pa``'s, the time its scheduler hooks spent meanwhile. The first pull
of a run (it sets up the UCX connection) is reported apart; before it each engine serves
one prefix hit of its own (the first one took seconds: the CPU backend's first cached-prefix
prefill, not the pull).

**READ alone.** Two processes with the connector's own NIXL agent (``tether_vllm.pull.
Agent``: progress thread at 100 µs, the same UCX settings), no vLLM: one READ of N payloads
(one descriptor per block, as a pull posts it) busy-polled to completion, after a warm-up,
at the tiny model's 16 KiB blocks and at 2 MiB (a 16-token block of a Llama-3-8B-shaped
model: 32 layers × 8 KV heads × 128 × K and V × bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import tiny_model  # noqa: E402
from engines import BLOCK, Server, post, serving  # noqa: E402
from fleet import ask, marker, stats  # noqa: E402

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


ENGINE_TIMES = ("vllm:time_to_first_token_seconds_sum", "vllm:request_prefill_time_seconds_sum")


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
    a0, b0, m0 = stats(pa), stats(pb), pb.metrics()
    extra = {"pull_from": pa.address} if pull else {}
    wall, two = turn(pb, history, session, 2, **extra)
    a1, b1, m1 = stats(pa), stats(pb), pb.metrics()
    d = {k: b1.get(k, 0) - b0.get(k, 0) for k in ("pulled_blocks", "pulled_bytes", "pull_ms",
                                                 "pull_lease_ms", "pull_failed_blocks")}
    ttft, prefill = ((m1.get(k, 0) - m0.get(k, 0)) * 1000 for k in ENGINE_TIMES)
    return {"blocks": blocks, "pull": pull, "wall_ms": wall * 1000, "prompt": two.prompt,
            "cached": two.cached, **d, "ttft_ms": ttft, "prefill_ms": prefill,
            "holder_sched_us": a1["scheduler_us"] - a0["scheduler_us"]}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(rows: list[dict], cold: dict) -> str:
    lines = [
        "| turn | prompt tokens | blocks pulled | pulled: lease ms | READ ms (engine) "
        "| prefill ms (rest) | TTFT ms (vLLM) | client ms | recomputed: prefill ms "
        "| TTFT ms (vLLM) | client ms | prefill tokens/s | TTFT pulled / recomputed "
        "| holder scheduler µs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["blocks"] for r in rows}):
        p = [r for r in rows if r["blocks"] == n and r["pull"]]
        c = [r for r in rows if r["blocks"] == n and not r["pull"]]
        tok_s = median(c, "prompt") / (median(c, "prefill_ms") / 1000)
        lines.append(
            f"| {n} × 32 | {median(c, 'prompt'):.0f} | {median(p, 'pulled_blocks'):.0f} "
            f"| {median(p, 'pull_lease_ms'):.0f} | {median(p, 'pull_ms'):.0f} "
            f"| {median(p, 'prefill_ms'):.1f} | {median(p, 'ttft_ms'):.1f} "
            f"| {median(p, 'wall_ms'):.1f} | {median(c, 'prefill_ms'):.1f} "
            f"| {median(c, 'ttft_ms'):.1f} | {median(c, 'wall_ms'):.1f} | {tok_s:,.0f} "
            f"| {median(p, 'ttft_ms') / median(c, 'ttft_ms'):.2f} "
            f"| {median(p, 'holder_sched_us'):.0f} |"
        )
    lines.append("")
    lines.append(f"First pull of the run (UCX connection set-up): {cold['blocks']} blocks, "
                 f"lease {cold['pull_lease_ms']} ms, READ {cold['pull_ms']} ms, TTFT "
                 f"{cold['ttft_ms']:.1f} ms.")
    return "\n".join(lines)


# ---- READ alone ----------------------------------------------------------------------------


def _holder(conn, nbytes: int) -> None:
    import numpy as np
    from tether_vllm.pull import Agent

    buf = np.ones(nbytes, np.uint8)
    agent = Agent([(buf.ctypes.data, nbytes)])
    conn.send((agent.metadata, buf.ctypes.data))
    conn.recv()


def _reader(conn, nbytes: int, each: int, reps: int) -> None:
    import numpy as np
    from tether_vllm.pull import Agent

    dst = np.zeros(nbytes, np.uint8)
    agent = Agent([(dst.ctypes.data, nbytes)])
    md, addr = conn.recv()
    peer = agent.peer(md)
    n = nbytes // each
    local = [(dst.ctypes.data + i * each, each) for i in range(n)]
    remote = [(addr + i * each, each) for i in range(n)]
    times = []
    for i in range(reps + 1):  # the first sets up the connection
        t = time.perf_counter()
        h = agent.read(peer, local, remote, b"bench")
        while (state := agent.state(h)) == "PROC":
            time.sleep(50e-6)  # leave the CPU to the agents' threads (2 cores here)
        times.append(time.perf_counter() - t)
        agent.release(h)
        assert state == "DONE" and dst[-1] == 1, state
    conn.send(times[1:])


def raw_reads(sizes: list[int], reps: int) -> str:
    import multiprocessing as mp

    os.environ.update(UCX)
    ctx = mp.get_context("spawn")
    lines = ["| payload | blocks | bytes | READ ms (median) | GB/s |", "|---|---:|---:|---:|---:|"]
    for each, name in ((16 << 10, "16 KiB (tiny model, 32 tokens)"),
                       (2 << 20, "2 MiB (8B-shaped, 16 tokens)")):
        for n in sizes:
            a, b = ctx.Pipe()
            c, d = ctx.Pipe()
            holder = ctx.Process(target=_holder, args=(a, n * each))
            holder.start()
            md = b.recv()
            reader = ctx.Process(target=_reader, args=(c, n * each, each, reps))
            reader.start()
            d.send(md)
            times = d.recv()
            b.send("done")
            holder.join(10)
            reader.join(10)
            ms = statistics.median(times) * 1000
            lines.append(f"| {name} | {n} | {n * each:,} | {ms:.2f} | {n * each / ms / 1e6:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="8,24,56", help="turn sizes in whole blocks")
    ap.add_argument("--reps", type=int, default=7)
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
        for server in (pa, pb):  # each engine's first prefix hit (seconds on this CPU)
            warm = prompt_of(server, sizes[0], "warm-up")
            one = ask(server.url, "chat", warm, marker=marker("0000000000000fff"), n=1)
            ask(server.url, "chat", warm + [("assistant", one.text), ("user", "next")],
                marker=marker("0000000000000fff", 2), n=1)
        cold = one_pair(pa, pb, sizes[0], 999, True)
        for rep in range(args.reps):
            for n in sizes:
                for pull in ((True, False) if rep % 2 == 0 else (False, True)):
                    rows.append(one_pair(pa, pb, n, rep, pull))
    bad = [r for r in rows if r["pull"] and (r["pull_failed_blocks"] or r["pulled_blocks"] == 0)]
    (out / "rows.json").write_text(json.dumps({"cold": cold, "rows": rows}, indent=1))
    text = report(rows, cold) + "\n\nREAD alone:\n\n" + raw_reads(sizes, args.reps)
    if bad:
        text += f"\n\n{len(bad)} pulls did not load every block: {bad}"
    (out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
