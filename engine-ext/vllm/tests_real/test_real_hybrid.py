"""The hybrid config (issue 26): vLLM's CPU build executing a tiny Qwen3-Next model (Gated
DeltaNet linear attention beside full attention, ``tiny_hybrid.py``) with TetherConnector
on vLLM's hybrid KV cache allocator — KV and linear state restored from the host tier.

Two engines, each on its own loopback address (127.0.0.6–7, apart from
``test_real_engine``'s): ``h`` with TetherConnector (retention, a 64 MiB host tier, the
residency endpoint), ``q`` plain vLLM. vLLM raises the attention block size to 160 tokens so
that one attention page holds a DeltaNet layer's state (``Platform._align_hybrid_block_size``)
and snapshots the state at block boundaries (``--mamba-cache-mode align``, its default with
prefix caching), so every hit, device or host, is a whole number of 160-token blocks.
"""

from __future__ import annotations

import pytest
import tiny_hybrid
from engines import Server, serving
from fleet import ask, marker, stats

BLOCK = 160  # the attention block size vLLM picks for tiny_hybrid (logged at start)
BLOCKS = 16  # KV blocks per engine: one flood request needs nearly all of them
SYSTEM = "the quick brown fox jumps over the lazy dog " * 60
FIRST = "def main():\n    return run(tool_call, result)\n"
# How far plain vLLM's cold prefill of a hybrid model sits from its own prefix hit (0.14 seen).
HYBRID_COLD_TOL = 0.3
TOOL = '{"name": "read_file", "arguments": {"path": "src/lib.rs"}}'


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    work = tmp_path_factory.mktemp("real-hybrid")
    model = tiny_hybrid.make(work / "model")
    # vLLM keeps state pages beside the attention blocks: 13 of 16 blocks serve one request.
    length = (BLOCKS - 3) * BLOCK
    servers = [
        Server("h", "127.0.0.6", BLOCKS, {"host_bytes": 1 << 26}, work / "h.log", max_len=length),
        Server("q", "127.0.0.7", BLOCKS, None, work / "q.log", max_len=length),
    ]
    with serving(model, servers):
        yield servers


def flood(server: Server, tag: str) -> None:
    """Two one-off prompts of about ``BLOCKS - 4`` blocks each (4 tokens per repeat): plain
    prefix caching loses everything else, and retentions yield to the host tier."""
    words = "agent tool call result " * ((BLOCKS - 4) * BLOCK // 4)
    for i in range(2):
        ask(server.url, "chat", [("user", f"{tag} {i} {words}")], n=2)


def test_a_hybrid_host_restore_answers_exactly_as_a_device_hit_and_agrees_with_a_cold_prefill(engines):
    """Turn 1 on h and q; turn 2 on q hits its prefix cache (KV and state snapshot); h is
    flooded and restores turn 1 from its host tier — its KV blocks and the state page at
    their end; q is flooded and prefills turn 2 cold. The restore is bit-exact with the hit;
    the cold prefill has the same text, logprobs within HYBRID_COLD_TOL."""
    h, q = engines
    session = "0000000000000300"
    first = [("system", SYSTEM), ("user", FIRST)]
    one_h = ask(h.url, "chat", first, marker=marker(session))
    one_q = ask(q.url, "chat", first)
    assert one_h.same_as(one_q), (one_h, one_q)
    history = first + [("assistant", one_h.text), ("user", TOOL)]

    hit = ask(q.url, "chat", history)
    # The last state snapshot vLLM keeps for turn 1 is at a block boundary of its prompt
    # and reply: at least two blocks to resume from.
    assert hit.cached % BLOCK == 0 and hit.cached >= 2 * BLOCK, hit

    flood(h, "hybrid-h")
    before, hits = stats(h), h.metrics()["vllm:external_prefix_cache_hits_total"]
    assert before["yielded_to_host"] > 0, before
    restored = ask(h.url, "chat", history, marker=marker(session, 2))
    after = stats(h)
    assert restored.cached == hit.cached, (restored, hit)
    # Every attention block of the hit and one state page (one state group) came from host.
    assert after["loaded_blocks"] - before["loaded_blocks"] == hit.cached // BLOCK + 1, (before, after)
    assert after["load_failed_blocks"] == before["load_failed_blocks"]
    assert h.metrics()["vllm:external_prefix_cache_hits_total"] - hits == hit.cached
    assert after["no_snapshot"] == 0, after

    flood(q, "hybrid-q")
    cold = ask(q.url, "chat", history)
    assert cold.cached == 0, "plain vLLM kept the prefix through the flood: no pressure"

    assert restored.same_as(hit), (restored, hit)
    # Plain vLLM against itself: a hit resumes from the state snapshot vLLM cached, a cold
    # prefill runs the recurrence through the prompt. Same text; logprobs apart by 0.14
    # at most here (the snapshot's precision is the suspect, not verified) — far beyond
    # attention's float error, so only HYBRID_COLD_TOL is asked. The restore is bit-exact.
    assert cold.text == hit.text and cold.gap(hit) <= HYBRID_COLD_TOL, (cold.gap(hit), cold, hit)
    assert len(hit.logprobs) == 12
