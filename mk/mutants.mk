# Mutation testing with cargo-mutants (docs/mutants.md). Not part of `make test`.
#   make mutants            everyday: only mutants on lines changed since $(MUTANTS_BASE)
#                           (working tree included), each judged by its group's tests
#   make mutants-full       the record run: every group, one after the other
#   make mutants-group G=engine [MUTANTS_SHARD=0/3]   one group (or one consecutive slice of it; k of n, from 0)
#   make mutants-rerun G=filter   re-test only the group's missed mutants against the
#                           current tree (after writing tests); the report counts the
#                           latest outcome of each mutant
#   make mutants-report     per-module figures of the last runs; fails if a missed
#                           mutant is not listed in mutants/survivors.txt
# One job at a time (--jobs 1): the machine is shared. Results: target/mutants/<group>/.
.PHONY: mutants mutants-full mutants-group mutants-run-group mutants-rerun mutants-report mutants-install

CARGO_MUTANTS_VERSION := 27.1.0
MUTANTS_ROOT := .tools/cargo-mutants-$(CARGO_MUTANTS_VERSION)
MUTANTS_TOOL := $(MUTANTS_ROOT)/bin/cargo-mutants
MUTANTS_BASE ?= main
MUTANTS_SHARD ?=
MUTANTS_OUT := target/mutants
MUTANTS_GROUPS := wire placement filter engine fleet

# What each group mutates (the pure logic) and the tests that judge it.
MUTANTS_FILES_wire := -f 'wire/src/*.rs'
MUTANTS_FILES_placement := -f 'placement/src/*.rs'
MUTANTS_FILES_filter := -f filter/src/decide.rs -f filter/src/read.rs -f filter/src/emit.rs -f filter/src/read/identity.rs -f filter/src/read/turn.rs \
	-f filter/src/read/scan.rs -f filter/src/config.rs
MUTANTS_FILES_engine := -f engine-ext/policy/src/cache.rs -f engine-ext/policy/src/pool.rs -f engine-ext/policy/src/host.rs \
	-f engine-ext/policy/src/victims.rs -f engine-ext/policy/src/hash.rs \
	-f engine-ext/policy/src/marker.rs -f engine-ext/policy/src/record.rs
# Unit tests only (`--lib`, for the build too: no doc-test copy of the crate).
MUTANTS_FILES_fleet := -f fleet/src/import/derive.rs -f fleet/src/import/mooncake.rs \
	-f fleet/src/import/bailian.rs -f fleet/src/import/agentx.rs -f fleet/src/report/compare.rs
MUTANTS_ARGS_wire := --profile mutants-quick --cargo-arg=--lib
MUTANTS_ARGS_placement := --profile mutants-quick --cargo-arg=--lib
MUTANTS_ARGS_filter := --profile mutants --cargo-arg=--lib
MUTANTS_ARGS_engine := --profile mutants-quick --cargo-arg=--lib
MUTANTS_ARGS_fleet := --profile mutants-quick --cargo-arg=--lib

# The pinned release, from crates.io; an installed copy of the same version is reused.
$(MUTANTS_TOOL):
	@mkdir -p $(MUTANTS_ROOT)/bin
	@if $(CARGO) mutants --version 2>/dev/null | grep -qx 'cargo-mutants $(CARGO_MUTANTS_VERSION)'; then \
		ln -sf "$$(command -v cargo-mutants)" $@; \
	else \
		$(CARGO) install --locked --quiet --version $(CARGO_MUTANTS_VERSION) \
			--root $(abspath $(MUTANTS_ROOT)) cargo-mutants; \
	fi

mutants-install: $(MUTANTS_TOOL)

# One shard's results go to <group>.<k>-of-<n>/ (the report merges a group's shards,
# so shards may run one after the other, side by side or on other machines).
mutants-dir = $(MUTANTS_OUT)/$(1)$(if $(MUTANTS_SHARD),.$(subst /,-of-,$(MUTANTS_SHARD)))

