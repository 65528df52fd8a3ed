"""Markers written by the real filter in real Envoy reach the real TetherConnector.

The chain a vLLM deployment runs: ``tether gateway`` renders the Envoy bootstrap
(pick mode, outputs ``pick`` + ``vllm``), Envoy 1.40 runs the built
``tether_filter.wasm``, and the filter writes the turn markers into the request
body's ``kv_transfer_params.tether`` (custom headers never reach a connector). A
small echo upstream stands in for vLLM's API server and returns what it received;
the echoed ``kv_transfer_params`` and ``x-session-id`` then become a vLLM
``Request`` scheduled by vLLM's own ``Scheduler`` with ``TetherConnector``
(``harness.Engine``), and the test checks the retention the connector records.

Needs ``make wasm``, ``make envoy-install`` and the ``tether`` CLI
(``cargo build -p tether-fleet --bin tether``); ``make test-vllm`` builds them
first. A missing piece is a failure, never a skip.
"""

from __future__ import annotations

import http.server
import json
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateway import free_port, render, running
from harness import Engine
from tether_vllm import parse_marker

BS = 16
# The filter's own retention interval for a tool turn (tether-wire's default,
# docs/wire.md): what the gateway writes for a conversation ending in a tool result.
TOOL_MS = 120_000


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the headers and the body it received, as JSON."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)[:size]
                if size == 0:
                    break
                body += chunk
        else:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
        out = json.dumps(
            {
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body.decode("utf-8"),
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def gateway():
    """Envoy + the tether filter (outputs pick + vllm) in front of an echo upstream."""
    echo = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="tether-gw-vllm-") as work:
            listen, admin = free_port(), free_port()
            bootstrap = render(
                work, f"127.0.0.1:{echo.server_address[1]}", {"outputs": ["pick", "vllm"]},
                listen, admin,
            )
            with running(bootstrap, admin, Path(work, "envoy.log")):
                yield f"http://127.0.0.1:{listen}"
    finally:
        echo.shutdown()
        echo.server_close()


def _chat(kv_transfer_params=None) -> dict:
    """An agent's chat request ending with a tool result (a `tool` turn)."""
    body = {
        "model": "tiny",
        "session_id": "agent-run-42",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "fix the build"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{\"cmd\": \"make\"}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "error: x"},
        ],
    }
    if kv_transfer_params is not None:
        body["kv_transfer_params"] = kv_transfer_params
    return body


def _through(gateway: str, body: dict) -> tuple[dict, dict]:
    """Sends a chat request through Envoy; returns (headers, JSON body) the upstream got."""
    req = urllib.request.Request(
        gateway + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        echo = json.loads(r.read())
    return echo["headers"], json.loads(echo["body"])


SPOOF = {
    "tether": {
        "session": "ffffffffffffffff",
        "prompt_end": "1",
        "turn_kind": "first",
        "retention_ms": "3000000",
    },
    "do_remote_prefill": False,
    "remote_port": 5600,
}


def _tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 997 + 1 for i in range(n)]


def _retained_until(params: dict, session_id: str | None) -> int:
    """Serves one 4-block prompt with these params; returns the first time (ms,
    among the probes) at which the connector no longer holds its blocks."""
    e = Engine(extra={"host_bytes": 0}, num_blocks=32)
    e.serve("g1", _tokens(3, 4 * BS + 1), params, session_id=session_id)
    assert e.sched_connector.ledger.held_blocks == 4, "the turn was not retained"
    assert e.mismatched_positions == 0
    for t in (TOOL_MS - 1, TOOL_MS, 300_000, 3_600_000):
        e.now_ms = t
        e.step()  # an empty step still runs the connector's expiry
        if e.sched_connector.ledger.held_blocks == 0:
            assert e.sched_connector.ledger.stats()["expired"] == 1
            return t
    return -1


def test_gateway_markers_reach_the_connector(gateway):
    headers, sent = _through(gateway, _chat())
    kv = sent["kv_transfer_params"]
    # What the filter wrote is what the connector reads: a tool turn with the
    # filter's interval, keyed on the gateway's session hash.
    marker = parse_marker(kv["tether"])
    assert marker is not None and marker.prompt_end
    assert marker.kind == "tool"
    assert marker.retention_ms == TOOL_MS
    # No custom header reaches the engine; the session does, as vLLM's session_id.
    assert not [h for h in headers if h.startswith("x-tether-")], headers
    session_id = headers.get("x-session-id")
    assert session_id and len(session_id) == 16
    assert sent["messages"] == _chat()["messages"]
    # vLLM's scheduler with TetherConnector retains the turn for the tool interval.
    assert _retained_until(kv, session_id) == TOOL_MS


def test_a_client_cannot_spoof_the_markers(gateway):
    _, honest = _through(gateway, _chat())
    _, sent = _through(gateway, _chat(SPOOF))
    kv = sent["kv_transfer_params"]
    # The client's own tether object never gets through; its other parameters do.
    assert kv["tether"] == honest["kv_transfer_params"]["tether"]
    assert kv["do_remote_prefill"] is False and kv["remote_port"] == 5600
    assert _retained_until(kv, None) == TOOL_MS
    # Control: had the spoofed object reached the connector, it would have held
    # the blocks far longer (so the check above can fail).
    assert _retained_until(SPOOF, None) != TOOL_MS


def test_a_body_that_cannot_be_rewritten_is_refused(gateway):
    # Not JSON: the filter cannot guarantee no client markers, so it refuses.
    req = urllib.request.Request(
        gateway + "/v1/chat/completions",
        data=b'{"messages": [{"role": "user", "content": "x"}], "kv_transfer_params": {"tether"',
        headers={"content-type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
