# Simulated engine rank (tether-rank, engine-ext/rank/). See docs/rank.md.
#   make test-rank    unit tests of the engine model (tether-rank-engine: profile, latency, engine)
#                     and of the server (wire formats), and the
#                     loopback HTTP suite against in-process servers and the real binary
#   make bench-rank   requests/s and CPU per request of one rank process (BENCHMARKS.md)
.PHONY: test-rank bench-rank

test-rank:
	$(CARGO) test --quiet -p tether-rank-engine -p tether-rank

bench-rank:
	$(CARGO) bench --quiet -p tether-rank --bench rank-throughput
