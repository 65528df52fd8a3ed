# Simulated engine rank (tether-rank, engine-ext/rank/). See docs/rank.md.
#   make test-rank    unit tests (profile, latency model, engine, wire formats) and the
#                     loopback HTTP suite against in-process servers and the real binary
.PHONY: test-rank

test-rank:
	$(CARGO) test --quiet -p tether-rank
