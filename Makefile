# Set-up and checks for pyro_whvi. `make demo` and `make test` are the two commands in the README.
#
# TORCH_SPEC pins the PyTorch build the environment gets. The default is the CPU build that this
# project's development machines keep on local disk; elsewhere use e.g. `make test TORCH_SPEC=torch`.

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: demo test quick install install-dev build-kernels lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" -e ".[experiments,bench]"

install-dev: $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" -e ".[dev,experiments,bench,baselines,lightning]"

build-kernels:
	$(BIN)/python -m pyro_whvi.ops.build

# The main job: `whvi demo` (1-D toy regression and digits with WHVI, NF-WHVI, MFG and MC dropout;
# table, predictive bands and reliability diagrams in ./whvi_demo), then the FWHT benchmark in quick mode (also
# written to ./whvi_demo, so the committed results in benchmarks/results stay as they are).
demo: install build-kernels
	$(BIN)/whvi demo --out whvi_demo
	$(BIN)/whvi bench fwht --quick --out whvi_demo

lint:
	$(BIN)/ruff check pyro_whvi tests benchmarks tutorials cuda/triton
	$(BIN)/ruff format --check pyro_whvi tests benchmarks tutorials cuda/triton
	$(BIN)/mypy

# Everything CI runs: all extras, lint, types, and the whole test suite with the compiled kernels required.
test: install-dev build-kernels lint
	PYRO_WHVI_REQUIRE_COMPILED=1 $(BIN)/python -m pytest

# The quick loop while developing: the tests not marked `slow` (see pyproject.toml), in the environment as
# it is (no install, no lint). `make test` runs the slow ones too.
quick:
	PYRO_WHVI_REQUIRE_COMPILED=1 $(BIN)/python -m pytest -m "not slow"

# All speed benchmarks (fwht, svi, vsd, gp), full size: results and plots in benchmarks/results.
bench: install-dev build-kernels
	$(BIN)/whvi bench all

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
