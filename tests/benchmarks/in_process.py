"""Benchmark scripts in the test's own process, set up as a fresh interpreter would run them.

A fresh interpreter (``run_python``) costs two to five seconds of imports (torch, Pyro, Dynamo through
``torch.optim``, scikit-learn) per run, more than these scripts' tiny settings; the test process has them
loaded. Scripts that start worker processes (``--jobs N``) still run as commands: a spawned worker imports
the functions it runs by module name."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType

import torch

from ..experiments.test_data import _load_script
from ..helpers import main_in_process


@contextlib.contextmanager
def script(name: str) -> Iterator[ModuleType]:
    """The module of ``benchmarks/<name>.py``, under torch's defaults of a fresh interpreter (``float32``; the
    tests' default is ``float64``); the default dtype, torch's thread count and ``sys.path`` (the scripts put
    ``benchmarks/`` first) are restored on leaving."""
    dtype, threads, path = torch.get_default_dtype(), torch.get_num_threads(), list(sys.path)
    torch.set_default_dtype(torch.float32)
    try:
        yield _load_script(name)
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        sys.path[:] = path


def run_main(name: str, argv: list[str]) -> tuple[int, str, str]:
    """``benchmarks/<name>.py ARGV`` in this process (see :func:`script`): its exit status (argparse exits
    through ``SystemExit``), stdout and stderr."""
    with script(name) as module:
        return main_in_process(module.main, argv)
