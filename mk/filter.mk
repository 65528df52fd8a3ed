# Filter area (docs/gateway.md): native unit + property tests of tether-filter,
# a clippy pass over the wasm-only glue, and the module build itself.
.PHONY: test-filter bench-filter-scan fuzz-filter

test-filter: wasm
	$(CARGO) clippy --quiet -p tether-filter --target wasm32-wasip1 -- -D warnings
	$(CARGO) test --quiet -p tether-filter

# Scanner benchmark, native and inside V8 (node runs the same engine Envoy uses).
# Figures: docs/gateway.md, "Benchmarks".
bench-filter-scan: wasm-target
	$(CARGO) bench --quiet -p tether-filter --bench scan
	$(CARGO) bench --quiet -p tether-filter --bench scan --no-run --target wasm32-wasip1
	node filter/benches/run-wasm.mjs $$(ls -t target/wasm32-wasip1/release/deps/scan-*.wasm | head -1)

# Fuzz the body scanner and decision (needs nightly + cargo-fuzz; not part of make test).
FUZZ_SECS ?= 60
fuzz-filter:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz
	cd filter/fuzz && $(CARGO) +nightly fuzz run scan -- -max_total_time=$(FUZZ_SECS)
