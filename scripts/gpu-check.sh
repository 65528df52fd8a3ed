#!/usr/bin/env bash
# KV-copy engine on a GPU: bit-exact tests against the CPU backend, then benchmarks.
#
# Two phases, because the accelerator machine has no Rust toolchain:
#   here:       make gpu-bins        (= scripts/gpu-check.sh build, with NVRTC on LD_LIBRARY_PATH)
#               builds release binaries + PTX for sm_90 into target/kvcopy-gpu/ (~ a few MiB)
#   on the GPU: scripts/gpu-check.sh run      (carry target/kvcopy-gpu; results go to $OUT)
# The run phase takes well under 8 minutes: tests ~1 min, benchmarks ~1 min.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=target/kvcopy-gpu

build() {
    rm -rf "$DIR" && mkdir -p "$DIR/ptx"
    cargo build --quiet --release -p tether-kvcopy --bin kvcopy-bench --bin kvcopy-ptx
    local target_dir
    target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    cp "$target_dir/release/kvcopy-bench" "$DIR/"
    local test_bin
    test_bin=$(cargo test --release -p tether-kvcopy --test gpu_copy --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_copy":
        print(m["executable"])')
    cp "$test_bin" "$DIR/gpu_copy"
    # PTX compiled here by NVRTC 12.9 for sm_90; the GPU's driver JIT-compiles it.
    "$target_dir/release/kvcopy-ptx" kernels --arch compute_90 --out "$DIR/ptx"
    strip "$DIR/kvcopy-bench" "$DIR/gpu_copy" 2>/dev/null || true
    cp scripts/gpu-check.sh "$DIR/"
    du -sh "$DIR"
    echo "carry $DIR; on the GPU machine run: scripts/gpu-check.sh run"
}

run() {
    local out=${OUT:-$DIR/out}
    mkdir -p "$out"
    [ -x "$DIR/gpu_copy" ] || { echo "missing $DIR/gpu_copy: run 'make gpu-bins' here first"; exit 1; }
    export TETHER_REQUIRE_GPU=1
    export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
    local rc=0
    echo "== GPU tests (embedded-PTX path) =="
    TETHER_KVCOPY_PTX="$DIR/ptx/kv_copy.ptx" timeout 180 "$DIR/gpu_copy" --ignored --test-threads=1 2>&1 \
        | tee "$out/gpu-tests.txt" || rc=1
    echo "== GPU test (runtime NVRTC path, informational) =="
    (unset TETHER_KVCOPY_PTX; timeout 60 "$DIR/gpu_copy" --ignored --test-threads=1 state_snapshots_match_cpu 2>&1) \
        | tee "$out/gpu-tests-nvrtc.txt" || echo "runtime NVRTC path failed (see gpu-tests-nvrtc.txt)"
    echo "== benchmarks =="
    TETHER_KVCOPY_PTX="$DIR/ptx/kv_copy.ptx" timeout 240 "$DIR/kvcopy-bench" gpu 2>&1 | tee "$out/bench-gpu.txt" || rc=1
    exit $rc
}

case "${1:-}" in
    build) build ;;
    run) run ;;
    *) echo "usage: $0 build|run"; exit 2 ;;
esac
