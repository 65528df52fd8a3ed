# Test targets for the kernels area.
.PHONY: test-kernels
test-kernels:
	@echo "test-kernels: nothing yet"
