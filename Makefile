# MiniPIC developer entry points. `make demo` and `make test` build .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
TINY_MODEL ?= .tiny-model
PYTEST_ARGS ?=

.PHONY: venv demo test test-fast tiny-model lint clean

venv:
	VENV=$(VENV) bash tools/bootstrap-venv.sh

$(TINY_MODEL)/config.json: | venv
	$(VENV)/bin/minipic make-tiny-model $(TINY_MODEL)

tiny-model: $(TINY_MODEL)/config.json

demo: venv tiny-model
	$(PY) -m minipic_client.demo --model $(TINY_MODEL)

test: venv
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# Unit tests only: no vLLM server is started.
test-fast: venv
	$(PY) -m pytest -ra -m "not server" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(TINY_MODEL) .pytest_cache
