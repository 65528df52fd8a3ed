"""The scheduler side of a state pull (docs/vllm.md, "State pull (NIXL)").

``LeaseBook`` is the holder: at each retained prompt end it records the pull chain of the
retained blocks; it learns where the worker keeps their payloads from the worker's
reports, and answers ``/pull/*`` on the residency listener — a lease names the payloads'
addresses and checksums and keeps them from being freed until it is released (NIXL
notification or HTTP) or expires. Its scheduler schedules nothing for a pull.

``Puller`` is the new home: for a request whose marker names ``pull_from`` it asks the
holder for a lease in a background thread (the scheduler answers vLLM "not yet"
meanwhile), turns a granted lease into an asynchronous external hit, hands the READ to
the worker, renews the lease while the READ runs and releases it when the worker is done.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tether_vllm._native import PullSource, http_post, pull_chain

logger = logging.getLogger("tether_vllm")

MAX_CHAIN = 65_536  # pull chain entries a lease request may carry
PRUNE_EVERY_MS = 10_000  # how often chains of keys the ledger let go are dropped


def now_ms() -> int:
    """Leases run on wall time (monotonic), whatever clock the ledger is given."""
    return int(time.monotonic() * 1000)


def fingerprint(vllm_config: Any, kv_cache_config: Any) -> str:
    """What two engines must share for one's KV bytes to be the other's: the served model
    name, architecture, KV dtype and shape, layers and page bytes."""
    mc = vllm_config.model_config
    name = getattr(mc, "served_model_name", None) or mc.model
    if isinstance(name, (list, tuple)):
        name = name[0] if name else mc.model
    arch = ",".join(getattr(mc.hf_config, "architectures", None) or ["?"])
    g = kv_cache_config.kv_cache_groups[0]
    s = g.kv_cache_spec
    dtype = str(getattr(s, "dtype", "?")).removeprefix("torch.")
    heads, head = getattr(s, "num_kv_heads", "?"), getattr(s, "head_size", "?")
    return (
        f"{name}|{arch}|{dtype}|bs={s.block_size}|kv={heads}x{head}"
        f"|layers={len(g.layer_names)}|page={s.page_size_bytes}"
    )


def chain_of(tokens: list[int], block_size: int, salt: str | None) -> list[bytes]:
    """The pull chain of ``tokens``' whole blocks (``PullSource`` matches it)."""
    return pull_chain(list(tokens), block_size, salt or "")


def _json(status: int, obj: Any) -> tuple[int, bytes]:
    return status, json.dumps(obj).encode()


def _error(status: int, msg: str) -> tuple[int, bytes]:
    return _json(status, {"error": msg})


class BadRequest(ValueError):
    """A lease request the holder refuses with 400."""


def _body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"not JSON ({e})") from None
    if not isinstance(body, dict):
        raise BadRequest("not a JSON object")
    return body


def _lease_id(body: dict) -> str:
    lease = body.get("lease")
    if not isinstance(lease, str) or not 0 < len(lease) <= 64:
        raise BadRequest("lease: expected the lease id string")
    return lease


