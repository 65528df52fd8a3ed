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

# Fuzzing (nightly + cargo-fuzz; not part of make test; docs/gateway.md "Tests
# and fuzzing"). `make fuzz` runs both targets one after the other (one job at a
# time: the machine is shared), each for FUZZ_RUNS executions or FUZZ_SECS
# seconds, whichever comes first, and prints the executions and corpus sizes:
#   scan      (filter/fuzz) the scanner at random read limits, the whole body
#             decision and rewrite, the config parser, the header-map decoder
#   exchange  (tests/wasm-host/fuzz) the built tether_filter.wasm in the
#             wasmtime harness: arbitrary headers, chunkings, configurations
# Inputs up to FUZZ_MAX_LEN bytes. Corpora: filter/fuzz/corpus/scan (seeded
# from filter/fuzz/seeds/scan), tests/wasm-host/fuzz/corpus/exchange (seeded
# by tests/wasm-host/fuzz/seed.sh); findings land in their artifacts/ folders.
FUZZ_SECS ?= 60
FUZZ_RUNS ?= 5000000
FUZZ_MAX_LEN ?= 4096
FUZZ_FLAGS = -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECS) -max_len=$(FUZZ_MAX_LEN) -print_final_stats=1
.PHONY: fuzz fuzz-tools

fuzz-tools:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz

fuzz-filter: fuzz-tools
	mkdir -p filter/fuzz/corpus/scan target
	cd filter/fuzz && $(CARGO) +nightly fuzz run scan corpus/scan seeds/scan -- $(FUZZ_FLAGS) 2>&1 \
		| tee $(abspath target/fuzz-scan.log) | grep -E '^(#[0-9]+ +(DONE|pulse)|stat::|==[0-9]+==|SUMMARY|Done )' || true
	@grep -q '^Done ' target/fuzz-scan.log || { echo "fuzz-filter: the run did not finish (finding? see target/fuzz-scan.log)"; exit 1; }
	@echo "scan corpus: $$(ls filter/fuzz/corpus/scan | wc -l) inputs"

fuzz: fuzz-filter fuzz-host
	@echo "fuzz: scan $$(sed -n 's/^stat::number_of_executed_units: //p' target/fuzz-scan.log) + exchange $$(sed -n 's/^stat::number_of_executed_units: //p' target/fuzz-exchange.log) executions, clean"
