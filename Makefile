# `make help` lists the targets. `make run` and `make test` do their whole set-up on a fresh clone;
# repeated runs reuse the virtual environment and the built extension (stamps in .stamps/).

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps
RUST_SOURCES := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml Cargo.lock
CONFIG ?= config/demo.toml
PORT ?= 8080
SIM_PORT ?= 9911
# pytest's files run on this many workers (pytest-xdist; each file stays on one worker, where its
# module fixtures are set up once). Most of a test waits on real processes: on 2 cores, 3 workers
# ran the suite in 6 minutes where one took 13. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Python dependencies straight from pyproject.toml: runtime, test, dev and otlp (bench extras: bench-tools).
REQUIREMENTS = $(BIN)/python -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
	  [print(d) for d in p["build-system"]["requires"] + p["project"]["dependencies"] \
	   + [x for extra in sys.argv[1:] for x in p["project"]["optional-dependencies"][extra]]]'

$(STAMPS)/deps: pyproject.toml | $(BIN)/python
	@mkdir -p $(STAMPS)
	$(REQUIREMENTS) test dev otlp > $(STAMPS)/requirements.txt
	$(BIN)/pip install --quiet -r $(STAMPS)/requirements.txt
	@touch $@

# The Rust extension, release build, installed editable into the venv (python/ stays the source).
# `make test-quick` installs a build without fat LTO instead (ext-quick); each removes the other's
# stamp, so `make test`, `make run` and the benchmarks always get the release build back.
MATURIN_DEVELOP = VIRTUAL_ENV=$(abspath $(VENV)) PATH="$(abspath $(BIN)):$$PATH" $(BIN)/maturin develop --locked --quiet
$(STAMPS)/ext: $(STAMPS)/deps $(RUST_SOURCES)
	rm -f $(STAMPS)/ext-quick
	$(MATURIN_DEVELOP) --release
	@touch $@

$(STAMPS)/ext-quick: $(STAMPS)/deps $(RUST_SOURCES)
	rm -f $(STAMPS)/ext
	$(MATURIN_DEVELOP) --profile quick
	@touch $@

Cargo.lock:
	cargo generate-lockfile

.PHONY: setup
setup: $(STAMPS)/ext ## create the venv, install dependencies, build the extension

.PHONY: run
run: setup ## start the simulator and the gateway; prints the base URL and a demo key
	$(BIN)/gateway demo --config $(CONFIG) --port $(PORT) --sim-port $(SIM_PORT)

.PHONY: test
test: setup lint test-rust test-py ## the whole suite: lint, Rust unit tests, then pytest

.PHONY: test-quick
test-quick: $(STAMPS)/ext-quick $(STAMPS)/js $(STAMPS)/chromium ## for development: no LTO build, no lint, pytest without the slow tests
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not slow"

.PHONY: test-rust
test-rust: ## cargo tests of the core (no Python)
	cargo test --locked -p gateway-core --release

.PHONY: screenshots
screenshots: setup $(STAMPS)/chromium ## the console's browser tests, saving docs/console/*.png
	GATEWAY_SCREENSHOTS=1 $(BIN)/python -m pytest -q tests/gateway/test_console_account.py tests/gateway/test_console_playground.py

.PHONY: test-py
test-py: setup $(STAMPS)/js $(STAMPS)/chromium ## pytest (real processes: gateway on Granian, simulator, official clients)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The JavaScript clients the suite runs (tests/js: the Vercel AI SDK), exactly as package-lock.json
# pins them. Without npm nothing is installed and the test that needs them is skipped, saying why.
$(STAMPS)/js: tests/js/package.json tests/js/package-lock.json
	@mkdir -p $(STAMPS)
	@if command -v npm >/dev/null; then \
	  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the tests of JavaScript clients will be skipped"; fi

# The browser the console's tests drive through Playwright: Debian's chromium at /usr/bin/chromium
# (Playwright's own browser download cannot be used here). sudo only when not root. If it cannot be
# installed the stamp is not made and the browser tests are skipped, saying why (they fail instead
# under GATEWAY_REQUIRE_SERVICES=1, as in CI).
$(STAMPS)/chromium:
	@mkdir -p $(STAMPS)
	@if [ -x /usr/bin/chromium ]; then touch $@; else \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  if $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium; then touch $@; \
	  else echo "chromium could not be installed: the browser tests will be skipped"; fi; \
	fi

