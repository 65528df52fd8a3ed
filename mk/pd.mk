# Load-aware pick benchmark (not part of make test; docs/gateway.md "Load-aware
# pick", figures in BENCHMARKS.md): the same burst of hot sessions through Envoy
# and four release tether-ranks, plain pick vs load-aware pick, light and
# overloaded, medians of repeated runs, verdicts printed.
.PHONY: bench-spill

SPILL_BENCH_ARGS ?=

bench-spill: wasm envoy-install
	$(CARGO) build --quiet --release -p tether-rank --bin tether-rank
	$(CARGO) build --quiet --release -p tether-bench --bin spill-bench
	TETHER_RANK=$(abspath target/release/tether-rank) $(CARGO) run --quiet --release -p tether-bench --bin spill-bench -- $(SPILL_BENCH_ARGS)
