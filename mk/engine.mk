# Retention policy of the engine extension (engine-ext/, everything but src/copy*). See docs/engine.md.
#   make test-engine    unit + property tests of the policy, the trace-replay test and the
#                       offload round trip through the CPU copy backend (no GPU needed)
#   make bench-engine   the policy benchmark (LRU vs retention vs retention + host tier on the
#                       Mooncake synthetic trace) and the CPU decision-throughput benchmark
.PHONY: test-engine bench-engine

ENGINE_TRACE ?= examples/traces/mooncake_synthetic_trace.jsonl

test-engine:
	$(CARGO) test --quiet -p tether-engine --lib -- --skip copy::
	$(CARGO) test --quiet -p tether-engine --test offload_roundtrip --test retention_trace

bench-engine:
	$(CARGO) run --quiet --release -p tether-engine --bin retention-bench -- --trace $(ENGINE_TRACE)
	$(CARGO) run --quiet --release -p tether-engine --bin retention-throughput
