# End-to-end area: real Envoy + echo ranks + the tether filter (docs/e2e.md).
# `test-e2e` runs every test of crate tether-e2e (tests/all: the e2e suite;
# also the unit tests of the harness and the crate's other test files) and of
# tether-bench (the demo run end to end on a cut of the trace, and the unit tests
# of the benchmark drivers). Envoy and both filter modules are built/installed
# first, so nothing is ever skipped; TETHER_ENVOY / TETHER_FILTER_WASM /
# TETHER_FLOOR_WASM are exported by the Makefile. The replay tests run real
# tether-rank processes, built first.
.PHONY: test-e2e demo

test-e2e: wasm envoy-install
	$(CARGO) build --quiet -p tether-rank --bin tether-rank
	$(CARGO) test --quiet -p tether-e2e -p tether-envoy -p tether-bench

# The bundled agent trace replayed through Envoy + tether in front of four
# tether-rank processes under three settings (round robin + LRU, tether + LRU,
# tether + retention + host tier), compared; reports and plots in target/demo.
# The ranks are release builds: in debug they tokenize too slowly to follow
# the trace's timestamps.
demo: wasm envoy-install
	$(CARGO) build --quiet --release -p tether-rank --bin tether-rank
	$(CARGO) build --quiet -p tether-bench --bin tether-demo
	TETHER_RANK=$(abspath target/release/tether-rank) $(CARGO) run --quiet -p tether-bench --bin tether-demo
