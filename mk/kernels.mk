# KV-copy engine (tether-kvcopy: engine-ext/kvcopy/, kernels/*.cu). See docs/kv-copy.md.
#   make test-kernels   NVRTC wheel -> every kernels/*.cu to PTX for sm_90 (fails on any
#                       compile error, no GPU needed), CPU backend tests, the API example
#                       in docs/kv-copy.md, GPU tests (skip with a printed reason when
#                       there is no GPU; where one is visible, or with
#                       TETHER_REQUIRE_GPU=1, a GPU test that cannot run fails)
#   make bench-kvcopy   CPU backend vs naive reference, GB/s side by side
#   make gpu-bins       build what scripts/gpu-check.sh carries to an accelerator machine
.PHONY: test-kernels nvrtc bench-kvcopy gpu-bins

KVCOPY_NVRTC_WHEEL := nvidia-cuda-nvrtc-cu12==12.9.86
KVCOPY_NVRTC_STAMP := $(VENV)/.kvcopy-nvrtc-12.9.86
# Resolved when a recipe runs (the wheel may not be installed when make parses this file).
KVCOPY_NVRTC_DIR = $$(dirname "$$(ls -1 $(abspath $(VENV))/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 | head -n 1)")
KVCOPY_ENV = LD_LIBRARY_PATH=$(KVCOPY_NVRTC_DIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}

$(KVCOPY_NVRTC_STAMP): | $(VENV)/bin/python
	$(call PIP_INSTALL,$(KVCOPY_NVRTC_WHEEL))
	@ls $(VENV)/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 >/dev/null \
		|| { echo "the $(KVCOPY_NVRTC_WHEEL) wheel did not provide libnvrtc.so.12"; exit 1; }
	@touch $@

nvrtc: $(KVCOPY_NVRTC_STAMP)

# The switch scripts/gpu-check.sh sets on the accelerator machine: with it, "no CUDA
# driver" or a backend that fails to start is a test failure, not a printed skip. On by
# default wherever a GPU is visible (an NVIDIA device node or nvidia-smi); set
# TETHER_REQUIRE_GPU=1 to demand one anywhere, 0 to allow skips.
TETHER_REQUIRE_GPU ?= $(if $(wildcard /dev/nvidia0)$(shell command -v nvidia-smi 2>/dev/null),1,0)

test-kernels: $(KVCOPY_NVRTC_STAMP)
	$(KVCOPY_ENV) $(CARGO) run --quiet -p tether-kvcopy --bin kvcopy-ptx -- kernels --arch compute_90
	$(CARGO) test --quiet -p tether-kvcopy --lib
	$(CARGO) test --quiet -p tether-kvcopy --test copy_cpu
	$(CARGO) test --quiet -p tether-kvcopy --test paged_layout
	$(CARGO) test --quiet -p tether-kvcopy --doc
	TETHER_REQUIRE_GPU=$(TETHER_REQUIRE_GPU) $(CARGO) test --quiet -p tether-kvcopy --test gpu_copy -- --include-ignored --nocapture

bench-kvcopy:
	$(CARGO) run --quiet --release -p tether-kvcopy --bin kvcopy-bench -- cpu

gpu-bins: $(KVCOPY_NVRTC_STAMP)
	$(KVCOPY_ENV) scripts/gpu-check.sh build
