# The single entry point. `make demo` and `make test` work on a fresh clone with
# only Python 3.11+ installed: they create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-latest dist lint typecheck bench check clean example-stripe example-postgres

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "agent-saga needs Python 3.11+; set PYTHON=python3.11 (or newer)")'
	$(PYTHON) -m venv $(VENV)

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	@touch $@

# The test environment: `.[dev]` (every extra the suite needs, the five agent
# frameworks included) resolved under constraints/test.txt, so every installer gets
# the same versions. uv (from PyPI, pinned by the same file) installs it in seconds;
# plain pip is the fallback when uv cannot be installed, or with `make test USE_UV=0`.
USE_UV      ?= 1
CONSTRAINTS := constraints/test.txt
PIP         := $(BIN)/python -m pip --quiet --disable-pip-version-check

$(VENV)/.installed-dev: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	@if [ "$(USE_UV)" = 1 ] && { [ -x $(BIN)/uv ] || $(PIP) install -c $(CONSTRAINTS) uv; } \
		&& echo "installing .[dev] with uv" \
		&& $(BIN)/uv pip install --quiet --python $(BIN)/python -c $(CONSTRAINTS) -e '.[dev]'; \
	then :; else \
		echo "installing .[dev] with pip (uv unavailable, failed, or USE_UV=0)"; \
		$(PIP) install -c $(CONSTRAINTS) -e '.[dev]'; \
	fi
	@touch $@ $(VENV)/.installed-base

demo: $(VENV)/.installed-base
	$(BIN)/python examples/demo.py

# scripts/testenv starts the services the suite needs (installing Debian packages
# when missing and run as root; Arize Phoenix from PyPI into .venv-phoenix, pinned by
# constraints/phoenix.txt), runs pytest with them, and stops them. The suite runs
# on PYTEST_WORKERS pytest-xdist workers (0: in this process, one test at a time);
# every test keeps its state in its own temporary directory, database or key space,
# so any split is safe. The seconds per test directory are printed at the end.
PYTEST_WORKERS ?= 3
test: $(VENV)/.installed-dev
	$(BIN)/python scripts/testenv run -- $(BIN)/python -m pytest -n $(PYTEST_WORKERS)

# Each framework extra alone, at the newest versions its range allows (what a user's
# `pip install` gets today; the test environment pins older ones so that all five
# co-install): per framework a venv with only the wheel and that extra, the documented
# example, then that framework's adapter tests. Needs PyPI; 5-8 min on 2 cores. Not part
# of `make test` or CI (whose result must not change when PyPI does): run it weekly,
# before every release and when a framework ships one (README, Development); fix the
# adapter a new release breaks, not the range.
test-latest: $(VENV)/.installed-dev
	$(BIN)/python scripts/test_latest.py

# The sdist and the wheel in dist/, checked (twine check --strict, py.typed and the
# license inside). Until sagaops-agent-saga is on PyPI, the wheel is how it gets to
# another machine: pip install dist/sagaops_agent_saga-*.whl
$(VENV)/.installed-dist: $(CONSTRAINTS) | $(BIN)/python
	$(PIP) install -c $(CONSTRAINTS) build twine
	@touch $@

dist: $(VENV)/.installed-dist
	$(BIN)/python scripts/dist_tools.py dist

# The connector examples run against the same local servers as the tests: localstripe
# (started by the example itself) and a throw-away PostgreSQL (started by testenv).
example-stripe: $(VENV)/.installed-dev
	$(BIN)/python examples/stripe_refund.py

example-postgres: $(VENV)/.installed-dev
	$(BIN)/python scripts/testenv run --only postgres -- $(BIN)/python examples/postgres_rollback.py

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

check: lint typecheck test

$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	@touch $@

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/bench_core.py

clean:
	rm -rf $(VENV) $(VENV)-phoenix .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist
