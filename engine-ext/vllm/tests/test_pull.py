"""State pull over NIXL between two engines in two processes (docs/vllm.md, "State pull
(NIXL)"): a holder (``pull_peer.py``: vLLM's real scheduler, the connector, a NIXL agent
over its host tier) and a puller in this process, both the harness ``Engine`` whose fake
forward checks every attended position, so a pulled block with one wrong byte is a
counted mismatch. Bytes move over UCX's TCP transport on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from harness import Engine  # noqa: E402
from tether_vllm import parse_marker, read_load_report  # noqa: E402
from tether_vllm.lease import chain_of, post  # noqa: E402

BS = 16
BLOCK_BYTES = 4096  # the harness model: 2 layers x 2 KV heads x 16 tokens x 2*16 x bf16
TURN_BLOCKS = 10
HOST = "127.0.0.1"
HERE = os.path.dirname(__file__)


def holder_kwargs(**extra) -> dict:
    cfg = {"pull": True, "residency_port": 0, "residency_host": HOST, "pull_port": 1,
           "host_bytes": 24 * BLOCK_BYTES, "pull_lease_ms": 1500}
    cfg.update(extra)
    return {"extra": cfg, "served_model_name": "tiny"}


class Peer:
    """A holder in its own process (``pull_peer.py``)."""

    def __init__(self, **extra):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "pull_peer.py"), json.dumps(holder_kwargs(**extra))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE,
            env=dict(os.environ, PYTHONPATH=HERE),
        )
        line = self.proc.stdout.readline()
        assert line, "the holder exited at start"
        self.port = json.loads(line)["port"]

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the holder died"
        return json.loads(line)

    def stats(self) -> dict:
        return self.call(op="stats")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def peer():
    p = Peer()
    yield p
    p.kill()


def marker(session: str, turn: int = 1, pull_from: str | None = None) -> dict:
    m = {"prompt_end": "1", "turn_kind": "tool", "tenant": "00000000000000aa",
         "session": session, "turn": str(turn)}
    if pull_from is not None:
        m["pull_from"] = pull_from
    return m


def puller(port: int, **extra) -> Engine:
    cfg = {"pull": True, "residency_port": 0, "residency_host": HOST, "pull_port": port,
           "host_bytes": 64 * BLOCK_BYTES, "pull_timeout_ms": 3000}
    cfg.update(extra)
    return Engine(extra=cfg, served_model_name="tiny")


def turn_one(peer: Peer, session: str, base: int) -> tuple[list[int], list[int]]:
    """A retained turn of TURN_BLOCKS whole blocks on the holder."""
    tokens = [base + i for i in range(TURN_BLOCKS * BS)]
    out = peer.call(op="serve", id=f"{session}-1", tokens=tokens,
                    params={"tether": marker(session)})["out"]
    return tokens, out


def turn_two(tokens: list[int], out: list[int]) -> list[int]:
    return tokens + out + list(range(700, 740))


def pull_stats(e: Engine) -> dict:
    s = e.sched_connector.connector_stats()
    return {k: s.get(k, 0) for k in ("pulls", "pulled_blocks", "pulled_bytes", "pull_failed",
                                     "pull_failed_blocks", "pull_asked", "pull_refused",
                                     "load_failed_blocks")}


def test_a_pull_loads_the_holders_retained_turn_bit_exact_and_releases_its_lease(peer):
    session = "0000000000000101"
    t1, out = turn_one(peer, session, 1000)
    before = peer.stats()
    e = puller(peer.port)
    t2 = turn_two(t1, out)
    e.serve("p-2", t2, {"tether": marker(session, 2, pull_from=f"{HOST}:8000")})
    s = pull_stats(e)
    assert s["pulled_blocks"] == TURN_BLOCKS, s
    assert s["pulled_bytes"] == TURN_BLOCKS * BLOCK_BYTES and s["pull_failed_blocks"] == 0, s
    # Every attended position of the pulled blocks held the holder's KV; only the rest
    # of the prompt was computed here.
    assert e.mismatched_positions == 0
    assert e.stats.cached_tokens == TURN_BLOCKS * BS
    assert e.stats.computed_tokens == len(t2) - TURN_BLOCKS * BS
    # The new home retains the turn as its own.
    key = parse_marker(marker(session)).resident_key
    assert key in read_load_report(e.sched_connector.load_report())["residency"]["entries"]
    # The holder granted one lease of the whole turn; the puller's release ended it at
    # once, and the READ's NIXL notification arrived at the holder's next steps.
    peer.call(op="step", n=3)
    after = peer.stats()
    assert after["leases_granted"] - before["leases_granted"] == 1, (before, after)
    assert after["leased_blocks"] - before["leased_blocks"] == TURN_BLOCKS
    assert after["leases_notified"] - before["leases_notified"] == 1, after
    assert after["leases_active"] == 0 and after["lease_held_blocks"] == 0, after
    assert after["mismatched"] == 0


def test_a_pull_stops_where_the_prompt_departs_from_the_retained_turn(peer):
    """Blocks are named by the pull chain of their tokens: a client that rewrote the
    history from block 6 on gets blocks 0..5 and computes the rest."""
    session = "0000000000000102"
    t1, out = turn_one(peer, session, 2000)
    t2 = turn_two(t1, out)
    t2[6 * BS + 3] = 999
    e = puller(peer.port)
    e.serve("p-2", t2, {"tether": marker(session, 2, pull_from=f"{HOST}:8000")})
    s = pull_stats(e)
    assert s["pulled_blocks"] == 6 and s["pull_failed_blocks"] == 0, s
    assert e.mismatched_positions == 0
    assert e.stats.computed_tokens == len(t2) - 6 * BS


def test_a_turn_retained_after_an_earlier_one_is_pulled_whole(peer):
    """The holder hashes only the blocks a prompt end adds to its key's previous turn
    (a turn resends its history): the chain of turn 2's 13 blocks must still match the
    puller's, computed from scratch."""
    session = "0000000000000110"
    t1, out = turn_one(peer, session, 8000)
    t2 = t1 + out + list(range(600, 648))  # 209 tokens: 13 whole blocks
    out2 = peer.call(op="serve", id=f"{session}-2", tokens=t2,
                     params={"tether": marker(session, 2)})["out"]
    e = puller(peer.port)
    t3 = t2 + out2 + list(range(800, 840))
    e.serve("p-3", t3, {"tether": marker(session, 3, pull_from=f"{HOST}:8000")})
    s = pull_stats(e)
    assert s["pulled_blocks"] == len(t2) // BS == 13 and s["pull_failed_blocks"] == 0, s
    assert e.mismatched_positions == 0


