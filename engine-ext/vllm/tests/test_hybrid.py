"""TetherConnector with a hybrid model (attention + linear-state groups) on vLLM 0.33's
real scheduler (hybrid allocator, ``mamba_cache_mode="align"``) and worker glue (CPU).

``harness.Engine(hybrid=True)``: two attention layers (group 0) and two linear-attention
layers (group 1, a conv state and a recurrent state per block, padded to the attention
page and overlaying its memory, as vLLM lays them out). The fake forward writes
deterministic KV and, at every chunk end, a deterministic state; an admitted request
that resumes is checked at every attended KV position and at every element of the
state it resumes from (``mismatched_positions``, ``mismatched_states``).
"""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from harness import STATE_DTYPES, STATE_SHAPES, Engine, expected_state, prefix_hashes
from test_connector import BS, flood, tether, tokens
from tether_vllm.connector import TetherConnector, _classify_groups, _group_hash


def _hybrid(connector="TetherConnector", **kw) -> Engine:
    kw.setdefault("extra", {"host_bytes": 0})
    return Engine(connector=connector, hybrid=True, num_blocks=40, **kw)


def test_a_hybrid_turn_survives_a_flood_and_resumes_bit_exact():
    results = {}
    for name, connector in [("plain", None), ("tether", "TetherConnector")]:
        e = _hybrid(connector)
        first = tokens(1, 5 * BS + 3)
        out = e.serve("h1", first, tether("hy"), max_tokens=2)
        flood(e, 3, 28 * BS)
        before = e.stats.cached_tokens
        second = first + out + tokens(2, 20)
        req = e.add("h2", second, tether("hy"))
        e.run()
        results[name] = e.stats.cached_tokens - before
        assert e.mismatched_positions == 0, name
        assert e.mismatched_states == 0, name
        if connector is not None:
            # The retention: 5 attention blocks and the state snapshot at token 80.
            c = e.sched_connector
            assert c.connector_stats()["no_snapshot"] == 0
            # Read the resumed state back through the layer views, element by element.
            pool = e.scheduler.kv_cache_manager.block_pool
            block = pool.get_cached_block(req.block_hashes[4], [1])
            assert block is not None
            want = expected_state(prefix_hashes(second)[5 * BS - 1])
            for layer, view in enumerate(e.state_layers):
                assert torch.equal(view[block[0].block_id, 0, 0, :], want[layer])
    assert results["plain"] == 0, results
    # The first turn ended mid-block (83 prompt + 2 output tokens): the next turn
    # resumes from the last block boundary with a snapshot and recomputes the rest.
    assert results["tether"] == 5 * BS, results