# What the benchmarks need beyond the test set-up: wrk (Debian), chart and packaging libraries,
# LiteLLM's proxy in its own venv, Portkey's gateway from npm (skipped without Node.js).
$(STAMPS)/bench-tools: $(STAMPS)/deps benches/install_litellm.py
	command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
	command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
	$(REQUIREMENTS) bench > $(STAMPS)/bench-requirements.txt
	$(BIN)/pip install --quiet -r $(STAMPS)/bench-requirements.txt
	$(BIN)/python benches/install_litellm.py
	if command -v npm >/dev/null; then npm install --silent --no-audit --no-fund --prefix benches/.portkey \
	  @portkey-ai/gateway@1.15.2; fi
	@touch $@

.PHONY: bench-tools
bench-tools: $(STAMPS)/bench-tools ## install wrk, LiteLLM and Portkey for the benchmarks

.PHONY: bench
bench: setup bench-tools ## every path, workload and concurrency, micro-benchmarks (about 15 minutes)
	$(BIN)/python benches/run.py

.PHONY: bench-quick
bench-quick: setup bench-tools ## gateway vs LiteLLM, chat at concurrency 1 and 64 (and a 4 KB prompt at 64), a stream, about 5 minutes
	$(BIN)/python benches/run.py --quick

.PHONY: bench-ab
bench-ab: setup bench-tools ## the gateway at BASE=<commit> against the working tree, interleaved rounds (AB_FLAGS=--keys: also over 50 keys; --limited: also a rate-limited key; --prompt: also a 4 KB prompt; --pg: both on PostgreSQL + Redis; --first-token: also the paced streams' first token)
	@test -n "$(BASE)" || { echo "usage: make bench-ab BASE=<commit>"; exit 2; }
	$(BIN)/python benches/ab.py $(BASE) $(AB_FLAGS)

.PHONY: bench-profile
bench-profile: setup bench-tools ## a flame graph and per-thread CPU of one worker under chat load (benches/results/profile*)
	$(BIN)/python benches/profile.py

.PHONY: bench-instructions
bench-instructions: setup bench-tools ## instructions per chat request, gateway (embedded and on PostgreSQL + Redis) and stack floor, by callgrind (benches/results/instructions.md)
	$(BIN)/python benches/instructions.py

.PHONY: bench-soak
bench-soak: setup bench-tools ## one worker's memory and CPU per request over a long mixed run (SOAK_FLAGS="--path gateway-pg --minutes 45"; benches/results/soak-*.md)
	$(BIN)/python benches/soak.py $(SOAK_FLAGS)

.PHONY: bench-core
bench-core: ## Criterion benchmarks of the Rust core alone (stream rewriters, json.rs), about two minutes
	cargo bench --locked -p gateway-core

# Distribution: one abi3 wheel (the extension built against CPython's stable ABI from 3.11, so the
# same file installs on every CPython >= 3.11 of this platform), release and stripped, and an sdist.
.PHONY: wheel
wheel: $(STAMPS)/deps ## build dist/gateway-*.whl (abi3, release, stripped) and the sdist
	rm -f dist/gateway-*.whl dist/gateway-*.tar.gz
	$(BIN)/maturin build --release --strip --locked --out dist
	$(BIN)/maturin sdist --out dist
	@ls -l dist/gateway-*

# The wheel installed into a fresh venv of $(PYTHON) with no source tree, PYTHONPATH or Rust on its
# PATH, then `gateway demo` from it: the openai client's plain and streamed requests, the console.
.PHONY: wheel-smoke
wheel-smoke: wheel ## install the wheel into a clean venv and smoke-test `gateway demo` from it
	$(PYTHON) tests/wheel/smoke.py

.PHONY: lint
lint: setup ## formatting, clippy, ruff, mypy and the stub check
	cargo fmt --all --check
	cargo clippy --locked --all-targets -- -D warnings
	$(BIN)/ruff format --check python tests benches
	$(BIN)/ruff check python tests benches
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest gateway._core

.PHONY: fmt
fmt: setup ## format Rust and Python sources
	cargo fmt --all
	$(BIN)/ruff format python tests benches
	$(BIN)/ruff check --fix python tests benches

.PHONY: clean
clean: ## remove build output, the venv and local data
	rm -rf $(VENV) $(STAMPS) target var dist python/gateway/*.so benches/.venv-litellm benches/.portkey \
	  tests/js/node_modules
