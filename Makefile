# Two commands: `make run` trains the default recipe, `make test` runs the test suite.
# Each creates .venv on first use and reinstalls only when pyproject.toml changes.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/gpt_tiny.yaml
ARGS ?=

.PHONY: run test bench-smoke mutate clean

# torch/torchvision are pinned here, not in pyproject.toml: 2.14.1/0.29.1 lie on the CPU machines'
# local wheel store, while the GPU machine brings its own torch 2.11 (see BENCHMARKING notes).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m recipes $(CONFIG) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -ra tests

bench-smoke: $(STAMP)
	$(PY) -m benchmarks --smoke

# Breaks the package on purpose in a temporary copy, one way at a time, and checks that the tests
# notice (tests/mutations.py lists the breakages and their tests). Not part of `make test`: minutes.
mutate: $(STAMP)
	$(PY) tests/mutations.py

clean:
	rm -rf $(VENV) runs lightning_logs
