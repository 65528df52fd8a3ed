# Benchmarks (not part of make test).
.PHONY: bench-gateway
bench-gateway:
	@echo "bench-gateway: not yet"
