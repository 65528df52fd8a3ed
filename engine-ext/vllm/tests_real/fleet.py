"""A real fleet for the end-to-end tests and the demo: vLLM servers behind real Envoy with
the built tether filter, and the three request APIs asked the same conversation.

``ask`` speaks Chat Completions, Responses and Anthropic Messages to vLLM (directly or
through Envoy) and reads back, in one shape, the answer's text, its per-token logprobs
(with the top alternatives; Messages has none) and the prompt tokens the engine served from
cache (``usage.prompt_tokens_details.cached_tokens``, ``usage.input_tokens_details
.cached_tokens``, ``usage.cache_read_input_tokens``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from engines import RESIDENCY_PORT, Server, post
from gateway import free_port, render, running

APIS = ("chat", "responses", "messages")
# How far a cold prefill's logprobs may sit from a cached prefill's (Answer.agrees_with):
# the tiny bf16 model's logits are large (its weights are drawn large so that a wrong KV
# block changes the answer), and vLLM computes a cold prompt's attention with its prefill
# kernel where a cached one reads paged bf16 KV — seen up to 0.22 apart on one CPU, 5e-4 on
# another, with the same greedy tokens.
LOGPROB_TOL = 0.3

@dataclass
class Answer:
    text: str
    logprobs: list | None  # [(token, logprob, [(alt, logprob), …]), …]; None for Messages
    cached: int  # prompt tokens served from cache (device hit or host restore)
    prompt: int  # prompt tokens
    debug: str  # the filter's x-tether-debug header ('' when asked directly)

    @property
    def endpoint(self) -> str:
        m = re.search(r"endpoint=([^;]+)", self.debug)
        return m.group(1) if m else ""

    def same_as(self, other: Answer) -> bool:
        """Bit-exact: the same text and the same logprobs to the last bit. What a host
        restore owes a device hit — both run the same suffix over the same KV values."""
        return (self.text, self.logprobs) == (other.text, other.logprobs)

    def agrees_with(self, other: Answer, tol: float = LOGPROB_TOL) -> bool:
        """What a cold prefill (or a recompute) owes a cached prefill of the same prompt:
        the same greedy tokens with logprobs within ``tol``, up to the first position
        where ``other`` had a near tie (its top two within ``2 * tol``) — there float
        noise may pick the other token and everything after differs legitimately. A
        token that differs where ``other`` was sure of it disagrees: wrong KV, not noise.
        Messages answers (no logprobs) compare their text."""
        return self.gap(other, tol) <= tol

    def gap(self, other: Answer, tol: float = LOGPROB_TOL) -> float:
        """The largest logprob difference over the positions compared by
        ``agrees_with`` (top alternatives where both list them); infinite where a token
        differs at a position ``other`` was sure of, or only one side has logprobs."""
        if self.logprobs is None or other.logprobs is None:
            same = self.logprobs is other.logprobs and self.text == other.text
            return 0.0 if same else math.inf
        worst = 0.0
        for i, (mine, theirs) in enumerate(zip(self.logprobs, other.logprobs)):
            (tok, lp, alts), (tok2, lp2, alts2) = mine, theirs
            if tok != tok2:
                near_tie = len(alts2) > 1 and alts2[0][1] - alts2[1][1] <= 2 * tol
                return worst if near_tie else math.inf
            theirs_by_token = dict(alts2)
            worst = max([worst, abs(lp - lp2),
                         *(abs(v - theirs_by_token[t]) for t, v in alts if t in theirs_by_token)])
        return worst if len(self.logprobs) == len(other.logprobs) else math.inf

def _chat(history: list[tuple[str, str]], n: int) -> tuple[str, dict]:
    return "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": r, "content": t} for r, t in history],
        "max_tokens": n, "temperature": 0, "logprobs": True, "top_logprobs": 2,
    }


def _responses(history: list[tuple[str, str]], n: int) -> tuple[str, dict]:
    return "/v1/responses", {
        "model": "tiny", "input": [{"role": r, "content": t} for r, t in history],
        "max_output_tokens": n, "temperature": 0, "top_logprobs": 2,
        "include": ["message.output_text.logprobs"],
    }


def _messages(history: list[tuple[str, str]], n: int) -> tuple[str, dict]:
    system = [t for r, t in history if r == "system"]
    body = {"model": "tiny", "max_tokens": n, "temperature": 0,
            "messages": [{"role": r, "content": t} for r, t in history if r != "system"]}
    if system:
        body["system"] = system[0]
    return "/v1/messages", body


def _read(api: str, r: dict) -> tuple[str, list | None, int, int]:
    if api == "chat":
        c = r["choices"][0]
        lps = [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
               for t in c["logprobs"]["content"]]
        u = r["usage"]
        return c["message"]["content"], lps, u["prompt_tokens_details"]["cached_tokens"], u["prompt_tokens"]
    if api == "responses":
        parts = [p for o in r["output"] if o.get("type") == "message" for p in o["content"]]
        lps = [(t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
               for p in parts for t in p.get("logprobs") or []]
        u = r["usage"]
        return "".join(p["text"] for p in parts), lps, u["input_tokens_details"]["cached_tokens"], u["input_tokens"]
    # Anthropic's usage splits the prompt: input_tokens excludes what was read from or
    # written to the cache.
    u = r["usage"]
    text = "".join(c["text"] for c in r["content"] if c["type"] == "text")
    read, written = u.get("cache_read_input_tokens") or 0, u.get("cache_creation_input_tokens") or 0
    return text, None, read, u["input_tokens"] + read + written


def ask(base: str, api: str, history: list[tuple[str, str]], *, marker: dict | None = None,
        headers: dict | None = None, n: int = 12, extra: dict | None = None) -> Answer:
    """One turn: ``history`` as (role, text) pairs, greedy, ``n`` tokens at most; ``extra``
    members are added to the body (``{"ignore_eos": True}``: exactly ``n`` tokens)."""
    path, body = {"chat": _chat, "responses": _responses, "messages": _messages}[api](history, n)
    body.update(extra or {})
    if marker is not None:
        body["kv_transfer_params"] = {"tether": marker}
    r = post(base, path, body, headers)
    text, lps, cached, prompt = _read(api, r)
    return Answer(text, lps, cached, prompt, r["_headers"].get("x-tether-debug", ""))


def marker(session: str, turn: int = 1, kind: str = "tool") -> dict:
    """A gateway's turn marker for a direct request (what the filter writes)."""
    return {"prompt_end": "1", "turn_kind": kind, "tenant": "00000000000000aa",
            "session": session, "subagent": "0000000000000000", "turn": str(turn)}


