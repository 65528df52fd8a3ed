# Test targets for the host area: the proxy-wasm host on wasmtime and the floor filter.
.PHONY: test-host bench-host fuzz-host
test-host: wasm
	$(CARGO) test --quiet -p tether-wasm-host

# Per-request cost of a filter in the harness (figures in docs/wasm-host.md).
bench-host: wasm
	$(CARGO) bench -p tether-wasm-host --bench request_cost

# Fuzz the filter through the harness for FUZZ_SECONDS (nightly + cargo-fuzz).
FUZZ_SECONDS ?= 60
fuzz-host: wasm
	cd tests/wasm-host/fuzz && $(CARGO) +nightly fuzz run exchange -- -max_total_time=$(FUZZ_SECONDS)
