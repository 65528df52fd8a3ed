"""State pull between two real engines (issue 27 part 1; docs/vllm.md, "State pull (NIXL)"):
two ``vllm serve`` CPU engines with TetherConnector and ``pull: true``, each on its own
loopback address, NIXL over UCX's TCP transport on ``lo``. A turn migrated to the other
engine (its marker's ``pull_from`` naming the holder's API address, as the gateway writes
it) reads the holder's retained blocks with a one-sided READ.

- ``pa`` (127.0.0.8): clean;
- ``pb`` (127.0.0.9): ``fault_corrupt_every: 1`` — every host payload it saves is corrupted
  after its checksum was taken, so whatever a puller reads from it fails verification.

A pull is compared bit-exactly with a device hit on its holder (the same KV bytes, the
suffix computed the same way). A pull that failed is compared bit-exactly with a cold
prefill of the same prompt on the same engine (a ``cache_salt`` of its own, so nothing of
it is cached): a failed pull leaves no trace. (Not with ``Answer.agrees_with`` against
the holder's hit: this random model's replies hold undecodable bytes, several top
alternatives read "\ufffd", and ``Answer.gap`` pairs alternatives by their text, so it
reports 0.34 between answers that are bit-identical.)

The kill test is last: it leaves ``pa`` dead.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
import tiny_model
from engines import BLOCK, RESIDENCY_PORT, Server, post, serving
from fleet import ask, marker, stats
from tether_vllm import parse_marker
from tether_vllm.lease import chain_of
from tether_vllm.lease import post as lease_post

SYSTEM = "a session moves to another engine and takes its state along " * 10
FIRST = "def main():\n    return run(tool_call, result)\n"
TOOL = '{"name": "read_file", "arguments": {"path": "src/lib.rs"}}'
UCX = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"}
LEASE_MS = 3000


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    work = tmp_path_factory.mktemp("real-pull")
    model = tiny_model.make(work / "model")
    tether = {"host_bytes": 1 << 26, "pull": True, "pull_lease_ms": LEASE_MS}
    servers = {
        "pa": Server("pa", "127.0.0.8", 64, tether, work / "pa.log", env=UCX),
        "pb": Server("pb", "127.0.0.9", 64, dict(tether, fault_corrupt_every=1), work / "pb.log",
                     env=UCX),
    }
    with serving(model, list(servers.values())):
        yield servers


def history(tag: str, answer: str | None = None) -> list[tuple[str, str]]:
    first = [("system", f"{tag} " + SYSTEM), ("user", FIRST)]
    return first if answer is None else first + [("assistant", answer), ("user", TOOL)]


def moved(session: str, holder: Server) -> dict:
    """Turn 2's marker as the gateway writes it when it migrates the key off ``holder``."""
    return dict(marker(session, 2), pull_from=holder.address)


def turn_one(server: Server, session: str, tag: str):
    """Turn 1 on ``server``, retained; returns the answer and the blocks written through
    to its host tier (in the step after the turn's end: waited for, so a lease finds
    every payload's address)."""
    before = stats(server)["saved_blocks"]
    one = ask(server.url, "chat", history(tag), marker=marker(session))
    deadline = time.monotonic() + 10
    while (n := stats(server)["saved_blocks"] - before) == 0:
        assert time.monotonic() < deadline, stats(server)
        time.sleep(0.05)
    return one, n


def listed(server: Server, session: str) -> bool:
    key = f"{parse_marker(marker(session)).resident_key:016x}"
    keys = server.load()["residency"]["keys"]
    return key in {keys[i : i + 16] for i in range(0, len(keys), 16)}


def delta(after: dict, before: dict, name: str) -> int:
    return after.get(name, 0) - before.get(name, 0)


def lease_ended(server: Server, before: dict, nudge: list[Server], timeout: float = 10.0) -> dict:
    """``server``'s counters once a lease it granted after ``before`` ended, or at the
    timeout. Both ends of a lease move in engine steps: the new home sends its release
    when its worker reports the READ done (its scheduler's next step), the holder reads
    the READ's notification in its worker's steps. An idle engine takes no steps, so the
    ``nudge`` engines get a one-token request every half second, as traffic would."""
    deadline = time.monotonic() + timeout
    while True:
        s = stats(server)
        done = delta(s, before, "leases_released") >= 1 and delta(s, before, "leases_notified") >= 1
        if done or time.monotonic() > deadline:
            return s
        for n in nudge:
            ask(n.url, "chat", [("user", "ping")], n=1)
        time.sleep(0.5)


