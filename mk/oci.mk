# The filter as an OCI image in Istio's Wasm image format, written as an OCI
# image layout (docs/gateway.md, "Deploying"): tag $(OCI_TAG) is the OCI
# artifact (one wasm layer), $(OCI_TAG)-compat the one-layer image holding
# plugin.wasm. Push it with e.g.
#   oras cp --from-oci-layout $(OCI_DIR):$(OCI_TAG) REGISTRY/tether/filter:$(OCI_TAG)
OCI_DIR ?= target/oci/tether-filter
OCI_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

.PHONY: oci

oci: wasm
	$(CARGO) run --quiet -p tether-envoy --bin tether-oci -- --wasm $(FILTER_WASM) --out $(OCI_DIR) --tag $(OCI_TAG)
