# Test targets for the host area: the proxy-wasm host on wasmtime and the floor filter.
.PHONY: test-host bench-host fuzz-host
test-host: wasm
	$(CARGO) test --quiet -p tether-wasm-host

# Per-request cost of a filter in the harness (figures in docs/wasm-host.md).
bench-host: wasm
	$(CARGO) bench -p tether-wasm-host --bench request_cost

# Fuzz the filter through the harness (nightly + cargo-fuzz; FUZZ_RUNS,
# FUZZ_SECS, FUZZ_MAX_LEN and the output: see `make fuzz` in mk/filter.mk).
fuzz-host: wasm fuzz-tools
	tests/wasm-host/fuzz/seed.sh
	cd tests/wasm-host/fuzz && TETHER_FUZZ_WASM=$(abspath $(FILTER_WASM)) $(CARGO) +nightly fuzz run exchange corpus/exchange -- $(FUZZ_FLAGS) 2>&1 \
		| tee $(abspath target/fuzz-exchange.log) | grep -E '^(#[0-9]+ +(DONE|pulse)|stat::|==[0-9]+==|SUMMARY|Done )' || true
	@grep -q '^Done ' target/fuzz-exchange.log || { echo "fuzz-host: the run did not finish (finding? see target/fuzz-exchange.log)"; exit 1; }
	@echo "exchange corpus: $$(ls tests/wasm-host/fuzz/corpus/exchange | wc -l) inputs"
