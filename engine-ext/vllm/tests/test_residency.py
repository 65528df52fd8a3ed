"""The connector's residency endpoint (``residency_port``) on vLLM 0.33's real scheduler.

Every test polls the listener over HTTP as a gateway does and reads the reply with the
Rust ``LoadReport`` type and ``Resident::decode`` (``tether_vllm.read_load_report``, the
code the filter runs): retained turns are listed under their resident keys with their
tokens and tier; expired or evicted ones leave; the summary is bounded, largest first;
bad markers and bad HTTP never stop the listener; and the real filter in Envoy polls
it through the cluster docs/vllm.md describes.
"""

from __future__ import annotations

import json
import re
import socket
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from gateway import free_port, render, running
from harness import Engine
from test_connector import BS, flood, tether, tokens
from tether_vllm import CallerError, parse_marker, read_load_report

LOCAL = {"residency_port": 0, "residency_host": "127.0.0.1"}


def _engine(extra: dict | None = None, **kw) -> Engine:
    e = Engine(extra={**LOCAL, **(extra or {})}, **kw)
    return e


def _poll_raw(e: Engine) -> bytes:
    port = e.sched_connector.residency.port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/load", timeout=5) as r:
        assert r.status == 200
        assert r.headers["content-type"] == "application/json"
        return r.read()


def _poll(e: Engine) -> dict:
    return read_load_report(_poll_raw(e))


def _entries(e: Engine) -> dict[int, tuple[int, str]]:
    return _poll(e)["residency"]["entries"]


def rkey(session: str, **extra) -> int:
    """The resident key a gateway computes for this session's marker."""
    return parse_marker(tether(session, **extra)["tether"]).resident_key


