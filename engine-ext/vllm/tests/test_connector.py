"""TetherConnector against vLLM 0.33's real scheduler and worker glue (CPU).

Every test runs through ``harness.Engine``: vLLM's ``Scheduler``, KV views from
``allocate_kv_cache``, the connector built by ``KVConnectorFactory``, metadata pickled
between the sides, and a fake forward that checks every attended position's KV.
"""

from __future__ import annotations

import hashlib
import pickle

import pytest
import torch

from harness import Engine, expected_kv, prefix_hashes
from tether_vllm import CallerError, parse_marker
from tether_vllm.connector import TetherConfig, TetherConnector, TetherMetadata

BS = 16


def sid(name: str) -> str:
    """A session id in the wire grammar (hex), derived from a readable name."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def tether(session: str, kind: str = "user", **extra) -> dict:
    return {"tether": {"session": sid(session), "prompt_end": "1", "turn_kind": kind, **extra}}


def tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 997 + 1 for i in range(n)]


def flood(e: Engine, count: int, n_tokens: int, start: int = 1000) -> None:
    """One-off requests with no markers, run one at a time (plain prefix-cache traffic)."""
    for i in range(count):
        e.serve(f"flood-{start + i}", tokens(start + i, n_tokens))


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC", "LHBNC"])
def test_restore_is_bit_exact_at_every_position_after_eviction(layout):
    # 24 blocks (23 usable), retention may hold at most 25 % of them: the flood makes
    # the session's retention yield to the host tier, then the session returns.
    e = Engine(
        extra={"host_bytes": 1 << 22, "max_device_fraction": 0.25},
        num_blocks=24,
        layout=layout,
    )
    first = tokens(1, 5 * BS + 3)
    out = e.serve("a1", first, tether("a"), max_tokens=2)
    assert e.sched_connector.ledger.held_blocks == 5
    # Each flood request needs 20 of the 23 blocks: the retention yields (its turn is
    # on the host tier) and the flood evicts the session's blocks from the prefix cache.
    flood(e, 3, 20 * BS)
    assert e.sched_connector.ledger.held_blocks == 0
    second = first + out + tokens(2, 20)
    assert e.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() > 0
    before = e.worker.stats["loaded_blocks"]
    e.serve("a2", second, tether("a"))
    loaded = e.worker.stats["loaded_blocks"] - before
    assert loaded >= 5, f"{layout}: the returning turn was not restored from host ({loaded})"
    # The fake forward compared every attended position with its expected KV; the
    # restored blocks, read back through the layer views, hold the first turn's KV.
    assert e.mismatched_positions == 0
    blocks = e.restored_blocks["a2"]
    exp = expected_kv(prefix_hashes(second)[: len(blocks) * BS])
    for layer, view in enumerate(e.layers):
        got = view[blocks].permute(0, 2, 1, 3).reshape(len(blocks) * BS, *exp.shape[2:])
        assert torch.equal(got, exp[:, layer]), f"{layout}: layer {layer}"


def _race_engine() -> Engine:
    return Engine(
        extra={"host_bytes": 1 << 22, "max_device_fraction": 1.0, "free_watermark": 0.0},
        num_blocks=24,
    )


def _race(e: Engine) -> None:
    """A finishes (its blocks to save), and in the very next schedule B needs nearly the
    whole pool: A's retention yields under pressure while A's save is still queued."""
    a = tokens(11, 5 * BS + 4)
    e.add("a1", a, tether("race"), max_tokens=1)
    while "a1" not in e.finished:
        e.step()
    e.add("b1", tokens(12, 22 * BS - 1))  # every usable block
    e.run()
    # A returns after B: its device copy is gone (B took the blocks), so the turn is
    # restored from the host tier — whatever the save captured.
    e.serve("a2", a + e.finished["a1"] + tokens(13, 8), tether("race"))


def test_free_is_delayed_until_the_save_ran():
    e = _race_engine()
    _race(e)
    # B evicted (nearly) all of A's blocks: A's turn came back from the host tier.
    assert e.worker.stats["loaded_blocks"] >= 3
    assert e.mismatched_positions == 0


class _FreesEarly(TetherConnector):
    """The bug the delay prevents: let vLLM free a request's blocks before the save."""

    def request_finished_all_groups(self, request, block_ids):
        delay, params = super().request_finished_all_groups(request, block_ids)
        if delay:
            self._saving.discard(request.request_id)
        return False, params

    def get_finished(self, finished_req_ids):
        self._sent.clear()  # nothing is waiting for the save any more
        return None, None


