"""Shared test set-up: float64 by default, Pyro validation on, a clean param store, and the
list of backends every op test runs through."""

from __future__ import annotations

import os

import pyro
import pytest
import torch

from pyro_whvi import ops

from .helpers import require_compiled_kernels

BACKENDS = ("reference", "compiled")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs PYTEST_WORKERS workers (2: one per core of the CI machine); torch's default of one thread
    # per core in each would oversubscribe the cores. The processes that the tests start (the command, ranks,
    # tutorials) inherit one thread too, unless a test sets OMP_NUM_THREADS itself.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _defaults():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    with pyro.validation_enabled(True):
        yield
    torch.set_default_dtype(previous)


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Run the test once per backend. The compiled one is skipped when it cannot be built,
    unless PYRO_WHVI_REQUIRE_COMPILED=1 (set by `make test`), which turns that into a failure."""
    name = request.param
    if name == "compiled":
        require_compiled_kernels()
    with ops.use_backend(name):
        yield name


def pytest_collection_modifyitems(config, items):
    # The files with slow tests first, each file's tests kept together and in order. `make test` hands each
    # worker one file at a time in this order (pytest-xdist's loadfile with --no-loadscope-reorder: by default
    # xdist >= 3.5 reorders the files by their number of tests, which put this order out of effect until
    # 2026-12-05), so the long files start early and the many short ones fill in at the end. From one serial run's
    # times per file (3,267 s of tests), two workers in xdist's order by count would end 83 s after an even split,
    # in this order 15 s after it.
    slow_files = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: item.path not in slow_files)  # stable
    if torch.cuda.is_available():
        return
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip_cuda)
