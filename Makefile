# Two commands on a fresh machine: `make quickstart` (installs, then builds the built-in task, trains PPO, judges it
# against the SFT model and writes the report) and `make test` (installs, then runs the test suite). Both create
# .venv on first use. `make docs` regenerates the generated pages of docs/.
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Without a GPU, take the CPU build of torch first: a bare `torch` requirement pulls a multi-GB CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

quickstart: install
	$(VENV)/bin/rlhfkit quickstart

test: install
	$(PY) -m pytest -q

# The fast loop while editing: the suite without the tests marked slow (subprocess and 2-process runs, browser,
# TRL-script and learning tests, default-preset assets). `make test` runs them all, as CI does.
test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# Every generated page of docs/ (metrics, health rules, TRL flags), from the code that knows its facts; `python
# docs/generate.py --check` only names the stale ones. It imports bench/health/ and TRL, so it lives outside rlhfkit/.
docs: install
	$(PY) docs/generate.py

.PHONY: install quickstart test test-fast lint docs