def test_a_pulled_turn_answers_exactly_as_a_device_hit_on_its_holder(pair):
    """Turn 1 on pa; turn 2 migrated to pb pulls pa's retained blocks, and answers
    bit-identically (text, every logprob and its top-2) to pa's own device hit."""
    pa, pb = pair["pa"], pair["pb"]
    session = "00000000000003a1"
    one, expect = turn_one(pa, session, "pull")  # prompt + reply, whole blocks
    a0, b0 = stats(pa), stats(pb)
    two_b = ask(pb.url, "chat", history("pull", one.text), marker=moved(session, pa))
    b1 = stats(pb)
    two_a = ask(pa.url, "chat", history("pull", one.text), marker=marker(session, 2))
    assert delta(b1, b0, "pulled_blocks") == expect, (b0, b1)
    assert delta(b1, b0, "pull_failed_blocks") == 0 and delta(b1, b0, "pulls") == 1, b1
    assert delta(b1, b0, "pulled_bytes") > 0
    assert two_a.cached == two_b.cached == expect * BLOCK >= 2 * BLOCK, (two_a, two_b)
    assert two_b.same_as(two_a), (two_b, two_a)
    # The new home holds the turn now; the holder's lease ended (pb's HTTP release,
    # sent from its lease thread; the READ's notification read by pa's worker in the
    # steps of two_a).
    assert listed(pb, session)
    a1 = lease_ended(pa, a0, nudge=[pb, pa])
    assert delta(a1, a0, "leases_granted") == 1 and delta(a1, a0, "leased_blocks") == expect, a1
    assert delta(a1, a0, "leases_released") == 1 and delta(a1, a0, "leases_notified") == 1, a1
    assert a1["leases_active"] == 0 and a1["lease_held_blocks"] == 0, a1


def test_a_corrupt_payload_at_the_holder_is_a_counted_recompute_with_the_same_answer(pair):
    """pb's payloads fail their checksums: pa pulls, verifies, recomputes the whole turn,
    and answers exactly as its own cold prefill of the prompt (and with pb's text)."""
    pa, pb = pair["pa"], pair["pb"]
    session = "00000000000003a2"
    one, expect = turn_one(pb, session, "corrupt")
    a0 = stats(pa)
    two_a = ask(pa.url, "chat", history("corrupt", one.text), marker=moved(session, pb))
    a1 = stats(pa)
    two_b = ask(pb.url, "chat", history("corrupt", one.text), marker=marker(session, 2))
    cold = cold_prefill(pa, history("corrupt", one.text))
    assert delta(a1, a0, "pulls") == 1 and delta(a1, a0, "pulled_blocks") == 0, a1
    assert delta(a1, a0, "pull_failed_blocks") == expect and delta(a1, a0, "pull_failed") == 1
    assert two_a.cached == 0 and two_b.cached == expect * BLOCK, (two_a, two_b)
    assert two_a.same_as(cold), (two_a, cold)
    assert two_a.text == two_b.text


def cold_prefill(server: Server, turn: list[tuple[str, str]]):
    """The prompt computed from scratch on ``server``: a cache salt nothing else uses."""
    return ask(server.url, "chat", turn, extra={"cache_salt": f"cold-{time.monotonic_ns()}"})


def tokens(server: Server, turn: list[tuple[str, str]]) -> list[int]:
    """The prompt's token ids as the engine makes them (vLLM's /tokenize, chat template)."""
    r = post(server.url, "/tokenize", {"model": "tiny", "add_generation_prompt": True,
                                      "messages": [{"role": ro, "content": t} for ro, t in turn]})
    return r["tokens"]


def test_a_lease_nobody_releases_expires(pair):
    """A lease asked by hand and never read nor released: the holder keeps its payloads
    for pull_lease_ms, then drops the lease at a step after that."""
    pa = pair["pa"]
    session = "00000000000003a3"
    one, _ = turn_one(pa, session, "lease")
    with urllib.request.urlopen(f"http://{pa.host}:{RESIDENCY_PORT}/pull/agent", timeout=5) as r:
        agent = json.load(r)
    chain = chain_of(tokens(pa, history("lease")), BLOCK, None)
    body = {"key": f"{parse_marker(marker(session)).resident_key:016x}",
            "hashes": [c.hex() for c in chain], "start": 0,
            "fingerprint": agent["fingerprint"], "puller": "test"}
    before = stats(pa)
    status, grant = lease_post(pa.host, RESIDENCY_PORT, "/pull/lease", body, 5)
    assert status == 200 and grant["lease"], grant
    assert len(grant["blocks"]) == one.prompt // BLOCK, grant
    held = stats(pa)
    assert held["leases_active"] == 1 and held["lease_held_blocks"] == len(grant["blocks"]), held
    time.sleep(LEASE_MS / 1000 + 0.5)
    ask(pa.url, "chat", [("user", "one step")], n=1)  # the engine steps: expiry is checked
    after = stats(pa)
    assert delta(after, before, "leases_expired") == 1, after
    assert after["leases_active"] == 0 and after["lease_held_blocks"] == 0, after
    status, _ = lease_post(pa.host, RESIDENCY_PORT, "/pull/renew", {"lease": grant["lease"]}, 5)
    assert status == 404


def test_a_dead_holder_is_a_counted_recompute_with_the_same_answer(pair):
    """pa is killed after turn 1 (its answer to turn 2 taken before): pb cannot reach it,
    recomputes, and answers exactly as its own cold prefill (and with pa's text)."""
    pa, pb = pair["pa"], pair["pb"]
    session = "00000000000003a4"
    one = ask(pa.url, "chat", history("dead"), marker=marker(session))
    ref = ask(pa.url, "chat", history("dead", one.text), marker=marker(session, 2))
    pa.kill()
    b0 = stats(pb)
    two = ask(pb.url, "chat", history("dead", one.text), marker=moved(session, pa))
    b1 = stats(pb)
    assert delta(b1, b0, "pull_asked") == 1 and delta(b1, b0, "pull_refused") == 1, b1
    assert delta(b1, b0, "pulls") == 0 and two.cached == 0
    assert two.same_as(cold_prefill(pb, history("dead", one.text)))
    assert two.text == ref.text