@pytest.fixture
def engines():
    """Engines made by a test; their listeners are closed afterwards."""
    made: list[Engine] = []

    def make(*args, **kw) -> Engine:
        e = _engine(*args, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.sched_connector.shutdown()


def test_retained_turns_are_listed_with_their_tokens_and_tier(engines):
    e = engines({"host_bytes": 1 << 22}, num_blocks=64)
    assert _poll(e)["residency"] == {"version": 1, "omitted": 0, "entries": {}}
    # 83 prompt + 2 output tokens: 5 full blocks computed; a subagent is its own key.
    e.serve("a1", tokens(1, 5 * BS + 3), tether("a"), max_tokens=2)
    e.serve("b1", tokens(2, 3 * BS + 1), tether("b", "tool"))
    e.serve("c1", tokens(3, 2 * BS + 4), tether("a", subagent="5ab"))
    e.serve("u1", tokens(4, 4 * BS))  # no marker: not retained, not listed
    assert _entries(e) == {
        rkey("a"): (5 * BS, "device"),
        rkey("b"): (3 * BS, "device"),
        rkey("a", subagent="5ab"): (2 * BS, "device"),
    }
    raw = json.loads(_poll_raw(e))
    # The wire form: 16 + 8 + 1 hex digits per entry, keys ascending.
    res = raw["residency"]
    assert (len(res["keys"]), len(res["tokens"]), res["tiers"]) == (48, 24, "111")
    keys = [int(res["keys"][i : i + 16], 16) for i in range(0, 48, 16)]
    assert keys == sorted(keys)
    report = _poll(e)
    assert report["server_load"] == 0 and report["speedup"] == 1.0
    (rank,) = report["ranks"]
    assert rank["retentions"] == 3 and rank["kv_blocks"] == 64
    held = e.sched_connector.ledger.held_blocks
    assert rank["kv_usage"] >= held / 64 > 0
    # The next turn of a supersedes its retention: still one entry, now longer.
    e.serve("a2", tokens(1, 5 * BS + 3) + e.finished["a1"] + tokens(5, 2 * BS), tether("a"))
    assert _entries(e)[rkey("a")] == (7 * BS, "device")
    assert len(_entries(e)) == 3


def test_load_counts_waiting_running_and_queued_prefill(engines):
    e = engines({"host_bytes": 0}, num_blocks=64)
    e.add("w1", tokens(6, 3 * BS), tether("w1"), max_tokens=4)
    e.add("w2", tokens(7, 2 * BS + 5), tether("w2"), max_tokens=4)
    (rank,) = (r := _poll(e))["ranks"]
    assert (r["server_load"], rank["running"], rank["waiting"]) == (2, 0, 2)
    assert rank["queued_prefill_tokens"] == 5 * BS + 5
    e.step()  # both admitted and prefilled; now decoding
    (rank,) = (r := _poll(e))["ranks"]
    assert (r["server_load"], rank["running"], rank["waiting"]) == (2, 2, 0)
    assert rank["queued_prefill_tokens"] == 0
    e.run()
    assert _poll(e)["server_load"] == 0
    assert set(_entries(e)) == {rkey("w1"), rkey("w2")}


def test_the_busy_share_grows_while_requests_are_in_flight_and_decays_after(engines):
    e = engines({"host_bytes": 0}, num_blocks=64)
    assert _poll(e)["ranks"][0]["busy"] == 0.0
    e.add("b1", tokens(8, 2 * BS), tether("b1"), max_tokens=4)
    time.sleep(0.3)
    during = _poll(e)["ranks"][0]["busy"]
    # 0.3 s busy at a 300 s time constant: about 1e-3.
    assert 5e-4 < during < 2e-3, during
    e.run()
    after = _poll(e)["ranks"][0]["busy"]
    time.sleep(0.3)
    later = _poll(e)["ranks"][0]["busy"]
    assert after >= during and 0 < later < after, (during, after, later)


def test_the_prefill_rate_is_measured_on_the_cores_own_steps(engines):
    """``prefill_tokens_per_s``: a step's new prompt tokens over the time until the
    next step; 0 until measured, and decode steps are no sample."""
    e = engines({"host_bytes": 0}, num_blocks=256)
    assert _poll(e)["ranks"][0]["prefill_tokens_per_s"] == 0.0
    prompt = 20 * BS
    e.add("r1", tokens(12, prompt), tether("rate"), max_tokens=8)
    e.step()  # schedules the whole prompt
    assert _poll(e)["ranks"][0]["prefill_tokens_per_s"] == 0.0, "no next step yet"
    time.sleep(0.2)  # as if the step ran for 0.2 s
    e.step()  # a decode step: the prefill step's sample is taken now
    rate = _poll(e)["ranks"][0]["prefill_tokens_per_s"]
    # At least 0.2 s between the two steps; the test's own overhead only lowers it.
    assert prompt / 2.0 < rate <= prompt / 0.2, rate
    time.sleep(0.2)
    e.step()  # the decode step before was no sample
    assert _poll(e)["ranks"][0]["prefill_tokens_per_s"] == rate


def test_an_admitted_turn_is_listed_before_its_retention(engines):
    """A turn is listed from admission (waiting, then running) with its prompt's full
    blocks, so a next turn arriving before its retention finds its holder; a request
    without a prompt-end marker is not listed, nor anything with retention off."""
    e = engines({"host_bytes": 0}, num_blocks=64)
    e.add("p1", tokens(9, 3 * BS + 5), tether("adm"), max_tokens=4)
    e.add("p2", tokens(10, 2 * BS), tether("mid", prompt_end="0"), max_tokens=4)
    assert _entries(e) == {rkey("adm"): (3 * BS, "device")}
    assert e.sched_connector.ledger.held_blocks == 0, "nothing retained yet"
    e.step()  # running
    assert _entries(e) == {rkey("adm"): (3 * BS, "device")}
    e.run()  # retained now: the record lists it (prompt + output's full blocks)
    assert set(_entries(e)) == {rkey("adm")}
    off = engines({"host_bytes": 0, "retention": False}, num_blocks=64)
    off.add("q1", tokens(11, 3 * BS), tether("off"), max_tokens=4)
    assert _entries(off) == {}


def test_an_expired_device_only_retention_leaves_the_summary(engines):
    e = engines({"host_bytes": 0}, num_blocks=32)
    e.serve("x1", tokens(8, 4 * BS + 1), tether("exp", "tool", retention_ms="1000"))
    assert _entries(e) == {rkey("exp"): (4 * BS, "device")}
    e.now_ms = 1000
    e.step()  # the step's metadata releases expired retentions
    assert _entries(e) == {}


def test_pressure_moves_a_state_to_the_host_tier_and_host_eviction_removes_it(engines):
    # 24 blocks, retentions may hold a quarter (6): a second session makes the first
    # yield to the host tier; the host tier holds 6 blocks' worth, so a third pushes
    # the first out of it.
    e = engines({"host_bytes": 1 << 22, "max_device_fraction": 0.25}, num_blocks=24)
    block = e.sched_connector.block_bytes
    e.serve("p1", tokens(9, 5 * BS + 1), tether("p1"))
    e.now_ms = 10  # p1 is the least recently used
    e.serve("p2", tokens(10, 5 * BS + 1), tether("p2"))
    assert _entries(e) == {rkey("p1"): (5 * BS, "host"), rkey("p2"): (5 * BS, "device")}

    small = engines({"host_bytes": 6 * block, "max_device_fraction": 0.25}, num_blocks=24)
    small.serve("p1", tokens(9, 5 * BS + 1), tether("p1"))
    small.now_ms = 10
    small.serve("p2", tokens(10, 5 * BS + 1), tether("p2"))
    # p1 yielded its device blocks, and its host record made room for p2's.
    assert _entries(small) == {rkey("p2"): (5 * BS, "device")}
    # A flood makes p2 yield its device blocks: it stays listed, on the host tier.
    small.now_ms = 20
    flood(small, 3, 20 * BS)
    assert _entries(small) == {rkey("p2"): (5 * BS, "host")}


def test_the_summary_is_bounded_largest_first(engines):
    e = engines({"host_bytes": 0, "residency_max_entries": 2}, num_blocks=64)
    for i, n in enumerate([2, 6, 4]):
        e.serve(f"s{i}", tokens(20 + i, n * BS + 1), tether(f"s{i}"))
    res = _poll(e)["residency"]
    assert res["omitted"] == 1
    assert res["entries"] == {rkey("s1"): (6 * BS, "device"), rkey("s2"): (4 * BS, "device")}


def test_a_hybrid_retention_counts_prompt_tokens_not_blocks(engines):
    # One record holds the attention blocks 0..k and the state snapshot block at k.
    e = engines({"host_bytes": 0}, hybrid=True, num_blocks=40)
    e.serve("h1", tokens(30, 5 * BS + 3), tether("hy"), max_tokens=2)
    assert e.sched_connector.ledger.held_blocks == 6
    assert _entries(e) == {rkey("hy"): (5 * BS, "device")}


def test_bad_markers_and_bad_http_never_stop_the_listener(engines):
    e = engines({"host_bytes": 1 << 20}, num_blocks=32)
    port = e.sched_connector.residency.port
    for i, params in enumerate(
        [
            {"tether": "string"},
            {"tether": {"session": "not hex!", "prompt_end": "1"}},
            {"tether": {"session": "a" * 1_000_000}},
            {"tether": {f"k{j}": "1" for j in range(1000)}},
        ]
    ):
        e.serve(f"bad{i}", tokens(40 + i, 2 * BS + 1), params)
    assert e.sched_connector.connector_stats()["bad_markers"] == 4
    assert _entries(e) == {}
    # Garbage, a stalled client, another method and another path: each answered or
    # dropped, and the next poll still works.
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"\x00\xff garbage \r\n\r\n")
        answer = b"".join(iter(lambda: s.recv(4096), b""))
        assert b"Error code: 400" in answer  # a bare error page: no HTTP version was sent
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"GET /lo")
    req = urllib.request.Request(f"http://127.0.0.1:{port}/load", method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError, match="501"):
        urllib.request.urlopen(req, timeout=5)
    stalled.close()
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    e.serve("good", tokens(50, 3 * BS + 1), tether("good"))
    assert _entries(e) == {rkey("good"): (3 * BS, "device")}


