# One command each: `make demo` sets up and runs the main job; `make test` runs every check CI runs.
PYTHON ?= python3
VENV ?= .venv
# This pin takes the CPU wheel where one is on disk; set TORCH=torch for your platform's default build.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)" -e ".[test]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(BIN)/bertknn-search demo --dir demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_ingest.py --device cpu --model-size tiny
	$(BIN)/python benchmarks/bench_query.py
