"""The real engine's speed, measured, as a ``tether-rank`` profile (docs/profile.md).

The simulator check (``demo_vllm.py --check-sim``) replays one trace through the CPU
engines and through ``tether-rank``. Which blocks an LRU cache holds when a turn returns
depends on timing: what else ran meanwhile, what was still running (a running request's
blocks cannot be evicted), and how far the closed-loop client fell behind the trace's
clock. A ``tether-rank`` timed by an H200 profile finishes a 14 K-token prefill in 0.1 s
where the CPU engine takes seconds, so the two see other interleavings and, under LRU,
other evictions. Timed by the engine's own measured speed they see the same ones.

What is measured, on one idle engine (the other engines idle too):

- prefill: lone greedy requests of one output token over prompts that share no prefix
  with anything cached, at lengths up to the trace's longest prompts; the point is the
  request's end-to-end time (HTTP and detokenization included, a few ms);
- decode: ``batch`` concurrent requests of one and of ``1 + STEPS`` output tokens
  (``ignore_eos``) over fresh prompts of one context length; a step's time is the
  difference over ``STEPS``.

Assumptions, stated in the report: the engines of the check share this machine's cores,
so an engine runs slower while another is busy than it did here; the curve is a median of
``REPEATS`` and the machine is noisy.
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from engines import Server
from fleet import ask
from tiny_model import SYNTH_ALPHABET

# Up to the longest prompt of the check (the trace's turns reach 30 K tokens): tether-rank
# charges a prefill after a cached prefix by the curve's marginal (ttft(c + n) − ttft(c)),
# so the curve must reach the contexts the trace's prompts reach.
PREFILL_LENGTHS = (128, 512, 2048, 8000, 16000, 30000)
# Context → batches; every batch × context within the KV pool (32 K tokens), so nothing
# is preempted while it is measured.
DECODE = {512: (1, 4, 8), 3000: (1, 4, 8), 12000: (1, 2)}
STEPS = 32
REPEATS = 3


class Words:
    """Fresh prompts: seeded random words of the word-level tokenizer's vocabulary (one
    word, one token), so no two prompts share a first block."""

    def __init__(self, seed: int = 2026) -> None:
        self.rng = random.Random(seed)
        self.vocab = [a + b for a in SYNTH_ALPHABET for b in SYNTH_ALPHABET]

    def prompt(self, tokens: int) -> list[tuple[str, str]]:
        return [("user", " ".join(self.rng.choices(self.vocab, k=tokens)))]


def _timed(server: Server, history: list[tuple[str, str]], n: int) -> tuple[float, int]:
    """Milliseconds for one greedy request of exactly ``n`` output tokens; its prompt tokens."""
    t = time.perf_counter()
    a = ask(server.url, "chat", history, n=n, extra={"ignore_eos": True})
    return (time.perf_counter() - t) * 1000, a.prompt


def prefill_points(server: Server, words: Words, longest: int) -> list[dict]:
    """Lone cold prefills of the lengths that fit ``longest`` tokens (template included)."""
    points = []
    for length in (n for n in PREFILL_LENGTHS if n + 64 <= longest):
        runs = [_timed(server, words.prompt(length), 1) for _ in range(REPEATS)]
        points.append({"isl": runs[0][1], "ttft_ms": round(statistics.median(ms for ms, _ in runs), 3)})
    return points


def decode_points(server: Server, words: Words) -> list[dict]:
    points = []
    with ThreadPoolExecutor(max(max(b) for b in DECODE.values())) as pool:
        for context, batches in DECODE.items():
            for batch in batches:
                steps = []
                for _ in range(REPEATS):
                    times = {}
                    for n in (1, 1 + STEPS):
                        prompts = [words.prompt(context) for _ in range(batch)]
                        t = time.perf_counter()
                        list(pool.map(lambda h, n=n: _timed(server, h, n), prompts))
                        times[n] = (time.perf_counter() - t) * 1000
                    steps.append(max(times[1 + STEPS] - times[1], 0.0) / STEPS)
                itl = max(statistics.median(steps), 0.01)
                points.append({"context": context, "batch": batch, "itl_ms": round(itl, 3)})
    return points


def profile(server: Server, base: dict, kv_tokens: int, max_len: int) -> dict:
    """``base`` (the KV bytes per token, prices and restore bandwidth the check keeps) with
    the engine's measured prefill and decode curves, capacity and length limit."""
    words = Words()
    prefill = prefill_points(server, words, min(kv_tokens, max_len))
    decode = decode_points(server, words)
    out = dict(base)
    out.update({
        "name": "tiny-llama-cpu-measured",
        "model": "tiny",
        "gpu": "CPU (this machine)",
        "max_kv_tokens": kv_tokens,
        "max_model_len": max_len,
        "prefill": {"points": prefill},
        "decode": {"points": decode},
        "sources": ["measured by engine-ext/vllm/tests_real/calibrate.py on one idle CPU vLLM"
                    " engine serving the tiny Llama (medians of 3)"],
        "notes": "Timing only; KV bytes per token, price and restore bandwidth are the base"
                 f" profile's ({base['name']}).",
    })
    return out
