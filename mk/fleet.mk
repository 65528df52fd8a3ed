# Fleet simulator and P/D planner (tether-fleet, fleet/src/sim, fleet/src/plan). See docs/planning.md.
#   make bench-fleet   routing targets on the bundled traces (and a real Mooncake conversation
#                      trace with FLEET_REAL=path), the planner's targets on a generated
#                      long-prompt agent mix, and 1 M requests on 1,024 ranks; prints verdicts
# The simulator's and planner's tests run with the crate's (make test-engine).
.PHONY: bench-fleet

FLEET_REAL ?=

bench-fleet:
	$(CARGO) run --quiet --release -p tether-bench --bin fleet-bench -- $(if $(FLEET_REAL),--real $(FLEET_REAL),)
