# Retention policy of the engine extension (tether-engine, engine-ext/). See docs/engine.md.
#   make test-engine    unit + property tests of the policy, the trace-replay test and the
#                       offload round trip through the CPU copy backend (no GPU needed), and
#                       tether-fleet's tests (its CLI tests validate rendered bootstraps with
#                       Envoy and the built filter module, so both are made first)
#   make bench-engine   the policy benchmark (LRU vs retention vs retention + host tier on the
#                       Mooncake synthetic trace, attention-only and hybrid; the bundled agent
#                       traces with the hybrid profile) and the CPU decision-throughput benchmark
#   make bench-prefetch prefetch in tool gaps: retention + host tier without and with prefetch,
#                       side by side, on the bundled agent traces and two generated ones
#                       (96 and 256 sessions) at 48 Ki device tokens per rank
.PHONY: test-engine bench-engine bench-prefetch

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

# The generated traces: agent-demo's model with more sessions arriving faster (load).
PREFETCH_GEN = --system-tokens 800 --tool-tokens 1200 --first-message-tokens 200 --tool-result-tokens 600 --calls-per-turn 5 --user-turns 2 --subagent-calls 4 --subagent-system-tokens 400 --subagent-tool-tokens 400 --output-tokens 200 --think-ms 20000 --max-context-tokens 32000 --summary-tokens 2000

bench-prefetch:
	$(CARGO) run --quiet --release -p tether-fleet --bin tether -- trace generate --seed 11 --sessions 96 --session-gap-ms 1500 $(PREFETCH_GEN) --output target/prefetch-agent-96.jsonl
	$(CARGO) run --quiet --release -p tether-fleet --bin tether -- trace generate --seed 11 --sessions 256 --session-gap-ms 500 $(PREFETCH_GEN) --output target/prefetch-agent-256.jsonl
	for t in $(addprefix examples/traces/,$(addsuffix .jsonl,$(ENGINE_AGENT_TRACES))) target/prefetch-agent-96.jsonl target/prefetch-agent-256.jsonl; do \
	  $(CARGO) run --quiet --release -p tether-bench --bin retention-bench -- --trace $$t --device-tokens 49152 --prefetch || exit 1; \
	done
