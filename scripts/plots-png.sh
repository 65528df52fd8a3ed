#!/usr/bin/env bash
# Renders every report plot to PNG for a person to look at (issue 17: "check
# every plot by rendering it"): two simulated runs of the bundled agent trace,
# compared, each SVG converted with rsvg-convert (Debian: librsvg2-bin).
# Usage: scripts/plots-png.sh [OUT_DIR]   (default target/plots-png)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/plots-png}"
command -v rsvg-convert >/dev/null || { echo "rsvg-convert missing: apt-get install librsvg2-bin"; exit 1; }
cargo build --quiet -p tether-fleet --bin tether
rm -rf "$out" && mkdir -p "$out"
target/debug/tether simulate examples/traces/agent-demo.jsonl \
  --profile examples/profiles/llama-3.1-8b-fp8-h200-tp1.json --ranks 4 \
  --policy round-robin,tether --cache lru --out "$out/runs" --quiet >/dev/null
target/debug/tether compare "$out/runs/round-robin.lru" "$out/runs/tether.lru" --out "$out/compare" >/dev/null
for svg in "$out"/compare/*.svg; do
  rsvg-convert -o "${svg%.svg}.png" "$svg"
done
ls "$out"/compare/*.png
