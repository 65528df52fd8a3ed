# Gateway benchmark (not part of make test) and the tests of its area:
# the Istio manifests (test-istio) and the benchmark's pure parts (test-bench).
.PHONY: bench-gateway test-istio test-bench

# Extra arguments, e.g. `make bench-gateway BENCH_ARGS=--quick`.
BENCH_ARGS ?=

# Builds both wasm modules, installs Envoy, builds the benchmark in release and
# runs it: six gateway variants through real Envoy, medians and ratios, targets.
bench-gateway: wasm envoy-install
	$(CARGO) build --quiet --release -p tether-bench --bin gateway-bench
	$(CARGO) run --quiet --release -p tether-bench --bin gateway-bench -- $(BENCH_ARGS)

# envoy/istio/*.yaml against Istio's CRD schemas (strict, as the API server) and each other;
# the Kustomize overlays (rendered by `kubectl kustomize`), Envoy Gateway and llm-d
# manifests against their vendored CRD schemas (envoy/k8s-schema/); what Envoy
# Gateway makes of its manifests runs in real Envoy with the filter module.
test-istio: wasm envoy-install
	$(CARGO) test --quiet -p tether-e2e --test istio_manifests --test k8s_manifests

# The benchmark's body generator and statistics (no Envoy needed).
test-bench:
	$(CARGO) test --quiet -p tether-bench --bin gateway-bench
