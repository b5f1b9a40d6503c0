# The two commands a newcomer needs: `make run` and `make test` (README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export CONTEXT_BIND ?= 127.0.0.1:5000
export CONTEXT_DATA_DIR ?= ./data
# /openapi.json's servers[0].url: where this server answers (the service warns if Dify could not use it).
export CONTEXT_PUBLIC_URL ?= http://$(CONTEXT_BIND)

.PHONY: run serve test test-fast bench quality soak fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-install only when the project files change.
$(VENV)/.installed: $(BIN)/python pyproject.toml clients/python/pyproject.toml
	$(BIN)/pip install --quiet -e . -e clients/python
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

run: $(VENV)/.installed
	$(BIN)/context-mode doctor --quiet
	exec $(BIN)/gunicorn -c service/gunicorn_conf.py 'service:create_app()'

serve: $(VENV)/.installed
	$(BIN)/context-mode serve

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

quality: $(VENV)/.installed-bench
	$(BIN)/python bench/quality.py

bench: $(VENV)/.installed-bench
	$(BIN)/python bench/search.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/http.py

soak: $(VENV)/.installed-bench
	$(BIN)/python -m pytest -q -s tests/soak

# A larger schemathesis run than CI's (~300 requests per operation).
fuzz: $(VENV)/.installed-test
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-3000} $(BIN)/python -m pytest -q -s tests/test_fuzz_openapi.py

clean:
	rm -rf $(VENV) .pytest_cache
