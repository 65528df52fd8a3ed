#!/usr/bin/env python3
"""`tether plan` against an independent Dynamo-style oracle on steady traffic.

Writes steady traces (one request per session, arrivals evenly spaced at a
fixed rate, fixed ISL/OSL, a shared prefix for the cache-hit cases), computes
Dynamo's SLA-planner replica counts for each from the profile JSON here in
Python — its own interpolation, not tether's code — then runs `tether plan` on
each and prints, side by side, the oracle's counts, tether's no-reuse variant
(which must equal them: the same formulas, or a named term explains the
difference) and the configuration tether chose.

  python3 scripts/plan-oracle.py --tether target/release/tether \\
      --profile examples/profiles/llama-3.1-8b-fp8-h200-tp1.json --out /tmp/oracle

BENCHMARKS.md ("Planner") has the figures and the command.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

BLOCK = 64


def interp(points, x):
    """Linear interpolation through sorted (x, y) points, ends extended."""
    if len(points) == 1:
        return points[0][1]
    i = next((k for k, (px, _) in enumerate(points) if px >= x), None)
    i = 0 if i == 0 else (len(points) - 2 if i is None else i - 1)
    (x0, y0), (x1, y1) = points[i], points[i + 1]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


class Profile:
    def __init__(self, path):
        p = json.load(open(path))
        self.p = p
        self.prefill = sorted((q["isl"], q["ttft_ms"]) for q in p["prefill"]["points"])
        by = {}
        for q in p["decode"]["points"]:
            by.setdefault(q["context"], []).append((q["batch"], q["itl_ms"]))
        self.decode = sorted((c, sorted(v)) for c, v in by.items())

    def ttft(self, n):
        x0, y0 = self.prefill[0]
        return y0 * n / x0 if n < x0 else interp(self.prefill, n)

    def itl(self, b, ctx):
        return interp([(c, interp(v, b)) for c, v in self.decode], ctx)


def dynamo(prof, rate, isl, osl, itl_ms, max_num_seqs):
    """Dynamo planner_core.py, correction factors 1: engines per pool."""
    thpt_p = isl / prof.ttft(isl)  # tokens per ms per engine
    p = math.ceil(rate * isl / 1000.0 / thpt_p)
    ctx = isl + osl / 2.0
    kv = prof.p["max_kv_tokens"]
    best = 1
    for b in range(1, max_num_seqs + 1):
        if b * ctx > kv or prof.itl(b, ctx) > itl_ms:
            break
        best = b
    thpt_d = best / prof.itl(best, ctx)
    d = math.ceil(rate * osl / 1000.0 / thpt_d)
    return max(p, 1), max(d, 1), best


def write_trace(path, rate, seconds, isl, osl, hit):
    """One request per session, evenly spaced; `hit` of the prompt is a
    prefix every request shares (the rest its own)."""
    shared = int(isl * hit) // BLOCK
    own = math.ceil((isl - shared * BLOCK) / BLOCK)
    n = int(rate * seconds)
    with open(path, "w") as f:
        f.write(json.dumps({"type": "trace", "format": "tether-trace", "version": 1,
                            "block_size": BLOCK, "name": os.path.basename(path)}) + "\n")
        for i in range(n):
            s = f"s{i:07d}"
            f.write(json.dumps({"type": "session", "id": s,
                                "start_ms": int(i * 1000.0 / rate)}) + "\n")
            f.write(json.dumps({"type": "agent", "session": s, "id": "main",
                                "agent_type": "main"}) + "\n")
            runs = ([[0, shared]] if shared else []) + [[1_000_000 + i * own, own]]
            f.write(json.dumps({"type": "request", "session": s, "agent": "main",
                                "at_ms": 0, "input_tokens": isl, "output_tokens": osl,
                                "opened_by": "first", "api": "chat",
                                "hash_runs": runs}) + "\n")
    return n


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--tether", default="target/release/tether")
    a.add_argument("--profile", default="examples/profiles/llama-3.1-8b-fp8-h200-tp1.json")
    a.add_argument("--out", default="/tmp/tether-plan-oracle")
    a.add_argument("--seconds", type=float, default=30.0)
    a.add_argument("--rate", type=float, default=200.0)
    a.add_argument("--extra", default="", help="extra tether plan flags")
    args = a.parse_args()
    os.makedirs(args.out, exist_ok=True)
    prof = Profile(args.profile)
    cases = [
        # name, ISL, OSL, shared-prefix hit, TTFT p99 ms, ITL p99 ms
        ("30k/400, 0 % hit", 30000, 400, 0.0, 3000.0, 25.0),
        ("30k/400, 90 % hit", 30000, 400, 0.9, 3000.0, 25.0),
        ("1k/300 chat", 1000, 300, 0.0, 500.0, 25.0),
    ]
    print(f"profile {prof.p['name']}, {args.rate:g} req/s for {args.seconds:g} s")
    print(f"{'case':<20} {'oracle P+D':>11} {'no-reuse P+D':>13} {'chosen':>40} {'sim/pred':>8} {'wall s':>7}")
    for name, isl, osl, hit, ttft, itl in cases:
        slug = name.split(",")[0].replace("/", "-").replace(" ", "") + f"-{int(hit*100)}"
        trace = os.path.join(args.out, slug + ".jsonl")
        write_trace(trace, args.rate, args.seconds, isl, osl, hit)
        op, od, ob = dynamo(prof, args.rate, isl, osl, itl, 256)
        js = os.path.join(args.out, slug + ".json")
        cmd = [args.tether, "plan", trace, "--profile", args.profile,
               "--ttft-p99-ms", str(ttft), "--itl-p99-ms", str(itl),
               "--interval-s", str(args.seconds), "--json", js] + args.extra.split()
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t0
        open(os.path.join(args.out, slug + ".txt"), "w").write(r.stdout + r.stderr)
        if not os.path.exists(js):
            print(f"{name:<20} {op:>5}+{od:<5}  tether plan failed: {r.stderr.strip()[-200:]}")
            continue
        rep = json.load(open(js))
        nr = next(v for v in rep["variants"] if v["name"] == "no-reuse")
        peak = lambda v, k: max((s[k] for s in v["steps"]), default=0)
        ch = rep["variants"][rep["chosen"]] if rep.get("chosen") is not None else None
        chosen = "none meets" if ch is None else (
            f"{ch['name']}: {peak(ch, 'prefill')}P+{peak(ch, 'decode')}D"
            if ch["disaggregated"] else f"{ch['name']}: {peak(ch, 'decode')} coupled")
        agree = "-" if ch is None or ch.get("agreement") is None else f"{ch['agreement']:.3f}"
        print(f"{name:<20} {op:>5}+{od:<5} {peak(nr, 'prefill'):>6}+{peak(nr, 'decode'):<6} "
              f"{chosen:>40} {agree:>8} {wall:>7.1f}   (oracle decode batch {ob})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
