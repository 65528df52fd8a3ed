#!/usr/bin/env bash
# The vLLM connector on a GPU: vLLM's scheduler + TetherConnector with KV views in
# device memory moved by tether's CUDA backend — bit-exact checks (attention-only and hybrid) and copy GB/s.
#
#   here:       make vllm-gpu-bundle   (= scripts/vllm-gpu-check.sh build after the wheel)
#               -> target/vllm-gpu/ (~ 26 MiB): the tether_vllm abi3 wheel, vLLM 0.33.0's
#               pure-Python tree as .tar.xz (no compiled extensions), cp312 wheels of the packages
#               the scheduler imports that the accelerator image lacks, PTX for sm_90,
#               the harness and gpu_check.py
#   there:      scripts/vllm-gpu-check.sh run   (carry target/vllm-gpu; results in $OUT)
#               No registry, no Rust: installs the carried wheels into /tmp/site with
#               --no-index and runs gpu_check.py with TETHER_REQUIRE_GPU=1 (no GPU = fail).
#               Takes about 2 minutes; each step has a timeout well inside 8 minutes.
#   here, dry:  scripts/vllm-gpu-check.sh dry   runs the same gpu_check.py on CPU against the
#               stripped vLLM tree (what can be checked without a GPU).
#   real:       scripts/vllm-gpu-check.sh real PYTHON   the real-engine suite (make
#               test-engine-real's tests_real: vLLM executing the tiny model behind Envoy + the
#               filter) on a machine whose PYTHON has a CUDA build of vLLM and the tether_vllm
#               wheel installed, with Envoy and the built filter/CLI of this checkout
#               (make wasm envoy-install; cargo build -p tether-fleet --bin tether). Every engine
#               takes TETHER_ENGINE_GPU_MEMORY (default 0.1) of the GPU; no CUDA device = fail.
#               Not the lent accelerator: its image has torch 2.11 and no vLLM, and a CUDA
#               vLLM wheel is several times the 64 MiB a call may carry (docs/vllm-real.md).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=target/vllm-gpu
VENV=.venv
SITE_PKGS=$(ls -d $VENV/lib/python3*/site-packages | head -n 1)

# Packages gpu_check imports (through vLLM's scheduler and connector API) that the
# accelerator image does not have (device/KINDS.md list), at the versions pinned here.
MISSING="annotated-types apache-tvm-ffi cachetools cbor2 fastapi httpcore2 httpx2 llguidance
msgspec openai openai-harmony partial-json-parser pybase64 pydantic pydantic_core pyzmq
sniffio starlette truststore typing-inspection xgrammar"

pin() { grep -i "^$1==" engine-ext/vllm/requirements-cpu.txt | head -n 1; }

build() {
    rm -rf "$DIR" && mkdir -p "$DIR/whl" "$DIR/ptx" "$DIR/tests"
    cp target/wheels/tether_vllm-*-abi3-*.whl "$DIR/whl/"
    # vLLM's Python sources only (48 MiB, ~7 MiB as .tar.xz): its compiled kernels are
    # neither needed by the scheduler nor built for that machine's torch.
    (cd "$SITE_PKGS" && find vllm vllm-0.33.0.dist-info -type f \( -name '*.py' -o -path '*dist-info*' \) \
        ! -path '*__pycache__*' -print0 | tar --null -T - -cJf "$OLDPWD/$DIR/vllm-site.tar.xz")
    local specs=()
    for p in $MISSING; do
        local s; s=$(pin "$p") || { echo "no pin for $p in requirements-cpu.txt"; exit 1; }
        specs+=("$s")
    done
    $VENV/bin/pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
        --platform manylinux_2_24_x86_64 --platform any \
        -d "$DIR/whl" "${specs[@]}"
    # PTX compiled here by NVRTC 12.9 for sm_90; the driver there JIT-compiles it.
    cargo run --quiet --release -p tether-kvcopy --bin kvcopy-ptx -- kernels --arch compute_90 --out "$DIR/ptx"
    cp engine-ext/vllm/tests/harness.py engine-ext/vllm/tests/gpu_check.py "$DIR/tests/"
    cp scripts/vllm-gpu-check.sh "$DIR/"
    du -sh "$DIR"
    local bytes; bytes=$(find "$DIR" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
    if [ "$bytes" -gt $((60 << 20)) ]; then echo "bundle is $bytes bytes: over the 64 MiB carry"; exit 1; fi
    echo "carry $DIR; on the GPU machine run: scripts/vllm-gpu-check.sh run"
}

run() {
    local out=${OUT:-$DIR/out}
    mkdir -p "$out"
    [ -d "$DIR/whl" ] || { echo "missing $DIR: run 'make vllm-gpu-bundle' here first"; exit 1; }
    export TETHER_REQUIRE_GPU=1 HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR PYTHONUNBUFFERED=1
    export TETHER_KVCOPY_PTX=$PWD/$DIR/ptx/kv_copy.ptx
    export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
    timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$DIR"/whl/*.whl 2>&1 | tee "$out/pip.txt"
    rm -rf /tmp/vllm-site && mkdir -p /tmp/vllm-site && tar -xJf "$DIR/vllm-site.tar.xz" -C /tmp/vllm-site
    export PYTHONPATH=/tmp/site:/tmp/vllm-site
    (cd "$DIR/tests" && timeout 360 python3 gpu_check.py) 2>&1 | tee "$out/gpu-check.txt"
}

dry() {
    [ -f "$DIR/vllm-site.tar.xz" ] || { echo "missing $DIR: run 'make vllm-gpu-bundle' first"; exit 1; }
    export HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR PYTHONUNBUFFERED=1
    local site; site=$(mktemp -d /tmp/vllm-site-dry.XXXXXX)
    tar -xJf "$DIR/vllm-site.tar.xz" -C "$site"
    # The stripped tree first on the path: the dry run imports vLLM from it, not from .venv.
    (cd "$DIR/tests" && PYTHONPATH=$site timeout 600 "$OLDPWD/$VENV/bin/python" - <<'PY'
import sys, vllm
assert "/tmp/vllm-site-dry." in vllm.__file__, f"vLLM came from {vllm.__file__}, not the stripped tree"
print("vLLM imported from", vllm.__file__)
import runpy; sys.argv = ["gpu_check.py"]; runpy.run_path("gpu_check.py", run_name="__main__")
PY
    ) && rm -rf "$site"
}

real() {
    local py=${1:?usage: $0 real PYTHON (a python with CUDA vLLM and tether_vllm installed)}
    "$py" -c 'import torch, vllm; assert torch.cuda.is_available(), "no CUDA device"' || exit 1
    export TETHER_REQUIRE_GPU=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
    export TETHER_ENGINE_GPU_MEMORY=${TETHER_ENGINE_GPU_MEMORY:-0.1}
    export TETHER_CLI=${TETHER_CLI:-$PWD/target/debug/tether}
    export TETHER_ENVOY=${TETHER_ENVOY:-$PWD/$VENV/bin/envoy}
    (cd engine-ext/vllm/tests_real && timeout 900 "$py" -m pytest -q -p no:cacheprovider .)
}

case "${1:-}" in
    build) build ;;
    run) run ;;
    dry) dry ;;
    real) shift; real "$@" ;;
    *) echo "usage: $0 build|run|dry|real PYTHON"; exit 2 ;;
esac
