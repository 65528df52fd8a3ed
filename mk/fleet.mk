# Fleet simulator and P/D planner (tether-fleet, fleet/src/sim, fleet/src/plan). See docs/planning.md.
#   make bench-fleet   routing targets on the bundled traces (and a real Mooncake conversation
#                      trace with FLEET_REAL=path), the planner's targets on a generated
#                      long-prompt agent mix, and 1 M requests on 1,024 ranks; prints verdicts
# The simulator's and planner's tests run with the crate's (make test-engine).
.PHONY: bench-fleet

FLEET_REAL ?=

bench-fleet:
	$(CARGO) run --quiet --release -p tether-bench --bin fleet-bench -- $(if $(FLEET_REAL),--real $(FLEET_REAL),)

# Residency-aware placement (tether-resident; the filter's `residency`), BENCHMARKS.md
# "Residency-aware placement":
#   make bench-resident   tether-resident vs the oracle on the bundled traces, Mooncake and a
#                         generated coding-agent corpus at 8 and 64 ranks (simulated), P/D
#                         splits vs coupled, then through Envoy + tether-ranks
#                         (RESIDENT_ARGS="--skip envoy", "--real PATH", …)
.PHONY: bench-resident

RESIDENT_ARGS ?=

bench-resident: wasm envoy-install
	$(CARGO) build --quiet --release -p tether-rank --bin tether-rank -p tether-bench --bin resident-bench
	$(CARGO) run --quiet --release -p tether-bench --bin resident-bench -- $(RESIDENT_ARGS)
