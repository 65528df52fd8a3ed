# Retention policy of the engine extension (tether-engine, engine-ext/). See docs/engine.md.
#   make test-engine    unit + property tests of the policy, the trace-replay test and the
#                       offload round trip through the CPU copy backend (no GPU needed), and
#                       tether-fleet's tests (its CLI tests validate rendered bootstraps with
#                       Envoy and the built filter module, so both are made first)
#   make bench-engine   the policy benchmark (LRU vs retention vs retention + host tier on the
#                       Mooncake synthetic trace, attention-only and hybrid; the bundled agent
#                       traces with the hybrid profile) and the CPU decision-throughput benchmark
.PHONY: test-engine bench-engine

ENGINE_TRACE ?= examples/traces/mooncake_synthetic_trace.jsonl
ENGINE_TRACE_FORMAT ?= mooncake
# A hybrid model (linear attention 3 : 1): its state per snapshot and resumable alignment.
ENGINE_HYBRID_PROFILE ?= examples/profiles/qwen3-coder-next-fp8-h200-tp1.json
ENGINE_AGENT_TRACES ?= agent-demo agent-subagents agent-tenants

test-engine: wasm envoy-install
	$(CARGO) test --quiet -p tether-wire -p tether-placement -p tether-engine
	$(CARGO) test --quiet -p tether-kvcopy --test offload_roundtrip
	$(CARGO) test --quiet -p tether-fleet

bench-engine:
	$(CARGO) run --quiet --release -p tether-bench --bin retention-bench -- --trace $(ENGINE_TRACE) --format $(ENGINE_TRACE_FORMAT)
	$(CARGO) run --quiet --release -p tether-bench --bin retention-bench -- --trace $(ENGINE_TRACE) --format $(ENGINE_TRACE_FORMAT) --profile $(ENGINE_HYBRID_PROFILE)
	for t in $(ENGINE_AGENT_TRACES); do \
	  $(CARGO) run --quiet --release -p tether-bench --bin retention-bench -- --trace examples/traces/$$t.jsonl --device-tokens 49152 --profile $(ENGINE_HYBRID_PROFILE) || exit 1; \
	done
	$(CARGO) bench --quiet -p tether-engine --bench retention-throughput
