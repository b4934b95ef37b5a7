# meshpoint — targets a newcomer can guess. Everything runs from a local .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench services clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

## demo: the main job on the embedded default (a SQLite file, no services needed)
demo: $(STAMP)
	$(BIN)/meshpoint demo

## test: the whole suite; PostgreSQL and NATS tests skip (with a reason) when they are down,
## unless MESHPOINT_REQUIRE_SERVICES=1 makes them fail instead (as CI does)
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_store.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/bench_runtime.py $(BENCH_RUNTIME_ARGS)
	$(BIN)/python benchmarks/bench_scaleout.py $(BENCH_SCALEOUT_ARGS)

## services: start PostgreSQL and NATS on this machine if they are down, and wait for them
services:
	bash scripts/services.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
