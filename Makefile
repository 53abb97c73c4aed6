# Two entry points (see README): `make demo` runs the main job on embedded defaults, `make test` runs the suite
# (lint, then tests/unit, tests/integration, tests/e2e and gpu/tests). `make unit`: the pure tier alone, under a minute.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test unit lint bench install gpu-test-deps

$(BIN)/guardian: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# .[dev]: the test and lint tools and every extra (.[all]: postgres, grafana, wandb, ray, recipe)
	$(BIN)/pip install --quiet -e '.[dev]'
	# verl's own code and config for contract tests; --no-deps: it would pull torch, ray, vllm
	$(BIN)/pip install --quiet --no-deps verl==0.9.1
	touch $(BIN)/guardian

install: $(BIN)/guardian

# what gpu/tests and the recipe's verl agent-loop tests need beyond the project (CI installs it; without it those
# tests are not collected): the CPU build of torch, transformers in verl 0.9.1's range, Ray and the rest of verl's
# import chain (the agent loop's: pillow, datasets, cachetools)
gpu-test-deps: install
	# ray[default]: the dashboard and its Jobs API (tests/e2e/test_ray_jobs.py, guardian run --ray-address);
	# packaging<26: tensordict's pyvers refuses the newer one ray[default]'s virtualenv pulls in
	$(BIN)/pip install --quiet torch==2.13.0 'transformers>=5.5.3,<5.11' pyarrow 'ray[default]==2.60.0' 'packaging>=25,<26' tensordict==0.10.0 codetiming \
		pillow 'datasets==5.2.0' cachetools

demo: install
	$(BIN)/guardian demo

lint: install
	$(BIN)/ruff check guardian tests bench gpu recipe
	$(BIN)/ruff format --check guardian tests bench gpu recipe
	$(BIN)/mypy
	# the import layers of pyproject.toml's [tool.importlinter] (docs/ARCHITECTURE.md §2)
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q

# no processes, servers or browsers: checks, decisions, policy, trend, pins plan, parsers
unit: install
	$(BIN)/pytest -q tests/unit

bench: install
	$(BIN)/python bench/detection.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/trainer.py
	$(BIN)/python bench/remediation.py
	$(BIN)/python bench/observability.py
	$(BIN)/python bench/retrieval.py