def test_a_mid_block_return_recomputes_only_past_the_last_snapshot():
    e = _hybrid()
    first = tokens(3, 7 * BS + 9)
    out = e.serve("m1", first, tether("mid"), max_tokens=3)
    # Floods that fit beside the retention (40 blocks): they evict everything else.
    flood(e, 3, 24 * BS)
    second = first + out + tokens(4, 2 * BS + 5)
    computed = e.stats.computed_tokens
    cached = e.stats.cached_tokens
    e.serve("m2", second, tether("mid"))
    assert e.stats.cached_tokens - cached == 7 * BS
    assert e.stats.computed_tokens - computed == len(second) - 7 * BS
    assert (e.mismatched_positions, e.mismatched_states) == (0, 0)
    # The next turn supersedes the first one's retention and resumes at its own end.
    held = e.sched_connector.ledger.held_blocks
    flood(e, 3, 24 * BS, start=2000)
    third = second + e.finished["m2"] + tokens(5, 7)
    cached = e.stats.cached_tokens
    e.serve("m3", third, tether("mid"))
    assert e.stats.cached_tokens - cached == (len(second) // BS) * BS
    assert held == len(second) // BS + 1
    assert e.sched_connector.ledger.stats()["superseded"] >= 1
    assert (e.mismatched_positions, e.mismatched_states) == (0, 0)


def test_without_a_host_tier_a_hybrid_retention_under_pressure_is_dropped():
    # With no host tier (host_bytes 0) a retention that must yield is dropped (counted),
    # and the returning turn is recomputed, never resumed from a missing snapshot.
    e = _hybrid()
    first = tokens(9, 7 * BS + 9)
    out = e.serve("d1", first, tether("drop"), max_tokens=3)
    assert e.sched_connector.ledger.held_blocks == 8
    flood(e, 3, 30 * BS)
    assert e.sched_connector.ledger.held_blocks == 0
    assert e.sched_connector.ledger.stats()["dropped"] == 1
    cached = e.stats.cached_tokens
    e.serve("d2", first + out + tokens(10, 9), tether("drop"))
    assert e.stats.cached_tokens == cached
    assert (e.mismatched_positions, e.mismatched_states) == (0, 0)


def test_the_state_check_catches_a_wrong_snapshot():
    # The harness check has teeth: overwrite the retained snapshot and the resuming
    # request is counted as having read wrong state.
    e = _hybrid()
    first = tokens(7, 4 * BS + 2)
    out = e.serve("w1", first, tether("wrong"), max_tokens=2)
    pool = e.scheduler.kv_cache_manager.block_pool
    held = [b for b in pool.blocks if b.ref_cnt > 0 and not b.is_null]
    group1 = (1).to_bytes(4, "big")
    states = [b for b in held if b.block_hash is not None and b.block_hash[-4:] == group1]
    assert len(states) == 1
    for view in e.state_layers:
        view[states[0].block_id, 0, 0, 0] += 1
    e.serve("w2", first + out + tokens(8, 5), tether("wrong"))
    assert e.mismatched_states == 1


class _LoadsWithoutState(TetherConnector):
    """A wrong connector: claims 4 blocks from outside and restores no state."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return (4 * BS - num_computed_tokens if request.request_id == "x" else 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return


def test_a_hit_without_its_state_is_caught():
    # What "never report a hit past the last snapshot" guards against: vLLM resumes
    # the linear layers from an unrestored state block, and the harness counts it.
    e = _hybrid("_LoadsWithoutState", module_path=__name__)
    e.serve("x", tokens(11, 5 * BS + 3))
    assert e.stats.cached_tokens == 4 * BS
    assert e.mismatched_states == 1


def _host_engine() -> Engine:
    # Retentions may hold a quarter of the pool: the floods below make the session's
    # retention yield to the host tier and evict its blocks from vLLM's prefix cache.
    return _hybrid(extra={"host_bytes": 1 << 22, "max_device_fraction": 0.25})


def test_a_hybrid_turn_evicted_to_host_is_restored_bit_exact():
    e = _host_engine()
    first = tokens(31, 5 * BS + 3)
    out = e.serve("r1", first, tether("host"), max_tokens=2)
    assert e.worker.stats["saved_blocks"] == 6  # 5 attention blocks + 1 state page
    flood(e, 3, 33 * BS)
    assert e.sched_connector.ledger.held_blocks == 0
    second = first + out + tokens(32, 20)
    cached = e.stats.cached_tokens
    req = e.add("r2", second, tether("host"))
    e.run()
    assert e.worker.stats["loaded_blocks"] == 6
    # Admitted at token 80 (so the fake forward checked the state it resumed from).
    assert e.stats.cached_tokens - cached == 5 * BS
    assert e.worker.stats["load_failed_blocks"] == 0
    # Resumed at the 80-token snapshot: KV at every position and every state element
    # were checked by the fake forward; read the restored state back, too.
    assert (e.mismatched_positions, e.mismatched_states) == (0, 0)
    block = e.scheduler.kv_cache_manager.block_pool.get_cached_block(req.block_hashes[4], [1])
    assert block is not None
    want = expected_state(prefix_hashes(second)[5 * BS - 1])
    for layer, view in enumerate(e.state_layers):
        assert torch.equal(view[block[0].block_id, 0, 0, :], want[layer])


def test_a_corrupt_state_payload_is_recomputed_and_counted():
    e = _host_engine()
    first = tokens(41, 5 * BS + 3)
    req = e.add("c1", first, tether("badstate"))
    e.run()
    state_hash = _group_hash(1, req.block_hashes[4])
    assert e.worker.copiers[1].corrupt(state_hash)
    flood(e, 3, 33 * BS)
    second = first + e.finished["c1"] + tokens(42, 9)
    computed = e.stats.computed_tokens
    e.serve("c2", second, tether("badstate"))
    assert e.worker.stats["load_failed_blocks"] == 1
    # The whole turn was recomputed (a failed receive restarts from the device hit, 0
    # here), never run on the corrupt state.
    assert e.stats.computed_tokens - computed == len(second)
    assert (e.mismatched_positions, e.mismatched_states) == (0, 0)
    # The scheduler forgot the corrupt payload; the recomputed turn was written through
    # again and a third visit restores it cleanly.
    flood(e, 3, 33 * BS, start=2000)
    loaded = e.worker.stats["loaded_blocks"]
    e.serve("c3", second + e.finished["c2"] + tokens(43, 5), tether("badstate"))
    assert e.worker.stats["loaded_blocks"] - loaded >= 6
    assert e.worker.stats["load_failed_blocks"] == 1
    assert (e.mismatched_positions, e.mismatched_states) == (0, 0)


def test_a_state_view_of_the_wrong_size_is_refused_naming_the_layer():
    e = _hybrid()
    bad = dict(e.kv)
    name = e.state_names[1]
    bad[name] = bad[name][..., :-2]
    with pytest.raises(ValueError, match=f"state layer {name}"):
        e.worker.register_kv_caches(bad)


def _state_spec(mode="align", block_size=BS) -> MambaSpec:
    return MambaSpec(
        block_size=block_size, shapes=STATE_SHAPES, dtypes=STATE_DTYPES, mamba_cache_mode=mode
    )


_ATTN = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "second, match",
    [
        (_state_spec(mode="none"), "mamba_cache_mode is 'none'"),
        (_state_spec(block_size=2 * BS), "block size 32 differs"),
        (
            SlidingWindowSpec(
                block_size=BS, num_kv_heads=2, head_size=16, dtype=torch.bfloat16, sliding_window=64
            ),
            "unknown state layout",
        ),
    ],
    ids=["not-align", "block-size", "sliding-window"],
)
def test_an_unknown_state_layout_is_refused_at_start(second, match):
    cfg = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["attn"], _ATTN), KVCacheGroupSpec(["state"], second)],
    )
    with pytest.raises(ValueError, match=match):
        _classify_groups(cfg, BS)


def test_a_model_with_only_linear_state_is_refused():
    cfg = KVCacheConfig(
        num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["s"], _state_spec())]
    )
    with pytest.raises(ValueError, match="only linear-state layers"):
        _classify_groups(cfg, BS)
