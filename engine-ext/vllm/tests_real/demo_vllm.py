"""`make demo-vllm`: the demo's three settings through real engines, and the simulator
checked against them (issue 26; docs/vllm-real.md "The demo on real engines").

A slice of a bundled agent trace (the first ``--sessions`` sessions) is replayed by
``tether replay`` through real Envoy + the tether filter in front of real vLLM processes
(the CPU build in ``.venv-engine`` serving the tiny Llama with the word-level tokenizer,
``tiny_model.make(words=True)``), under

- (a) round robin + LRU: plain vLLM prefix caching, Envoy round robin;
- (b) tether routing + LRU: pick mode; ``TetherConnector`` with ``retention: false``
  (it serves the residency/load endpoint the filter polls, retains nothing);
- (c) tether routing + retention + host tier: ``TetherConnector`` retaining turn ends with
  a host tier.

Each replay writes the same report as ``make demo`` (``tether replay``: hit ratio from each
answer's ``usage.prompt_tokens_details.cached_tokens``), and beside it vLLM's own counters
(``/metrics``: prefix-cache queries and hits, device and connector) and the connector's
(``GET /stats``); ``tether compare`` puts the three side by side.

``--check-sim`` then replays the same slice twice more per cache setting under the same
routing — Envoy in hash mode (MAGLEV on the filter's key, no load bound: the placement is a
function of the key and the addresses alone) — once through the real engines and once
through ``tether-rank`` processes on the same addresses with the engines' KV capacity, block
size and batch limits, and compares cached tokens request by request
(``sim-vs-engine.json`` / ``.md``).

The word-level tokenizer counts a synthesized Chat body exactly as tether-rank's simulated
tokenizer does (one word, one token, the canonical order), so prompt lengths and block
boundaries agree on both sides: what the comparison measures is the cache, not the
tokenizers. That is an assumption of the check, stated in the report, not a property of
real tokenizers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# The Envoy helpers of the scheduler suite (../tests/gateway.py), as conftest.py adds them.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "tests"))

import calibrate  # noqa: E402
import tiny_model  # noqa: E402
from engines import BLOCK, Server, serving, wait_ready  # noqa: E402
from fleet import PLUGIN, gateway, stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "examples/traces/agent-demo.jsonl"
PROFILE = ROOT / "examples/profiles/llama-3.1-8b-fp8-h200-tp1.json"
# The synthesized Chat bodies carry `tools` and tool calls: vLLM serves those only with a
# tool parser (any: the tiny model's words never parse as a call).
TOOL_ARGS = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic")
# The tiny model's KV bytes per token: 2 layers × (K, V) × 2 heads × 32 × 2 bytes.
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 2
BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class Setting:
    name: str
    title: str
    mode: str  # the gateway's --mode
    connector: dict | None  # TetherConnector's extra config; None: plain vLLM
    cache: str  # the matching tether-rank --cache


def settings(host_bytes: int) -> tuple[Setting, ...]:
    return (
        Setting("a-round-robin-lru", "(a) round robin + LRU", "round-robin", None, "lru"),
        Setting("b-tether-lru", "(b) tether routing + LRU", "pick",
                {"retention": False, "host_bytes": 0}, "lru"),
        Setting("c-tether-retention-host", "(c) tether + retention + host tier", "pick",
                {"host_bytes": host_bytes}, "retention-host"),
    )


def plugin_for(s: Setting) -> dict:
    if s.mode == "round-robin":
        return {}
    return PLUGIN


def engines(s: Setting, a: argparse.Namespace, logs: Path) -> list[Server]:
    return [Server(f"{s.name}-{i}", f"127.0.0.{2 + i}", a.blocks, s.connector,
                   logs / f"{s.name}-{i}.log", a.max_len,
                   (*TOOL_ARGS, "--max-num-batched-tokens", str(BATCHED_TOKENS)))
            for i in range(a.engines)]


def tether(*args: str) -> None:
    cli = os.environ.get("TETHER_CLI", str(ROOT / "target/release/tether"))
    subprocess.run([cli, *args], check=True)


def slice_trace(src: Path, sessions: int, max_output: int, out: Path) -> Path:
    """The first ``sessions`` sessions of a tether trace (by ``start_ms``), every answer
    capped at ``max_output`` tokens, written to ``out``. Capping changes no prompt (a
    synthesized turn carries the trace's own assistant text, whatever the engine
    generated); it only spares the CPU engines decode steps they cannot follow the
    trace's clock with."""
    records = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    starts = sorted((r["start_ms"], r["id"]) for r in records if r["type"] == "session")
    keep = {sid for _, sid in starts[:sessions]}
    with out.open("w") as f:
        for r in records:
            if r["type"] == "session" and r["id"] not in keep:
                continue
            if r["type"] != "session" and "session" in r and r["session"] not in keep:
                continue
            if r["type"] == "request":
                r["output_tokens"] = min(r["output_tokens"], max_output)
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return out


