# One command each: `make demo` sets up and runs the main job; `make test` runs every check CI runs.
PYTHON ?= python3
VENV ?= .venv
# This pin takes the CPU wheel where one is on disk; set TORCH=torch for your platform's default build.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench browser engines

# torch goes in with pip, which honours a local wheel (pip's find-links) that uv does not look at; uv
# then installs the rest in parallel (30 s here where pip took 3-5 min), pip when uv cannot.
# Each step says what it installs and about how long it takes first: pip and uv are quiet (-q) meanwhile.
$(VENV)/.installed: pyproject.toml
	@echo "setup: creating $(VENV) and installing torch ($(TORCH): 1-5 min, a GB or more unless a CPU wheel is on disk), then"
	@echo "       the package with its test extras (fastapi, tantivy, opensearch-py, ...: about 1 min); once only"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv "$(TORCH)"
	@echo "setup: torch installed; now the package and its dependencies"
	$(BIN)/uv pip install -q --python $(BIN)/python -e ".[test]" || $(BIN)/python -m pip install -q -e ".[test]"
	touch $@
	@echo "setup: done ($(VENV))"

setup: $(VENV)/.installed

demo: setup
	@echo "demo: a tiny BERT and a corpus of invented facts, ingested into demo/index, then three questions"
	$(BIN)/bertknn-search demo --dir demo

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The server's browser test drives Debian's Chromium: installed here when missing (as root with apt-get,
# as CI runs), a no-op when present; elsewhere the test skips and says why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium and chromium-driver for the browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver >/dev/null; \
	else echo "chromium not installed and not installable here (not root, or no apt-get): the browser test will skip"; fi

# The engine tests start real OpenSearch and Elasticsearch nodes from Maven Central jars: they need a JDK
# (17+) and Maven, installed here when missing (as root with apt-get, as CI runs); elsewhere they skip.
engines:
	@if command -v javac >/dev/null && command -v mvn >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing a JDK and Maven for the engine tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			openjdk-17-jdk-headless maven >/dev/null; \
	else echo "no JDK or Maven and not installable here: the engine tests will skip"; fi

# The docs (docs/, mkdocs.yml) build with --strict: a broken link or anchor, or a page left out of the nav,
# fails. Quiet unless it fails: mkdocs's own -q would hide the warnings --strict counts (mkdocs#4126).
test: lint browser engines
	@out=$$($(BIN)/mkdocs build --strict --clean --site-dir site 2>&1) || { echo "$$out"; exit 1; }
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_ingest.py --device cpu --model-size tiny
	$(BIN)/python benchmarks/bench_query.py
