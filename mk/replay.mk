# Replay area (tether replay / compare / gateway, docs/cli.md, docs/report.md).
# Its tests run in make test: the fleet crate's (test-engine) and the replay
# module of the end-to-end suite (test-e2e). This fragment holds the benchmark.
#   make bench-replay   the replay targets through Envoy + 8 tether-ranks on the
#                       bundled traces and the Mooncake conversation trace
#                       (REPLAY_BENCH_ARGS="--mooncake PATH", "--only agent-demo", …)
.PHONY: bench-replay

REPLAY_BENCH_ARGS ?=

bench-replay: wasm envoy-install
	$(CARGO) build --quiet --release -p tether-rank --bin tether-rank -p tether-bench --bin replay-bench
	$(CARGO) run --quiet --release -p tether-bench --bin replay-bench -- $(REPLAY_BENCH_ARGS)
