# Where a large agent body spends its time, hop by hop (issue 27 part 4), BENCHMARKS.md
# "The coding-agent corpus through Envoy":
#   make bench-body   the corpus' synthesis, the rank's reading, one request to a rank and through
#                     Envoy + the filter, an idle gateway's load polls; BODY_ARGS="--tether-before
#                     B/tether --rank-before B/tether-rank" times binaries of an older checkout beside
#                     the current ones
.PHONY: bench-body

BODY_ARGS ?=

bench-body: wasm envoy-install
	$(CARGO) build --quiet --release -p tether-fleet --bin tether -p tether-rank --bin tether-rank -p tether-bench --bin body-bench
	$(CARGO) run --quiet --release -p tether-bench --bin body-bench -- $(BODY_ARGS)