class LeaseBook:
    """The holder's side; every ``PullSource`` call is made under ``lock`` (the scheduler
    thread and the listener thread both reach it)."""

    def __init__(self, ledger: Any, lease_ms: int, fingerprint: str, block_bytes: int):
        self.ledger = ledger
        self.lease_ms = lease_ms
        self.fingerprint = fingerprint
        self.block_bytes = block_bytes
        self.source = PullSource()
        self.lock = threading.Lock()
        self.agents: list[tuple[str, bytes]] = []
        # Payload frees due from leases ended on the listener thread (the scheduler takes
        # them into its next metadata).
        self._frees: list[bytes] = []
        self._pruned_ms = now_ms()
        self.stats = {
            "leases_granted": 0,
            "leases_released": 0,
            "leases_expired": 0,
            "leases_notified": 0,
            "leased_blocks": 0,
        }

    # ---- the scheduler thread ------------------------------------------------------

    def record(self, key: int, hashes: list[bytes], tokens: Any, block_size: int,
               salt: str | None) -> None:
        """A retained prompt end: the pull chain of its blocks (``hashes``, vLLM's) beside
        their host ids. ``tokens`` is the request's token sequence; only the blocks after
        those the key's previous turn recorded are hashed (a turn resends its history)."""
        with self.lock:
            k = self.source.common(key, hashes)
            tail = list(tokens[k * block_size : len(hashes) * block_size])
            self.source.record(key, hashes, tail, k, block_size, salt or "")

    def worker_report(self, saved: list, lost: list[bytes], agents: list, notified: list[str]) -> None:
        with self.lock:
            if saved:
                self.source.saved(saved)
            if lost:
                self.source.lost(lost)
            if agents:
                self.agents = list(agents)
            for lease in notified:
                self.stats["leases_notified"] += 1
                self._end(lease)

    def frees(self, freed: list[bytes]) -> list[bytes]:
        """The ledger's frees the worker may run now, with those due from leases that
        ended (a leased payload's free waits for its lease)."""
        with self.lock:
            out = self.source.frees(freed) if freed else []
            out += self._frees
            self._frees = []
            return out

    def tick(self) -> None:
        """Expires leases; now and then drops chains of keys the ledger let go."""
        t = now_ms()
        with self.lock:
            self._expire(t)
            if t - self._pruned_ms >= PRUNE_EVERY_MS:
                self._pruned_ms = t
                self.source.prune(self.ledger)

    def _expire(self, t: int) -> None:
        n, frees = self.source.expire(t, self.ledger)
        if n:
            self.stats["leases_expired"] += n
            logger.info("state pull: %d lease(s) expired", n)
        self._frees += frees

    def _end(self, lease: str) -> bool:
        frees = self.source.release(lease, self.ledger)
        if frees is None:
            return False
        self.stats["leases_released"] += 1
        self._frees += frees
        return True

    def counters(self) -> dict[str, int]:
        with self.lock:
            out = dict(self.stats)
            out["leases_active"] = self.source.leases
            out["lease_held_blocks"] = self.source.pinned
            out["lease_deferred_frees"] = self.source.deferred
            out["pull_chains"] = self.source.keys
        return out

    # ---- the listener thread (docs/vllm.md, "Lease endpoints") ----------------------

    def _agent(self) -> tuple[tuple[str, bytes] | None, tuple[int, bytes] | None]:
        """The worker's agent, or the 503 that says why there is none to serve from."""
        if not self.agents:
            return None, _error(503, "the worker has not reported its NIXL agent yet")
        if len(self.agents) > 1:
            return None, _error(503, "more than one worker: pulls are served by one worker only")
        return self.agents[0], None

    def http_agent(self) -> tuple[int, bytes]:
        with self.lock:
            agent, refused = self._agent()
        if agent is None:
            return refused
        name, md = agent
        return _json(200, {"agent": name, "metadata": base64.b64encode(md).decode(),
                           "fingerprint": self.fingerprint, "block_bytes": self.block_bytes})

    def http_lease(self, raw: bytes) -> tuple[int, bytes]:
        try:
            body = _body(raw)
            key = body.get("key")
            if not isinstance(key, str) or len(key) != 16:
                raise BadRequest("key: expected 16 hex digits (a resident key)")
            key = int(key, 16)
            hashes = body.get("hashes")
            if not isinstance(hashes, list) or len(hashes) > MAX_CHAIN:
                raise BadRequest(f"hashes: expected a list of at most {MAX_CHAIN}")
            chain = [bytes.fromhex(h) for h in hashes if isinstance(h, str) and len(h) == 32]
            if len(chain) != len(hashes):
                raise BadRequest("hashes: each entry is 32 hex digits")
            start = body.get("start", 0)
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                raise BadRequest("start: expected an integer >= 0")
        except (BadRequest, ValueError) as e:
            return _error(400, str(e))
        if body.get("fingerprint") != self.fingerprint:
            return _error(409, f"fingerprint differs: holder {self.fingerprint!r}")
        lease = secrets.token_hex(16)
        with self.lock:
            agent, refused = self._agent()
            if agent is None:
                return refused
            t = now_ms()
            self._expire(t)
            blocks = self.source.lease(lease, key, chain, start, len(chain), t, self.lease_ms)
            if blocks:
                self.stats["leases_granted"] += 1
                self.stats["leased_blocks"] += len(blocks)
        name, md = agent
        return _json(200, {
            "lease": lease if blocks else None, "lease_ms": self.lease_ms, "start": start,
            "agent": name, "metadata": base64.b64encode(md).decode(),
            "block_bytes": self.block_bytes,
            "blocks": [{"addr": a, "len": self.block_bytes, "checksum": f"{c:032x}"}
                       for a, c in blocks],
        })

    def http_renew(self, raw: bytes) -> tuple[int, bytes]:
        try:
            lease = _lease_id(_body(raw))
        except BadRequest as e:
            return _error(400, str(e))
        with self.lock:
            t = now_ms()
            self._expire(t)
            ok = self.source.renew(lease, t, self.lease_ms)
        return _json(200, {"lease_ms": self.lease_ms}) if ok else _error(404, "unknown lease")

    def http_release(self, raw: bytes) -> tuple[int, bytes]:
        try:
            lease = _lease_id(_body(raw))
        except BadRequest as e:
            return _error(400, str(e))
        with self.lock:
            ok = self._end(lease)
        return _json(200, {}) if ok else _error(404, "unknown lease")

    def routes(self) -> tuple[dict, dict]:
        """``(GET routes, POST routes)`` for the residency listener."""
        return (
            {"/pull/agent": self.http_agent},
            {"/pull/lease": self.http_lease, "/pull/renew": self.http_renew,
             "/pull/release": self.http_release},
        )


