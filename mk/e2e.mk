# Test targets for the e2e area.
.PHONY: test-e2e
test-e2e:
	@echo "test-e2e: nothing yet"
demo:
	@echo "demo: not yet"
