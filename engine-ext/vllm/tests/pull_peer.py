"""A holder for the state-pull tests: a harness ``Engine`` (vLLM's real scheduler, the
connector, a NIXL agent) in its own process, driven by JSON lines on stdin.

``python pull_peer.py '<Engine kwargs as JSON>'`` prints ``{"port": residency port}``
once ready, then answers one JSON line per command:

- ``{"op": "serve", "id", "tokens", "params", "max_tokens"}`` → ``{"out": tokens}`` (the
  ledger's clock one second later than the previous turn's)
- ``{"op": "step", "n"}`` → ``{}`` (empty steps: the worker reads notifications)
- ``{"op": "stats"}`` → the connector's counters, ``mismatched`` positions, ``payloads``
- ``{"op": "held", "tokens"}`` → ``{"held": [bool per whole block]}`` (host payloads)
- ``{"op": "corrupt", "tokens", "block"}`` → ``{"ok": bool}`` (flips a payload byte)
"""

from __future__ import annotations

import json
import os
import sys

# Replies go to the original stdout; everything else (NIXL logs to stdout) to stderr.
REPLIES = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)

from harness import Engine  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.request import Request  # noqa: E402


def block_hashes(e: Engine, tokens: list[int]) -> list[bytes]:
    """vLLM's block hashes of ``tokens`` in this process (its own NONE_HASH)."""
    req = Request(
        request_id="peer-hash",
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(e.block_size, sha256),
    )
    return list(req.block_hashes)


def main() -> None:
    e = Engine(**json.loads(sys.argv[1]))
    out = REPLIES
    print(json.dumps({"port": e.sched_connector.residency.port}), file=out, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "serve":
            # The ledger's clock moves a second per turn: the host tier evicts the least
            # recently used turn only for one used later.
            e.now_ms += 1000
            got = e.serve(cmd["id"], cmd["tokens"], cmd.get("params"),
                          max_tokens=cmd.get("max_tokens", 1))
            reply = {"out": got}
        elif op == "step":
            for _ in range(cmd.get("n", 1)):
                e.step()
            reply = {}
        elif op == "stats":
            reply = dict(e.sched_connector.connector_stats())
            reply["mismatched"] = e.mismatched_positions
            reply["payloads"] = len(e.worker.copier)
        elif op == "held":
            reply = {"held": [e.worker.copier.contains(h) for h in block_hashes(e, cmd["tokens"])]}
        elif op == "corrupt":
            h = block_hashes(e, cmd["tokens"])[cmd["block"]]
            reply = {"ok": e.worker.copier.corrupt(h)}
        else:
            reply = {"error": f"unknown op {op!r}"}
        print(json.dumps(reply), file=out, flush=True)


if __name__ == "__main__":
    main()