# ---- the puller ------------------------------------------------------------------------


def post(host: str, port: int, path: str, obj: dict, timeout_s: float) -> tuple[int, dict]:
    """One JSON POST to a holder's listener (``host`` an IP address): ``(status, body)``
    (``{}`` when the body is not JSON); a connection that fails raises ``OSError``. The
    exchange runs in Rust with the GIL released (``_native.http_post``: why there)."""
    status, raw = http_post(host, port, path, json.dumps(obj).encode(), int(timeout_s * 1000))
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {}
    return status, body if isinstance(body, dict) else {}


@dataclass
class Grant:
    """A lease the holder granted: block ``start + i`` is ``blocks[i]``."""

    lease: str
    lease_ms: int
    start: int
    metadata: bytes
    blocks: list[tuple[int, int, int]]  # (address, bytes, checksum)


@dataclass
class _Pull:
    """One request's pull: asked (``result`` pending), granted, loading, or over."""

    host: str
    start: int
    asked: float
    state: str = "asking"
    result: Grant | str | None = None  # a grant, or why there is none
    grant: Grant | None = None
    renewed: float = 0.0
    block_ids: list[int] = field(default_factory=list)


def _grant(status: int, body: dict, block_bytes: int) -> Grant | str:
    """A lease answer as a usable grant, or the reason it is not one."""
    if status != 200:
        return f"holder answered {status}: {body.get('error', '')}"
    try:
        blocks = []
        for b in body.get("blocks") or []:
            if b["len"] != block_bytes:
                break  # never load a payload of another size
            blocks.append((int(b["addr"]), int(b["len"]), int(b["checksum"], 16)))
        if not blocks or not body.get("lease"):
            return "the holder holds none of the blocks"
        return Grant(str(body["lease"]), int(body["lease_ms"]), int(body["start"]),
                     base64.b64decode(body["metadata"], validate=True), blocks)
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        return f"a lease answer the puller cannot read ({e})"