def test_the_race_test_fails_when_the_free_is_not_delayed():
    # Proves the scenario above has teeth: without the delay, B overwrites A's blocks
    # before the save reads them, and the restored turn is wrong.
    e2 = Engine(
        connector="_FreesEarly",
        extra={"host_bytes": 1 << 22, "max_device_fraction": 1.0, "free_watermark": 0.0},
        num_blocks=24,
        module_path=__name__,
    )
    _race(e2)
    assert e2.worker.stats["loaded_blocks"] >= 3
    assert e2.mismatched_positions > 0


def test_retention_expires_after_its_interval():
    e = Engine(extra={"host_bytes": 0}, num_blocks=32)
    e.serve("a1", tokens(3, 4 * BS + 1), tether("exp", "tool", retention_ms="1000"))
    pool = e.scheduler.kv_cache_manager.block_pool
    assert e.sched_connector.ledger.held_blocks == 4
    free_held = pool.get_num_free_blocks()
    e.now_ms = 999
    e.step()  # an empty step still builds connector metadata
    assert e.sched_connector.ledger.held_blocks == 4
    e.now_ms = 1000
    e.step()
    assert e.sched_connector.ledger.held_blocks == 0
    assert pool.get_num_free_blocks() == free_held + 4
    assert e.sched_connector.ledger.stats()["expired"] == 1


def test_a_retained_turn_survives_a_flood_that_plain_prefix_caching_loses():
    results = {}
    for name, connector in [("plain", None), ("tether", "TetherConnector")]:
        e = Engine(connector=connector, extra={"host_bytes": 0}, num_blocks=40)
        first = tokens(5, 8 * BS + 5)
        out = e.serve("s1", first, tether("flood"), max_tokens=2)
        flood(e, 12, 12 * BS)
        before = e.stats.cached_tokens
        e.serve("s2", first + out + tokens(6, 10), tether("flood"))
        results[name] = e.stats.cached_tokens - before
        assert e.mismatched_positions == 0
    assert results["plain"] == 0, results
    assert results["tether"] >= 8 * BS, results


def test_a_corrupt_host_payload_is_recomputed_not_served():
    e = Engine(extra={"host_bytes": 1 << 22, "max_device_fraction": 0.25}, num_blocks=24)
    first = tokens(21, 5 * BS + 2)
    req = e.add("c1", first, tether("corrupt"))
    e.run()
    hashes = list(req.block_hashes)
    assert all(e.worker.copier.contains(h) for h in hashes[:5])
    assert e.worker.copier.corrupt(hashes[2])
    flood(e, 3, 20 * BS)
    e.serve("c2", first + e.finished["c1"] + tokens(22, 5), tether("corrupt"))
    assert e.worker.stats["load_failed_blocks"] >= 1
    assert e.mismatched_positions == 0, "corrupt KV reached the model"
    # The scheduler forgot the corrupt payload and its record; the recomputed turn was
    # written through again, and a third visit restores it cleanly from the host tier.
    failed = e.worker.stats["load_failed_blocks"]
    second = first + e.finished["c1"] + tokens(22, 5)
    flood(e, 3, 20 * BS, start=2000)
    loaded = e.worker.stats["loaded_blocks"]
    e.serve("c3", second + e.finished["c2"] + tokens(23, 5), tether("corrupt"))
    assert e.worker.stats["loaded_blocks"] - loaded >= 5
    assert e.worker.stats["load_failed_blocks"] == failed
    assert e.mismatched_positions == 0