# $(call run-group,GROUP,EXTRA-ARGS)
define run-group
	@mkdir -p $(call mutants-dir,$(1))
	@echo "== mutants: $(1) $(2)"
	@start=$$(date +%s); \
	$(MUTANTS_TOOL) mutants --jobs 1 --no-times $(MUTANTS_FILES_$(1)) $(MUTANTS_ARGS_$(1)) \
		-o $(call mutants-dir,$(1)) $(2) | tee $(call mutants-dir,$(1))/run.log; rc=$${PIPESTATUS[0]}; \
	echo "$$(( $$(date +%s) - start ))" > $(call mutants-dir,$(1))/wall_s; \
	case $$rc in 0|2|3) ;; *) exit $$rc;; esac
endef

# One group without the report (the targets below loop over groups with it).
MUTANTS_EXTRA ?=
mutants-run-group: $(MUTANTS_TOOL)
	$(call run-group,$(G),$(MUTANTS_EXTRA) $(if $(MUTANTS_SHARD),--shard $(MUTANTS_SHARD) --sharding slice))

# The everyday run keeps its results apart from the record's (target/mutants-changed/).
MUTANTS_CHANGED := $(MUTANTS_OUT)-changed
mutants: $(MUTANTS_TOOL)
	@rm -rf $(MUTANTS_CHANGED) && mkdir -p $(MUTANTS_CHANGED)
	@git diff $$(git merge-base $(MUTANTS_BASE) HEAD) -- '*.rs' > $(MUTANTS_CHANGED)/changes.diff; \
	if [ ! -s $(MUTANTS_CHANGED)/changes.diff ]; then echo "no Rust changes since $(MUTANTS_BASE)"; exit 0; fi; \
	for g in $(MUTANTS_GROUPS); do \
		$(MAKE) --no-print-directory mutants-run-group G=$$g MUTANTS_OUT=$(MUTANTS_CHANGED) \
			MUTANTS_EXTRA="--in-diff $(MUTANTS_CHANGED)/changes.diff" || exit $$?; \
	done; \
	$(PYTHON) scripts/mutants-report.py $(MUTANTS_CHANGED) mutants/survivors.txt

mutants-full: $(MUTANTS_TOOL)
	@for g in $(MUTANTS_GROUPS); do \
		$(MAKE) --no-print-directory mutants-run-group G=$$g || exit $$?; \
	done
	@$(PYTHON) scripts/mutants-report.py $(MUTANTS_OUT) mutants/survivors.txt

mutants-group: mutants-run-group
	@test -n "$(G)" || { echo "usage: make mutants-group G=<$(MUTANTS_GROUPS)>"; exit 2; }
	@$(PYTHON) scripts/mutants-report.py $(MUTANTS_OUT) mutants/survivors.txt

mutants-rerun: $(MUTANTS_TOOL)
	@test -n "$(G)" || { echo "usage: make mutants-rerun G=<$(MUTANTS_GROUPS)>"; exit 2; }
	@$(PYTHON) scripts/mutants-report.py $(MUTANTS_OUT) mutants/survivors.txt --missed-regex $(G) \
		> $(MUTANTS_OUT)/$(G).rerun.re
	@mapfile -t res < $(MUTANTS_OUT)/$(G).rerun.re; \
	if [ $${#res[@]} -eq 0 ]; then echo "$(G): no missed mutants to re-test"; exit 0; fi; \
	args=(); for r in "$${res[@]}"; do args+=(--re "$$r"); done; \
	mkdir -p $(MUTANTS_OUT)/$(G).rerun; start=$$(date +%s); \
	$(MUTANTS_TOOL) mutants --jobs 1 --no-times $(MUTANTS_FILES_$(G)) $(MUTANTS_ARGS_$(G)) \
		-o $(MUTANTS_OUT)/$(G).rerun "$${args[@]}" | tee $(MUTANTS_OUT)/$(G).rerun/run.log; \
	echo "$$(( $$(date +%s) - start ))" > $(MUTANTS_OUT)/$(G).rerun/wall_s
	@$(PYTHON) scripts/mutants-report.py $(MUTANTS_OUT) mutants/survivors.txt

mutants-report:
	@$(PYTHON) scripts/mutants-report.py $(MUTANTS_OUT) mutants/survivors.txt
