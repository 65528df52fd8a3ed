# vLLM connector (tether-vllm: engine-ext/vllm/, docs/vllm.md).
#   make test-vllm    installs vLLM 0.33.0 (--no-deps) + torch 2.14.0 + the pinned pure-Python
#                     packages its scheduler and connector API import into .venv once (a stamp),
#                     builds the abi3 wheel with maturin and runs the pytest suite against vLLM's
#                     real Scheduler and worker glue on CPU (with the filter module, Envoy and the
#                     tether CLI: markers from the real filter in Envoy reach the connector)
#   make bench-vllm   the agent-trace benchmark: plain prefix caching vs OffloadingConnector vs
#                     TetherConnector through the same scheduler (BENCHMARKS.md)
#   make vllm-gpu-bundle   what scripts/vllm-gpu-check.sh carries to an accelerator machine
.PHONY: test-vllm bench-vllm vllm-wheel vllm-install vllm-gpu-bundle

VLLM_STAMP := $(VENV)/.vllm-0.33.0-torch-2.14.0
VLLM_REQS := engine-ext/vllm/requirements-cpu.txt
VLLM_PY := HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR $(abspath $(VENV))/bin/python

$(VLLM_STAMP): $(VLLM_REQS) | $(VENV)/bin/python
	$(call PIP_INSTALL,torch==2.14.0)
	$(call PIP_INSTALL,--no-deps vllm==0.33.0 maturin==1.16.0 pytest==9.0.1 -r $(VLLM_REQS))
	@touch $@

# NIXL for the state pull (docs/vllm.md, "State pull (NIXL)"): --no-deps, since both
# wheels declare torch (≈ 3 GB) and the meta package a CUDA 13 backend; ≈ 220 MB with UCX
# bundled. nixl 1.5.2 is the newest meta package, nixl-cu12 1.5.1 the newest backend (the
# meta package names nixl-cu12==1.5.2, which PyPI does not have); the connector imports
# the backend directly when the meta package refuses (torch 2.14 is a CUDA 13 build).
NIXL_PINS := nixl==1.5.2 nixl-cu12==1.5.1
NIXL_STAMP := $(VENV)/.nixl-1.5.2-cu12-1.5.1

$(NIXL_STAMP): $(VLLM_STAMP)
	$(call PIP_INSTALL,--no-deps $(NIXL_PINS))
	$(VENV)/bin/python -c 'import nixl_cu12._api' || { echo "nixl_cu12 does not import"; exit 1; }
	@touch $@

vllm-install: $(VLLM_STAMP) $(NIXL_STAMP)

# The abi3 wheel (Python >= 3.10), installed into .venv.
vllm-wheel: $(VLLM_STAMP) $(NIXL_STAMP)
	rm -f target/wheels/tether_vllm-*.whl
	$(VENV)/bin/maturin build --release --quiet -m engine-ext/vllm/Cargo.toml -o target/wheels
	$(PIP) install --force-reinstall --no-deps target/wheels/tether_vllm-*.whl

# test_gateway_markers.py runs the built filter in Envoy, rendered by `tether gateway`.
test-vllm: vllm-wheel wasm envoy-install
	$(CARGO) build --quiet -p tether-fleet --bin tether
	cd engine-ext/vllm/tests && TETHER_CLI=$(abspath target/debug/tether) $(VLLM_PY) -m pytest -q -p no:cacheprovider .

bench-vllm: vllm-wheel
	cd engine-ext/vllm/tests && $(VLLM_PY) bench_agent_trace.py $(BENCH_ARGS)

vllm-gpu-bundle: vllm-wheel $(KVCOPY_NVRTC_STAMP)
	$(KVCOPY_ENV) scripts/vllm-gpu-check.sh build
	scripts/vllm-gpu-check.sh dry
