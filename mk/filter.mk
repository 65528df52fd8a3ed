# Test targets for the filter area.
.PHONY: test-filter
test-filter:
	@echo "test-filter: nothing yet"
