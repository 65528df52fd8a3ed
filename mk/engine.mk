# Test targets for the engine area.
.PHONY: test-engine
test-engine:
	@echo "test-engine: nothing yet"
