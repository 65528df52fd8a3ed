#!/usr/bin/env python3
"""Per-module figures of the last cargo-mutants runs (`make mutants*`, docs/mutants.md).

Reads <out>/<group>/mutants.out/outcomes.json for every group run, prints caught /
missed / timeout / unviable per file and per group with the share of viable mutants
caught, and checks every missed mutant against the tracked survivors file, whose lines
read `<file>: <mutation> ## <reason>` (line numbers left out, so edits elsewhere do not
stale them). Exits 1 when a missed mutant is not listed. `--markdown` prints the
tables for the docs page; `--missed-regex GROUP` prints regexes selecting the
group's missed mutants by exact name (for `make mutants-rerun`, before the
mutated files change).
"""
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

KINDS = ("caught", "missed", "timeout", "unviable")
SUMMARY = {
    "CaughtMutant": "caught",
    "MissedMutant": "missed",
    "Timeout": "timeout",
    "Unviable": "unviable",
}


def key(name: str) -> str:
    """`file:line:col: mutation` -> `file: mutation`."""
    return re.sub(r"^([^:]+):\d+:\d+:", r"\1:", name)


def load_survivors(path: Path) -> dict:
    listed = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                mutant, _, reason = line.partition(" ## ")
                listed[mutant.strip()] = reason.strip()
    return listed


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in sys.argv
    out, survivors = Path(args[0]), Path(args[1])
    listed = load_survivors(survivors)
    per_file = defaultdict(Counter)
    per_group = defaultdict(Counter)
    missed = []
    walls = {}
    # Runs in start order; a mutant tested again later (a shard re-run, `--iterate`)
    # counts with its latest outcome.
    runs = []
    for outcomes in out.glob("*/mutants.out/outcomes.json"):
        data = json.loads(outcomes.read_text())
        runs.append((data.get("start_time", ""), outcomes, data))
    latest = {}
    missed_by_group = defaultdict(list)
    for _, outcomes, data in sorted(runs, key=lambda r: r[0]):
        # `engine.1-of-2` is shard 1 of group `engine`: shards merge into their group.
        group = outcomes.parent.parent.name.split(".")[0]
        wall = outcomes.parent.parent / "wall_s"
        if wall.exists():
            walls[group] = walls.get(group, 0) + int(wall.read_text().strip() or 0)
        for o in data["outcomes"]:
            scenario = o["scenario"]
            if not isinstance(scenario, dict) or "Mutant" not in scenario:
                continue
            kind = SUMMARY.get(o["summary"])
            if kind is not None:
                m = scenario["Mutant"]
                latest[m["name"]] = (group, m["file"], kind)
    for name, (group, file, kind) in latest.items():
        per_file[(group, file)][kind] += 1
        per_group[group][kind] += 1
        if kind == "missed":
            missed.append(key(name))
            missed_by_group[group].append(name)
    if "--missed-regex" in sys.argv:
        # One regex a line matching every missed mutant of group `args[2]`, at any line:
        # `make mutants-rerun` re-tests just these against the current tree.
        # Exact names (file:line:col): re-run before the mutated files change.
        meta = set("\\.+*?()|[]{}^$#&-~")
        for name in sorted(set(missed_by_group.get(args[2], []))):
            print("^" + "".join("\\" + c if c in meta else c for c in name) + "$")
        return 0
    if not per_group:
        print(f"no cargo-mutants results under {out}")
        return 0

    def row(label, c, wall=None):
        viable = c["caught"] + c["missed"] + c["timeout"]
        share = f"{100 * (c['caught'] + c['timeout']) / viable:.1f} %" if viable else "-"
        cells = [label] + [str(c[k]) for k in KINDS] + [share]
        if wall is not None:
            cells.append(f"{wall // 60} min" if wall else "-")
        return cells

    head = ["module", *KINDS, "caught of viable"]
    rows = [row(f"{g}: {f}", per_file[(g, f)]) for g, f in sorted(per_file)]
    total = Counter()
    group_rows = []
    for g in sorted(per_group):
        total.update(per_group[g])
        group_rows.append(row(g, per_group[g], walls.get(g, 0)))
    group_rows.append(row("all", total, sum(walls.values())))
    for title, h, rs in (("per file", head, rows), ("per group", head + ["wall"], group_rows)):
        if markdown:
            print(f"\n{title}:\n")
            print("| " + " | ".join(h) + " |")
            print("|" + "---|" * len(h))
            for r in rs:
                print("| " + " | ".join(r) + " |")
        else:
            print(f"\n{title}:")
            widths = [max(len(x[i]) for x in [h, *rs]) for i in range(len(h))]
            for r in [h, *rs]:
                print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    unlisted = sorted(set(m for m in missed if m not in listed))
    stale = sorted(set(listed) - set(missed))
    print(f"\nmissed: {len(missed)}, listed in {survivors}: {sum(m in listed for m in missed)}")
    for m in unlisted:
        print(f"  NOT LISTED: {m}")
    if stale:
        print(f"listed but not missed in these runs (caught now, or not run): {len(stale)}")
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main())