def test_a_corrupt_payload_at_the_holder_is_a_counted_recompute(peer):
    session = "0000000000000103"
    t1, out = turn_one(peer, session, 3000)
    assert peer.call(op="corrupt", tokens=t1, block=3)["ok"]
    e = puller(peer.port)
    t2 = turn_two(t1, out)
    e.serve("p-2", t2, {"tether": marker(session, 2, pull_from=f"{HOST}:8000")})
    s = pull_stats(e)
    # Blocks 0..2 verified and loaded; block 3 failed its checksum: it and the rest are
    # recomputed, never served.
    assert s["pulled_blocks"] == 3 and s["pull_failed_blocks"] == TURN_BLOCKS - 3, s
    assert s["pull_failed"] == 1
    assert e.mismatched_positions == 0
    assert e.stats.computed_tokens == len(t2) - 3 * BS


def test_a_truncated_transfer_is_a_counted_recompute(peer):
    session = "0000000000000104"
    t1, out = turn_one(peer, session, 4000)
    # Every 4th payload this puller reads ends half way (block 3 here).
    e = puller(peer.port, fault_pull_truncate_every=4)
    t2 = turn_two(t1, out)
    e.serve("p-2", t2, {"tether": marker(session, 2, pull_from=f"{HOST}:8000")})
    s = pull_stats(e)
    assert s["pulled_blocks"] == 3 and s["pull_failed_blocks"] == TURN_BLOCKS - 3, s
    assert e.sched_connector.connector_stats()["faults_injected"] >= 1
    assert e.mismatched_positions == 0
    assert e.stats.computed_tokens == len(t2) - 3 * BS


def lease(peer: Peer, session: str, tokens: list[int]) -> tuple[int, dict]:
    """A lease asked by hand, as a puller asks it (docs/vllm.md, "Lease endpoints")."""
    with __import__("urllib.request").request.urlopen(
        f"http://{HOST}:{peer.port}/pull/agent", timeout=5
    ) as r:
        agent = json.load(r)
    body = {"key": f"{parse_marker(marker(session)).resident_key:016x}",
            "hashes": [c.hex() for c in chain_of(tokens, BS, None)], "start": 0,
            "fingerprint": agent["fingerprint"], "puller": "test"}
    return post(HOST, peer.port, "/pull/lease", body, 5)


def test_a_lease_keeps_evicted_payloads_until_it_expires_then_they_are_freed(peer):
    session = "0000000000000105"
    t1, _ = turn_one(peer, session, 5000)
    status, grant = lease(peer, session, t1)
    assert status == 200 and grant["lease"] and len(grant["blocks"]) == TURN_BLOCKS, grant
    assert all(b["len"] == BLOCK_BYTES and len(b["checksum"]) == 32 for b in grant["blocks"])
    # Other sessions fill the holder's host tier (24 blocks): the ledger lets this turn
    # go, but the lease keeps its payloads.
    for i in range(4):
        turn_one(peer, f"00000000000001f{i}", 20_000 + 1000 * i)
        if peer.stats()["lease_deferred_frees"] >= TURN_BLOCKS:
            break
    s = peer.stats()
    assert s["lease_deferred_frees"] == TURN_BLOCKS and s["lease_held_blocks"] == TURN_BLOCKS, s
    assert all(peer.call(op="held", tokens=t1)["held"]), "a leased payload was freed"
    # No notification, no release: after pull_lease_ms the lease expires at the holder's
    # next step and the payloads are freed.
    time.sleep(1.6)
    peer.call(op="step", n=2)
    s = peer.stats()
    assert s["leases_expired"] >= 1 and s["leases_active"] == 0, s
    assert s["lease_deferred_frees"] == 0 and s["lease_held_blocks"] == 0, s
    assert not any(peer.call(op="held", tokens=t1)["held"])
    # A renewal of an expired lease is refused.
    assert post(HOST, peer.port, "/pull/renew", {"lease": grant["lease"]}, 5)[0] == 404