def flood(server: Server, tag: str, count: int = 2) -> None:
    """One-off requests that each need nearly the whole KV pool: plain prefix caching
    loses everything else, and retentions must yield to the host tier."""
    words = "agent tool call result " * ((server.blocks - 5) * 32 // 4)
    for i in range(count):
        ask(server.url, "chat", [("user", f"{tag} {i} {words}")], n=2)


def stats(server: Server) -> dict[str, int]:
    """The connector's counters (``GET /stats`` on the residency port)."""
    with urllib.request.urlopen(f"http://{server.host}:{RESIDENCY_PORT}/stats", timeout=10) as r:
        return json.load(r)


def envoy_stat(admin: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter={name}", timeout=5) as r:
        m = re.search(rf"{name}: (\d+)", r.read().decode())
    return int(m.group(1)) if m else 0


@dataclass
class Gateway:
    url: str
    admin: int
    log: Path


PLUGIN = {
    "outputs": ["pick", "vllm", "debug"],
    "load": {"cluster": "tether-load", "poll_ms": 100},
    # Two candidates (the whole fleet), no KV link between CPU engines: a key leaving an
    # overloaded holder recomputes on the other engine. No busy share: the tests' bound
    # arithmetic counts requests in flight, and a CPU engine busy for minutes reports a
    # share that raises the bound's total (docs/gateway.md, "Why the busy share"); the
    # share itself is tested in test_residency.py and the placement and harness tests.
    "residency": {"candidates": 2, "link_gbps": 0, "floor": 1, "factor": 1.5, "busy_weight": 0},
    "eject": {"failures": 1, "ms": 2000},
}


@contextlib.contextmanager
def gateway(servers: list[Server], plugin: dict | None = None, mode: str = "pick") -> Iterator[Gateway]:
    """Envoy (``tether gateway --mode MODE``) in front of ``servers``; with a ``load`` in the
    plugin configuration its load poll reaches every server's residency port through an
    ORIGINAL_DST cluster (docs/vllm.md), and the gateway is ready once each was polled."""
    plugin = PLUGIN if plugin is None else plugin
    with tempfile.TemporaryDirectory(prefix="tether-real-") as work:
        listen, admin = free_port(), free_port()
        ranks = ",".join(s.address for s in servers)
        bootstrap = render(work, ranks, plugin, listen, admin, mode)
        cfg = yaml.safe_load(bootstrap.read_text())
        cfg["static_resources"]["clusters"].append({
            "name": "tether-load", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "1s",
            "original_dst_lb_config": {"use_http_header": True,
                                       "http_header_name": "x-gateway-destination-endpoint",
                                       "upstream_port_override": RESIDENCY_PORT},
        })
        bootstrap.write_text(yaml.safe_dump(cfg))
        log = Path(work, "envoy.log")
        with running(bootstrap, admin, log):
            gw = Gateway(f"http://127.0.0.1:{listen}", admin, log)
            deadline = time.monotonic() + 30
            while "load" in plugin and envoy_stat(admin, "tether_load_poll_ok") < 2 * len(servers):
                assert time.monotonic() < deadline, f"no load polls: {log.read_text()[-3000:]}"
                time.sleep(0.1)
            yield gw


def wait_listed(server: Server, entries: int, timeout: float = 10.0) -> None:
    """Until ``server``'s residency lists at least ``entries`` states, then two poll periods
    more so every gateway has read it."""
    deadline = time.monotonic() + timeout
    while len(server.load()["residency"]["keys"]) // 16 < entries:
        assert time.monotonic() < deadline, server.load()
        time.sleep(0.05)
    time.sleep(0.3)


__all__ = ["APIS", "Answer", "Gateway", "ask", "envoy_stat", "flood", "gateway",
           "marker", "stats", "wait_listed"]