def test_a_failing_report_is_a_503_and_serving_goes_on(engines):
    e = engines({"host_bytes": 0}, num_blocks=32)
    c = e.sched_connector
    good = c.residency._report
    c.residency._report = lambda: 1 / 0
    with pytest.raises(urllib.error.HTTPError, match="503"):
        _poll_raw(e)
    c.residency._report = good
    assert _poll(e)["server_load"] == 0


def test_the_reader_refuses_what_a_router_refuses():
    # read_load_report is the router's reader: it has teeth.
    ok = {"server_load": 0, "sim_ms": 0.0, "speedup": 1.0, "ranks": []}
    two = {"version": 1, "keys": "0" * 15 + "2" + "0" * 15 + "1", "tokens": "0" * 16, "tiers": "11"}
    for bad, why in [
        ({**ok, "residency": {**two, "version": 2}}, "version"),
        ({**ok, "residency": two}, "ascending"),
        ({**ok, "residency": {**two, "tiers": "1"}}, "hex digits"),
        ({"server_load": 0}, "not a load report"),
    ]:
        with pytest.raises(CallerError, match=why):
            read_load_report(json.dumps(bad).encode())
    assert read_load_report(json.dumps(ok).encode())["residency"] is None


def test_no_port_no_listener_and_a_taken_port_fails_at_start_by_name():
    e = Engine(extra={"host_bytes": 0}, num_blocks=16)
    assert e.sched_connector.residency is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(ValueError, match="residency_port"):
            Engine(extra={**LOCAL, "residency_port": taken}, num_blocks=16)