def test_bad_lease_requests_are_answered_and_serving_goes_on(peer):
    for body, code in [
        ({"key": "xyz"}, 400),
        ({"key": "0" * 16, "hashes": ["zz"]}, 400),
        ({"key": "0" * 16, "hashes": [], "fingerprint": "another model"}, 409),
        ({"lease": 7}, 400),
    ]:
        path = "/pull/renew" if "lease" in body else "/pull/lease"
        assert post(HOST, peer.port, path, body, 5)[0] == code, body
    status, grant = lease(peer, "00000000000001ff", list(range(BS * 2)))
    assert status == 200 and grant["lease"] is None and grant["blocks"] == []
    assert post(HOST, peer.port, "/pull/release", {"lease": "no-such"}, 5)[0] == 404


def test_a_holder_without_the_key_or_unreachable_is_a_counted_recompute(peer):
    e = puller(peer.port)
    tokens = list(range(6000, 6000 + 8 * BS))
    e.serve("u-1", tokens, {"tether": marker("0000000000000106", 2, pull_from=f"{HOST}:8000")})
    e.serve("u-2", [t + 1 for t in tokens],
            {"tether": marker("0000000000000107", 2, pull_from="127.0.0.1:8000")})
    dead = puller(1)  # nothing listens on port 1
    dead.serve("u-3", [t + 2 for t in tokens],
               {"tether": marker("0000000000000108", 2, pull_from=f"{HOST}:8000")})
    for eng, asked in ((e, 2), (dead, 1)):
        s = pull_stats(eng)
        assert s["pull_asked"] == asked and s["pull_refused"] == asked, s
        assert s["pulls"] == 0 and eng.mismatched_positions == 0
        assert eng.stats.cached_tokens == 0


def test_a_pull_from_that_is_not_an_address_is_a_bad_marker():
    e = puller(1)
    e.serve("b-1", list(range(4 * BS)), {"tether": marker("000000000000010a", 2, pull_from="holder-a:80")})
    s = e.sched_connector.connector_stats()
    assert s["bad_markers"] == 1 and s["pull_asked"] == 0 and s["retained"] == 0, s
    for bad in ("1.2.3.4", "1.2.3.4:0", "[::1]", ""):
        with pytest.raises(Exception, match="pull_from"):
            parse_marker(marker("01", pull_from=bad))
    assert parse_marker(marker("01", pull_from="[::1]:8000")).pull_from == ("::1", 8000)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"pull": True}, "pull: needs residency_port"),
        ({"pull": True, "residency_port": 0}, "pull_port: must be set"),
        ({"pull_port": 0}, "pull_port"),
        ({"pull_lease_ms": 0}, "pull_lease_ms"),
        ({"pull_timeout_ms": 0}, "pull_timeout_ms"),
        ({"pull_staging_bytes": -1}, "pull_staging_bytes"),
        ({"fault_pull_truncate_every": -1}, "fault_pull_truncate_every"),
        ({"pull": 1}, "pull: expected bool"),
    ],
)
def test_bad_pull_configuration_fails_at_start_naming_the_field(extra, field):
    with pytest.raises(ValueError, match=field):
        Engine(extra=extra)


def test_a_hybrid_model_refuses_pull_at_start():
    with pytest.raises(ValueError, match="pull: hybrid"):
        Engine(extra={"pull": True, "residency_port": 0, "pull_port": 1}, hybrid=True)


def test_a_holder_killed_after_granting_its_lease_is_a_counted_recompute(peer):
    """Last in the file: it kills the module's holder."""
    session = "0000000000000109"
    t1, out = turn_one(peer, session, 7000)
    e = puller(peer.port, pull_timeout_ms=2000)
    t2 = turn_two(t1, out)
    e.add("k-2", t2, {"tether": marker(session, 2, pull_from=f"{HOST}:8000")})
    e.step()  # asks for the lease
    pull = e.sched_connector.puller.pulls["k-2"]
    deadline = time.monotonic() + 10
    while pull.result is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not isinstance(pull.result, str), pull.result
    peer.kill()
    t0 = time.monotonic()
    e.run()
    s = pull_stats(e)
    assert s["pulls"] == 1 and s["pulled_blocks"] == 0, s
    assert s["pull_failed_blocks"] == TURN_BLOCKS, s
    assert e.mismatched_positions == 0
    assert e.stats.computed_tokens == len(t2)
    assert time.monotonic() - t0 < 2.0 + 5, "the READ to a dead holder outlived its timeout"
