# The two commands a newcomer needs: `make run` and `make test` (README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export CONTEXT_BIND ?= 127.0.0.1:5000
export CONTEXT_DATA_DIR ?= ./data

.PHONY: run serve test test-all test-fast test-postgresql bench quality memory soak fuzz clean lock container-smoke pg-cluster

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Dependencies come from the lock files (exact versions and hashes, made by `make lock`); the
# project itself is then installed editable without letting pip resolve anything else.
# Re-install only when the project or lock files change. (-qq for the project: setuptools prints a note about
# editable installs on every one; errors still show.)
$(VENV)/.installed: $(BIN)/python pyproject.toml clients/python/pyproject.toml requirements/run.txt
	$(BIN)/pip install --quiet --require-hashes -r requirements/run.txt
	$(BIN)/pip install -qq --no-deps -e . -e clients/python
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements/test.txt
	$(BIN)/pip install --quiet --require-hashes -r requirements/test.txt
	touch $@

# Benchmark tools are not locked (they never run in CI); the locked versions constrain what they share.
$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

# Refresh the lock files from pyproject.toml (pip-tools in a throwaway venv). Keeps current pins
# where they still fit; `make lock LOCK_ARGS=--upgrade` moves everything to the newest releases.
LOCK_VENV := .venv-lock
PIP_COMPILE = $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
	--no-emit-index-url --no-emit-find-links $(LOCK_ARGS)
lock:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet 'pip-tools>=7.4'
	$(PIP_COMPILE) -o requirements/run.txt pyproject.toml clients/python/pyproject.toml
	$(PIP_COMPILE) --extra test -c requirements/run.txt -o requirements/test.txt pyproject.toml clients/python/pyproject.toml
	rm -rf $(LOCK_VENV)

# /openapi.json's servers[0].url under make run: where this server answers (the service warns if
# Dify could not use it). Only for run/serve: tests must see the service's own default.
run serve: export CONTEXT_PUBLIC_URL ?= http://$(CONTEXT_BIND)
run: $(VENV)/.installed
	exec $(BIN)/context-mode run --data-dir $${CONTEXT_DATA_DIR:-./data}

serve: $(VENV)/.installed
	$(BIN)/context-mode serve

test: $(VENV)/.installed-test
	$(BIN)/ruff check --quiet
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The whole suite, nothing skipped, as CI runs it on a fresh machine (issue 26): first the system tools some
# tests need (.ci/setup.d: Chromium and a Chinese font, PostgreSQL 15, hadolint and docker-compose, the MCP
# Inspector; apt-get and npm, so root or sudo), then `make test`. Without them those tests skip and say why.
test-all:
	for step in .ci/setup.d/*.sh; do echo "== $$step"; bash "$$step" || exit 1; done
	$(MAKE) test

# Every test that can, on PostgreSQL alone (issue 18; ~15-20 min here): what `make test` runs on both
# backends (the front doors' contracts, manage, MCP, live, crash) plus everything else through a
# PostgreSQL store; tests of SQLite's own files (sqlite_only) run on SQLite.
test-postgresql: $(VENV)/.installed-test
	CONTEXT_TEST_BACKEND=postgresql $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# QUALITY_DATA: the folder holding the judged sets stard/ and scifact/ (bench/README.md, "Judged sets").
quality: $(VENV)/.installed-bench
	$(BIN)/python bench/quality.py

# Agent memory on LoCoMo (bench/memory.py): LOCOMO names the public locomo10.json (github.com/snap-research/locomo,
# data/locomo10.json; CC BY-NC 4.0, never shipped here) or a folder of conv-*.json files; by default the development
# half (conv-26,30,41,42,43: the README's table); CONVERSATIONS picks others; MEMORY_ARGS adds options (--store
# postgresql, --paths default,strong,primaries,building, --loco, --ablations). The data is checked before anything
# is installed.
MEMORY_DATA = $(if $(LOCOMO),--data $(LOCOMO)) $(if $(CONVERSATIONS),--conversations $(CONVERSATIONS))
memory:
	$(PYTHON) bench/memory.py --check-data $(MEMORY_DATA)
	$(MAKE) --no-print-directory $(VENV)/.installed-bench
	$(BIN)/python bench/memory.py $(MEMORY_DATA) $(MEMORY_ARGS)

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/search.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/http_bench.py

soak: $(VENV)/.installed-bench
	$(BIN)/python -m pytest -q -s tests/soak

# A larger schemathesis run than CI's (~300 requests per operation).
# Issue 12's fuzz run: schemathesis on every /openapi.json operation plus JSON-RPC on /mcp, Dify's
# /retrieval and raw bytes on every route; the counts go to bench/results/fuzz.json.
fuzz: $(VENV)/.installed-test
	rm -f bench/results/fuzz.json
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-3000} FUZZ_RESULTS=bench/results/fuzz.json \
		$(BIN)/python -m pytest -q -s -p no:cacheprovider --timeout=0 tests/test_fuzz_openapi.py tests/test_fuzz_doors.py

# Build the image and run it for real with podman (tools/container_smoke.py; not in CI: several minutes).
container-smoke: $(VENV)/.installed
	$(BIN)/python tools/container_smoke.py

# A throwaway PostgreSQL primary and streaming hot standby on loopback, to try CONTEXT_STORE (issue 18;
# docs/postgresql.md): prints CONTEXT_STORE and CONTEXT_STORE_REPLICA, stops and removes both on Ctrl-C or SIGTERM.
pg-cluster: $(VENV)/.installed
	$(BIN)/python tools/pg_cluster.py

clean:
	rm -rf $(VENV) .pytest_cache