# ---------------------------------------------------------------- through Envoy


def _stat(admin: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter={name}", timeout=2) as r:
        m = re.search(rf"{name}: (\d+)", r.read().decode())
    return int(m.group(1)) if m else 0


def test_the_filter_in_envoy_polls_the_connector_port(engines):
    """docs/vllm.md's deployment: the filter's ``load.cluster`` is an ORIGINAL_DST
    cluster that keeps the endpoint's address and overrides its port with the
    connector's; the real filter reads each reply as its load view."""
    e = engines({"host_bytes": 0}, num_blocks=32)
    e.serve("g1", tokens(60, 3 * BS + 1), tether("gw"))
    polls = 0
    report = e.sched_connector.residency._report

    def counted() -> bytes:
        nonlocal polls
        polls += 1
        return report()

    e.sched_connector.residency._report = counted
    vllm_port = free_port()  # where vLLM's API server would listen (nothing here)
    with tempfile.TemporaryDirectory(prefix="tether-residency-") as work:
        listen, admin = free_port(), free_port()
        plugin = {"outputs": ["pick", "vllm"], "load": {"cluster": "tether-load", "poll_ms": 100}}
        bootstrap = render(work, f"127.0.0.1:{vllm_port}", plugin, listen, admin)
        cfg = yaml.safe_load(bootstrap.read_text())
        cfg["static_resources"]["clusters"].append(
            {
                "name": "tether-load",
                "type": "ORIGINAL_DST",
                "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "1s",
                "original_dst_lb_config": {
                    "use_http_header": True,
                    "http_header_name": "x-gateway-destination-endpoint",
                    "upstream_port_override": e.sched_connector.residency.port,
                },
            }
        )
        bootstrap.write_text(yaml.safe_dump(cfg))
        log = Path(work, "envoy.log")
        with running(bootstrap, admin, log):
            deadline = time.monotonic() + 30
            while _stat(admin, "tether_load_poll_ok") < 2:
                assert time.monotonic() < deadline, f"no polls read: {log.read_text()[-3000:]}"
                time.sleep(0.1)
            assert _stat(admin, "tether_load_poll_bad") == 0
            assert polls >= 2