# kv_transfer_params itself is always an object or None: vLLM's API schema
# (`dict[str, Any] | None`) answers 400 to anything else before the engine sees it.
BAD_PARAMS = [
    {"tether": "string"},
    {"tether": 5},
    {"tether": ["session", "a"]},
    {"tether": {"session": 5}},
    {"tether": {"session": "not hex!"}},
    {"tether": {"session": "ab", "prompt_end": "yes"}},
    {"tether": {"session": "ab", "turn_kind": "dinner"}},
    {"tether": {"session": "ab", "retention_ms": "-1"}},
    {"tether": {f"k{i}": "1" for i in range(10_000)}},
    {"tether": {"session": "a" * 1_000_000}},
    {"tether": {"session": "ab", "prompt_end": "1", 7: "x"}},
    {"tether": None},
    {"tether": {}},
]


@pytest.mark.parametrize("params", BAD_PARAMS, ids=lambda p: repr(p)[:40])
def test_bad_kv_transfer_params_never_crash(params):
    e = Engine(extra={"host_bytes": 1 << 20}, num_blocks=32)
    out = e.serve("bad", tokens(31, 3 * BS + 2), params, max_tokens=2)
    assert len(out) == 2
    assert e.mismatched_positions == 0
    assert e.sched_connector.ledger.held_blocks == 0


def test_spoofed_markers_cannot_reach_another_tenants_kv():
    # A client naming someone else's session only retains its *own* blocks under that
    # key: blocks are addressed by vLLM's hashes of the tokens (and cache_salt).
    e = Engine(extra={"host_bytes": 1 << 22, "max_device_fraction": 0.25}, num_blocks=24)
    victim = tokens(41, 5 * BS)
    e.serve("v1", victim, tether("victim"))
    e.serve("x1", tokens(42, 3 * BS + 1), tether("victim", tenant="beef"))
    e.serve("x2", tokens(43, 3 * BS + 1), {"tether": {"session": sid("victim")}, "do_remote_prefill": True})
    assert e.mismatched_positions == 0
    # The spoofing request of the same key superseded the victim's retention (the
    # gateway is what authenticates keys, docs/vllm.md) but served only its own KV.
    assert e.worker.stats["loaded_blocks"] == 0


def test_session_id_alone_is_a_retention_key():
    e = Engine(extra={"host_bytes": 0}, num_blocks=40)
    first = tokens(51, 6 * BS + 1)
    e.serve("s1", first, None, session_id="conversation-7")
    assert e.sched_connector.ledger.held_blocks == 6
    off = Engine(extra={"host_bytes": 0, "session_id_retention": False}, num_blocks=40)
    off.serve("s1", first, None, session_id="conversation-7")
    assert off.sched_connector.ledger.held_blocks == 0


def test_metadata_survives_pickling():
    meta = TetherMetadata(
        ops=[("save", "r1", 0, [3, 4], [b"\x01" * 32, b"\x02" * 32]), ("free", [b"\x03" * 16])],
        loads=[("r2", 1, [7], [b"\x04" * 32])],
    )
    back = pickle.loads(pickle.dumps(meta))
    assert back == meta and back is not meta
    # And through the engine: every step of every test above pickled its metadata.
    assert Engine.pickle_metadata is True


def test_parse_marker_contract():
    m = parse_marker({"session": "00ab", "prompt_end": "1", "turn_kind": "TOOL", "unknown": "x"})
    assert m.prompt_end and m.kind == "tool" and m.key == "0:ab:0"
    assert parse_marker(None) is None
    assert parse_marker({"prompt_end": "1"}) is None  # no session: untracked
    for bad in ["x", 3, {"session": 3}, {"session": "ab", "turn": "x"}]:
        with pytest.raises(CallerError):
            parse_marker(bad)


@pytest.mark.parametrize(
    "field,value",
    [
        ("host_bytes", -1),
        ("host_bytes", "4GiB"),
        ("retention", 1),
        ("max_device_fraction", 2.0),
        ("free_watermark", True),
        ("intervals_ms", {"lunch": 5}),
        ("intervals_ms", {"tool": -5}),
        ("residency_port", 70_000),
        ("residency_port", "8101"),
        ("residency_host", ""),
        ("residency_max_entries", 0),
        ("residency_max_entries", 16_385),
        ("no_such_field", 1),
    ],
)
def test_bad_configuration_fails_at_start_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TetherConfig.parse({field: value})
    with pytest.raises(ValueError, match=field):
        Engine(extra={field: value}, num_blocks=16)