def replay(a: argparse.Namespace, url: str, admin: int, label: str, out: Path,
           trace: Path | None = None) -> dict:
    """``tether replay`` of ``trace`` (the slice by default); its report."""
    tether("replay", str(trace or a.slice), "--target", url, "--gateway-admin", f"127.0.0.1:{admin}",
           "--model", "tiny", "--exact-output",
           "--speedup", str(a.speedup), "--timeout-s", "900", "--max-error-rate", "0",
           "--label", label, "--out", str(out), "--quiet")
    return json.loads((out / "report.json").read_text())


VLLM_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total",
                 "vllm:prompt_tokens_total", "vllm:num_preemptions_total")
CONNECTOR_COUNTERS = ("loaded_blocks", "load_failed_blocks", "saved_blocks", "yielded_to_host")


def counters(servers: list[Server]) -> dict:
    """vLLM's counters and the connector's, summed over the engines."""
    out = dict.fromkeys(VLLM_COUNTERS, 0.0)
    for s in servers:
        m = s.metrics()
        for k in VLLM_COUNTERS:
            out[k] += m.get(k, 0.0)
        if s.connector is not None:
            st = stats(s)
            for k in CONNECTOR_COUNTERS:
                out[f"connector:{k}"] = out.get(f"connector:{k}", 0) + int(st.get(k, 0))
    q = out["vllm:prefix_cache_queries_total"]
    hits = out["vllm:prefix_cache_hits_total"] + out["vllm:external_prefix_cache_hits_total"]
    out["hit_ratio"] = hits / q if q else 0.0
    return out


def pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def demo(a: argparse.Namespace, model: Path) -> None:
    rows = []
    for s in settings(a.host_bytes):
        t0 = time.monotonic()
        out = a.out / s.name
        with serving(model, engines(s, a, a.out / "logs")) as servers, \
                gateway(servers, plugin_for(s), s.mode) as gw:
            r = replay(a, gw.url, gw.admin, s.title, out)
            c = counters(servers)
        (out / "engine-counters.json").write_text(json.dumps(c, indent=1))
        rows.append((s, r, c))
        print(f"{s.title:<38} {r['requests']['completed']} requests, {r['requests']['errors']} errors,"
              f" {time.monotonic() - t0:.0f} s", flush=True)
    tether("compare", *(str(a.out / s.name) for s, _, _ in rows), "--out", str(a.out / "compare"))
    lines = [
        "| setting | hit ratio (usage.cached_tokens) | hit ratio (vLLM counters) | prompt tokens computed | host restores (blocks) | preemptions |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s, r, c in rows:
        computed = c["vllm:prompt_tokens_total"] - c["vllm:prefix_cache_hits_total"] \
            - c["vllm:external_prefix_cache_hits_total"]
        lines.append(f"| {s.title} | {pct(r['hit_ratio']['overall'])} | {pct(c['hit_ratio'])} |"
                     f" {computed:,.0f} | {c.get('connector:loaded_blocks', 0):,} |"
                     f" {c['vllm:num_preemptions_total']:.0f} |")
    table = "\n".join(lines)
    (a.out / "summary.md").write_text(table + "\n")
    print("\n" + table)


# ---- the simulator checked against the engine ----------------------------------------------


@contextlib.contextmanager
def ranks(s: Setting, a: argparse.Namespace, logs: Path, timing: Path) -> Iterator[list[Server]]:
    """``tether-rank`` processes on the engines' addresses with the engines' KV capacity
    (vLLM keeps one of its blocks as the null block), block size, batch limits and host
    tier, timed by the profile at ``timing`` (``calibrate.py``'s, or the H200 one)."""
    binary = os.environ.get("TETHER_RANK", str(ROOT / "target/release/tether-rank"))
    profile = json.loads(timing.read_text())
    servers = [Server(f"{e.name}-rank", e.host, e.blocks, None, e.log.with_suffix(".rank.log"))
               for e in engines(s, a, logs)]
    try:
        for e in servers:
            argv = [binary, "--listen", e.address, "--profile", str(timing), "--cache", s.cache,
                    "--kv-tokens", str((a.blocks - 1) * BLOCK), "--block-size", str(BLOCK),
                    "--max-num-seqs", "8", "--max-num-batched-tokens", str(BATCHED_TOKENS),
                    "--max-model-len", str(a.max_len), "--speedup", "1",
                    "--served-model-name", "tiny", "--rank-id", e.address, "--vllm-tail-blocks"]
            if s.cache == "retention-host":
                # The same host tier in tokens: the connector's bytes at the tiny model's KV
                # bytes per token, in the profile's.
                tokens = a.host_bytes / KV_BYTES_PER_TOKEN
                argv += ["--host-gib", str(tokens * profile["kv_bytes_per_token"] / 2**30)]
            with open(e.log, "w") as log:
                e.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        wait_ready(servers)
        yield servers
    finally:
        for e in servers:
            e.stop()


def per_request(out: Path) -> dict[int, tuple[int, int]]:
    """Request index → (prompt tokens, cached tokens) of every served request of a report."""
    rows = {}
    for line in (out / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if (served := r["outcome"].get("served")) is not None:
            rows[r["request"]] = (int(served["prompt_tokens"]), int(served["cached_tokens"]))
    return rows


SIM_PLUGIN = {"outputs": ["hash", "vllm", "debug"]}


def measured_profile(a: argparse.Namespace, model: Path) -> Path:
    """The engine's speed as a profile (``calibrate.py``), measured on engines of their
    own so that no calibration prompt sits in a replayed engine's cache."""
    out = a.out / "sim-check" / "profile.json"
    logs = a.out / "logs" / "calibrate"
    logs.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    b = settings(a.host_bytes)[1]
    with serving(model, engines(b, a, logs)) as servers:
        measured = calibrate.profile(servers[0], json.loads(PROFILE.read_text()),
                                     (a.blocks - 1) * BLOCK, a.max_len)
    out.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"engine speed measured: {out}")
    return out


def check_sim(a: argparse.Namespace, model: Path) -> None:
    timing = measured_profile(a, model) if a.timing == "measured" else PROFILE
    results = {}
    for s in settings(a.host_bytes):
        if s.name == "a-round-robin-lru":
            continue
        sim_s = Setting(s.name, s.title, "hash", s.connector, s.cache)
        engine_out, sim_out = a.out / "sim-check" / f"{s.cache}-engine", a.out / "sim-check" / f"{s.cache}-rank"
        with serving(model, engines(sim_s, a, a.out / "logs")) as servers, \
                gateway(servers, SIM_PLUGIN, "hash") as gw:
            replay(a, gw.url, gw.admin, f"vLLM, {s.cache}", engine_out)
        arrivals = None
        if a.arrivals == "engine":
            arrivals = as_sent(a.slice, engine_out, a.out / "sim-check" / f"{s.cache}-arrivals.jsonl")
        with ranks(sim_s, a, a.out / "logs", timing) as servers, gateway(servers, SIM_PLUGIN, "hash") as gw:
            replay(a, gw.url, gw.admin, f"tether-rank, {s.cache}", sim_out, arrivals)
        results[s.cache] = agreement(by_file_position(per_request(engine_out), a.slice),
                                     by_file_position(per_request(sim_out), arrivals or a.slice))
    report = {**results, "timing": {"profile": str(timing), "source": a.timing},
              "arrivals": a.arrivals}
    (a.out / "sim-vs-engine.json").write_text(json.dumps(report, indent=1))
    lines = ["| cache | requests | hit ratio, engine | hit ratio, tether-rank | difference (points) |"
             " equal within one block | equal |", "|---|---:|---:|---:|---:|---:|---:|"]
    for cache, r in results.items():
        lines.append(f"| {cache} | {r['requests']} | {pct(r['engine_hit'])} | {pct(r['sim_hit'])} |"
                     f" {100 * (r['sim_hit'] - r['engine_hit']):+.2f} | {pct(r['within_block'])} |"
                     f" {pct(r['equal'])} |")
    source = "the engine, measured by calibrate.py" if a.timing == "measured" else "an H200"
    lines.append(f"\ntether-rank timed by {timing.name} ({source}); routing: Envoy hash mode"
                 " on the filter's key; tokenizer: word-level on both sides; arrivals: "
                 + ("each request when the engine run sent it." if a.arrivals == "engine"
                    else "the trace's, both sides behind it as far as their own speed puts them."))
    table = "\n".join(lines)
    (a.out / "sim-vs-engine.md").write_text(table + "\n")
    print("\n" + table)


def as_sent(slice_path: Path, engine_out: Path, out: Path) -> Path:
    """The slice with every request's arrival moved to when the engine run sent it.

    A replay sends a turn at its trace time or when its predecessor's answer is in, whichever
    is later. CPU engines fall behind the trace's clock, and by other amounts than the ranks
    timed by a calibrated profile do (the machine's other load moves the engines, not the
    ranks), so under the trace's own arrivals the two sides serve concurrent sessions in
    different orders — and an LRU queue near capacity evicts different prefixes for it. The
    ranks, faster than the engines, replay these arrivals at the times the engines saw them:
    what differs then is the cache, not the clock. ``sent_ms`` is in trace milliseconds
    since the replay's start, the clock ``at_ms`` is read on."""
    records = [json.loads(line) for line in slice_path.read_text().splitlines() if line.strip()]
    requests = [r for r in records if r["type"] == "request"]
    order = replay_order(records)
    sent = {}
    for line in (engine_out / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        sent[order[r["request"]]] = round(r["sent_ms"])
    missing = [i for i in range(len(requests)) if i not in sent]
    if missing:
        raise SystemExit(f"{engine_out}: no send time for requests {missing[:5]}; cannot replay"
                         " the engine's arrivals")
    # Sessions keep their start (a replay numbers requests in session-start order, and the
    # comparison joins the two runs by that number); the trace time a replay's clock starts
    # at is the earliest session start.
    origin = min(r["start_ms"] for r in records if r["type"] == "session")
    starts = {r["id"]: r["start_ms"] for r in records if r["type"] == "session"}
    last: dict[tuple[str, str], int] = {}
    with out.open("w") as f:
        index = 0
        for r in records:
            if r["type"] == "request":
                agent = (r["session"], r["agent"])
                # A request is never sent before its trace time, so this is at least the
                # trace's `at_ms`; `at_ms` never decreases within an agent (the format's rule).
                r["at_ms"] = max(origin + sent[index] - starts[r["session"]], last.get(agent, 0))
                last[agent] = r["at_ms"]
                index += 1
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return out


def replay_order(records: list[dict]) -> list[int]:
    """For each request number a replay's report uses, the request's position in the trace
    file: the trace loader numbers sessions by their first arrival (ties in file order), and
    a session's requests by ``at_ms`` (ties in file order) — so moving arrivals renumbers
    requests, and two runs of different arrivals are joined through this."""
    starts = {r["id"]: r.get("start_ms", 0) for r in records if r["type"] == "session"}
    sessions: dict[str, list[tuple[int, int]]] = {}
    for i, r in enumerate(r for r in records if r["type"] == "request"):
        sessions.setdefault(r["session"], []).append((r["at_ms"], i))
    rank = {sid: n for n, sid in enumerate(starts)}
    keyed = sorted(sessions.items(),
                   key=lambda kv: (starts.get(kv[0], 0) + min(at for at, _ in kv[1]),
                                   rank.get(kv[0], len(rank))))
    return [i for _, reqs in keyed for _, i in sorted(reqs)]


def by_file_position(rows: dict[int, tuple[int, int]], trace: Path) -> dict[int, tuple[int, int]]:
    """``per_request``'s rows keyed by the request's position in ``trace`` (``replay_order``)."""
    records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    order = replay_order(records)
    return {order[n]: row for n, row in rows.items()}


def agreement(engine: dict[int, tuple[int, int]], sim: dict[int, tuple[int, int]]) -> dict:
    both = sorted(set(engine) & set(sim))
    pe = ce = cs = within = equal = 0
    worst = []
    for i in both:
        (p, c_e), (p_s, c_s) = engine[i], sim[i]
        pe, ce, cs = pe + p, ce + c_e, cs + c_s
        within += abs(c_e - c_s) <= BLOCK
        equal += c_e == c_s
        if p != p_s or abs(c_e - c_s) > BLOCK:
            worst.append({"request": i, "prompt_engine": p, "prompt_sim": p_s,
                          "cached_engine": c_e, "cached_sim": c_s})
    n = max(len(both), 1)
    return {"requests": len(both), "only_engine": len(set(engine) - set(sim)),
            "only_sim": len(set(sim) - set(engine)), "engine_hit": ce / max(pe, 1),
            "sim_hit": cs / max(pe, 1), "within_block": within / n, "equal": equal / n,
            "differing": worst}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--sessions", type=int, default=8, help="replay the first N sessions")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--blocks", type=int, default=1024, help="KV blocks per engine (32 tokens each)")
    p.add_argument("--max-len", type=int, default=32000, help="vLLM --max-model-len")
    p.add_argument("--host-bytes", type=int, default=1 << 30, help="host tier per engine in (c)")
    p.add_argument("--max-output", type=int, default=32, help="cap on every answer's tokens")
    p.add_argument("--speedup", type=float, default=4.0, help="the trace's clock, compressed")
    p.add_argument("--out", type=Path, default=ROOT / "target/demo-vllm")
    p.add_argument("--check-sim", action="store_true", help="also compare tether-rank with the engines")
    p.add_argument("--only-check-sim", action="store_true", help="the comparison only")
    p.add_argument("--timing", choices=("measured", "h200"), default="measured",
                   help="tether-rank's speed in the check: the engine's, measured (calibrate.py),"
                        " or the H200 profile's")
    p.add_argument("--arrivals", choices=("engine", "trace"), default="engine",
                   help="the ranks' arrivals in the check: when the engine run sent each request,"
                        " or the trace's own (each side as far behind as its speed puts it)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "logs").mkdir(exist_ok=True)
    model = tiny_model.make(a.out / "model", words=True, max_len=a.max_len)
    a.slice = slice_trace(a.trace, a.sessions, a.max_output, a.out / "slice.jsonl")
    if not a.only_check_sim:
        demo(a, model)
    if a.check_sim or a.only_check_sim:
        check_sim(a, model)


if __name__ == "__main__":
    sys.exit(main())