class Puller:
    """The new home's side: one ``_Pull`` per request that asked."""

    def __init__(self, port: int, timeout_ms: int, fingerprint: str, block_size: int,
                 block_bytes: int, staging_blocks: int):
        self.port = port
        self.timeout_s = timeout_ms / 1000
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.block_bytes = block_bytes
        self.staging_blocks = staging_blocks
        self.pulls: dict[str, _Pull] = {}
        self.stats = {"pull_asked": 0, "pull_refused": 0, "pull_lease_ms": 0}

    def want(self, rid: str, host: str, key: int, chain: list[bytes], start: int) -> None:
        """Asks ``host`` for a lease on ``key``'s blocks ``start..len(chain)`` in a
        background thread; ``granted`` reads the answer."""
        p = self.pulls[rid] = _Pull(host, start, time.monotonic())
        self.stats["pull_asked"] += 1
        body = {"key": f"{key:016x}", "hashes": [c.hex() for c in chain], "start": start,
                "fingerprint": self.fingerprint, "puller": "tether_vllm"}

        def ask() -> None:
            try:
                status, answer = post(host, self.port, "/pull/lease", body, self.timeout_s)
                p.result = _grant(status, answer, self.block_bytes)
            except (OSError, ValueError) as e:
                p.result = f"holder {host}:{self.port} unreachable ({e})"

        threading.Thread(target=ask, name="tether-pull-lease", daemon=True).start()

    def granted(self, rid: str, start: int) -> int | None:
        """Blocks from ``start`` the request's lease covers; None while the holder has
        not answered; 0 when there is nothing to pull (refused, unreachable, timed out)."""
        p = self.pulls.get(rid)
        if p is None or p.state in ("loading", "over"):
            return 0
        if p.state == "asking":
            if p.result is None:
                if time.monotonic() - p.asked < self.timeout_s + 1:
                    return None
                p.result = "the lease request timed out"
            # From the ask to the scheduler seeing the answer (the request waited that long).
            self.stats["pull_lease_ms"] += int((time.monotonic() - p.asked) * 1000)
            if isinstance(p.result, str):
                self.stats["pull_refused"] += 1
                logger.info("request %s: no pull (%s); recomputing", rid, p.result)
                p.state = "over"
                return 0
            p.grant, p.state, p.renewed = p.result, "granted", time.monotonic()
        g = p.grant
        skip = start - g.start
        if skip < 0 or skip >= len(g.blocks):
            # The device hit shrank below the lease, or covers all of it: no pull.
            self.finish(rid)
            return 0
        return min(len(g.blocks) - skip, self.staging_blocks)

    def allocated(self, rid: str, start: int, block_ids: list[int]) -> tuple | None:
        """vLLM allocated ``block_ids`` for the granted blocks from ``start``: the worker's
        pull op ``(rid, lease, metadata, block ids, blocks)``."""
        p = self.pulls.get(rid)
        if p is None or p.grant is None or p.state != "granted":
            return None
        g = p.grant
        skip = start - g.start
        blocks = g.blocks[skip : skip + len(block_ids)]
        p.state, p.block_ids = "loading", list(block_ids)
        return (rid, g.lease, g.metadata, list(block_ids), blocks)

    def loading(self, rid: str) -> bool:
        p = self.pulls.get(rid)
        return p is not None and p.state == "loading"

    def finish(self, rid: str) -> None:
        """The request is done with its pull (the worker loaded it or gave up, or vLLM
        will not load it): the holder's lease is released; it never asks again."""
        p = self.pulls.get(rid)
        if p is None or p.state == "over":
            return
        p.state = "over"
        if p.grant is not None:
            self._send(p.host, "/pull/release", p.grant.lease)

    def forget(self, rid: str) -> None:
        """The request finished: its pull's state goes (a lease still held is released)."""
        self.finish(rid)
        self.pulls.pop(rid, None)

    def heartbeat(self) -> None:
        """Renews every lease held for a third of its term (its READ still pending)."""
        t = time.monotonic()
        for p in self.pulls.values():
            g = p.grant
            if g is not None and p.state in ("granted", "loading") and t - p.renewed > g.lease_ms / 3000:
                p.renewed = t
                self._send(p.host, "/pull/renew", g.lease)

    def _send(self, host: str, path: str, lease: str) -> None:
        def run() -> None:
            try:
                post(host, self.port, path, {"lease": lease}, self.timeout_s)
            except (OSError, ValueError) as e:
                logger.debug("state pull: %s to %s failed (%s)", path, host, e)

        threading.Thread(target=run, name="tether-pull-lease", daemon=True).start()
