# Two entry points (see README): `make demo` runs the main job on embedded defaults, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench install

$(BIN)/guardian: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# verl's own code and config for contract tests; --no-deps: it would pull torch, ray, vllm
	$(BIN)/pip install --quiet --no-deps verl==0.9.1
	touch $(BIN)/guardian

install: $(BIN)/guardian

demo: install
	$(BIN)/guardian demo

lint: install
	$(BIN)/ruff check guardian tests bench
	$(BIN)/ruff format --check guardian tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

bench: install
	# the detection bench compares with a peer on the same data: rlwatch (alert-only)
	$(BIN)/pip install --quiet 'rlwatch==0.5.1'
	$(BIN)/python bench/detection.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/trainer.py
	$(BIN)/python bench/remediation.py
	$(BIN)/python bench/observability.py
