# Test targets for the host area.
.PHONY: test-host
test-host:
	@echo "test-host: nothing yet"
