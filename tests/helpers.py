"""Exact references shared by the tests."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from pyro.infer.autoguide import AutoNormal

from pyro_whvi import AutoVSDGuide, AutoWHVIGuide, ops

ROOT = Path(__file__).resolve().parents[1]

# Every guide configuration the one-model-object and data-parallel tests run through, by name.
GUIDES = {
    "whvi": lambda model: AutoWHVIGuide(model),
    "whvi-full": lambda model: AutoWHVIGuide(model, covariance="full"),
    "whvi-lowrank": lambda model: AutoWHVIGuide(model, covariance="lowrank", rank=2),
    "nf-whvi": lambda model: AutoWHVIGuide(model, flows=2),
    "whvi-paper": lambda model: AutoWHVIGuide(model, sites="paper"),
    "vsd": lambda model: AutoVSDGuide(model, reflections=2),
    "vsd-h": lambda model: AutoVSDGuide(model, hierarchical=True),
    "mfg": lambda model: AutoNormal(model),
}

# AutoVSDGuide's options, by name: tests/infer/test_vsd_guide.py and the conformance checks run through each.
VSD_OPTIONS: dict[str, dict] = {
    "T0": {"reflections": 0},
    "T1": {"reflections": 1},
    "T2": {"reflections": 2},
    "lowrank": {"reflections": 3, "hidden_rank": 2},
    "hierarchical": {"reflections": 2, "hierarchical": True},
    "hierarchical-gamma": {"reflections": 1, "hierarchical": True, "z_prior": ("gamma", 2.0, 2.0)},
}


def require_compiled_kernels() -> None:
    """Skip when the compiled kernels cannot be built, unless PYRO_WHVI_REQUIRE_COMPILED=1
    (set by `make test`), which turns that into a failure."""
    if ops.compiled_available():
        return
    reason = f"compiled kernels unavailable: {ops.backends.compiled_error()}"
    if os.environ.get("PYRO_WHVI_REQUIRE_COMPILED") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def checkout_environment(**overrides: str) -> dict[str, str]:
    """This process's environment for a child that imports this checkout (``PYTHONPATH`` first), with
    ``PYRO_WHVI_BACKEND`` unset unless given in ``overrides``."""
    env = dict(os.environ)
    env.pop("PYRO_WHVI_BACKEND", None)
    env.update(overrides)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_python(script: str, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    """Run a script in a fresh interpreter with :func:`checkout_environment`."""
    env = checkout_environment(**env_overrides)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env)


def whvi_in_process(*argv: str) -> tuple[int, str, str]:
    """``whvi ARGV`` in this process: its exit status (argparse exits through ``SystemExit``), stdout and stderr.
    For argument checks and single-process runs, where a fresh interpreter (:func:`run_python`) would cost more
    than the command."""
    from pyro_whvi.experiments.cli import main

    return main_in_process(main, list(argv))


def main_in_process(main: Callable[[list[str]], int | None], argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` of a command in this process: its exit status (argparse exits through ``SystemExit``; a
    ``main`` that returns ``None`` succeeded), stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code if isinstance(exit.code, int) else 1
    return status or 0, stdout.getvalue(), stderr.getvalue()


def gpytorch_training_step(model, num_data: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """GPyTorch's plain training loop for ``model`` (the README's): a Gaussian likelihood, the variational ELBO
    and one Adam over the model's and the likelihood's parameters; the returned ``step(x, y)`` takes one step."""
    import gpytorch

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=num_data)
    optimizer = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.01)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()

    return step


#: The start of a script run under Triton's interpreter: the Triton backend, a seed, and ``launched``, the names
#: of the kernels each launch starts, in order.
TRITON_LAUNCH_RECORDER = r"""
import torch
from pyro_whvi.ops import reference, triton_backend as tb

torch.manual_seed(0)
assert tb.triton_available()
launched = []
launch = tb._launch
tb._launch = lambda name, *args, **kwargs: (launched.append(name), launch(name, *args, **kwargs))
"""


def scipy_hadamard(size: int) -> torch.Tensor:
    """scipy's Walsh–Hadamard matrix scaled to be orthonormal."""
    return torch.from_numpy(scipy.linalg.hadamard(size).astype(np.float64)) / np.sqrt(size)


def dense_weight(s1: torch.Tensor, g: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """W = diag(s1) H diag(g) H diag(s2) for a shared g, or a batch of W (one per row of g)."""
    hadamard = scipy_hadamard(s1.shape[-1]).to(s1.dtype)
    return s1[..., :, None] * (hadamard * g[..., None, :]) @ hadamard * s2[..., None, :]


def whvi_a_matrix(s1: torch.Tensor, s2: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A of WHVI eq. 4, built entry by entry from scipy's Hadamard matrix: ``W.reshape(-1) = A g.reshape(-1)``.

    ``s1``/``s2`` are ``(K, D)``; the weight of ``shape`` is cut from the ``(K D, D)`` stack of blocks
    (rows, then padded columns dropped), or a vector read from the first entries of one ``D x D`` block.
    """
    num_blocks, size = s1.shape
    columns = []
    for k in range(num_blocks):
        for a in range(size):
            g = torch.zeros(num_blocks, size, dtype=s1.dtype)
            g[k, a] = 1.0
            stack = torch.cat([dense_weight(s1[j], g[j], s2[j]) for j in range(num_blocks)])
            if len(shape) == 1 or (len(shape) >= 2 and (shape[0] == 1 or int(np.prod(shape[1:])) == 1)):
                weight = stack.reshape(-1)[: int(np.prod(shape))]
            else:
                weight = stack[: shape[0], : int(np.prod(shape[1:]))]
            columns.append(weight.reshape(-1))
    return torch.stack(columns, dim=-1)


def regression_data(num: int = 32, d_in: int = 5):
    """A small smooth regression problem, ``x ~ N(0, I)``, ``y = sin(sum x)``."""
    x = torch.randn(num, d_in)
    return x, torch.sin(x.sum(-1))


def uci_directory(path):
    """A small dataset in the UCI split format under ``path`` (3 features, target in the last column,
    one split of 50 train / 10 test rows), so that tests need no ``../shared`` checkout."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    data = np.column_stack([x, np.sin(x[:, 0]) + 0.1 * rng.normal(size=60)])
    np.savetxt(path / "data.txt", data)
    np.savetxt(path / "index_features.txt", [0, 1, 2], fmt="%d")
    np.savetxt(path / "index_target.txt", [3], fmt="%d")
    np.savetxt(path / "index_train_0.txt", np.arange(50), fmt="%d")
    np.savetxt(path / "index_test_0.txt", np.arange(50, 60), fmt="%d")
    return path


def write_uci(directory, rows=40, features=3, splits=2, seed=0):
    """A random dataset in the UCI split format (90/10 splits) in ``directory``; returns its ``data.txt`` array."""
    rng = np.random.default_rng(seed)
    data = rng.normal(size=(rows, features + 1)) * [1.0, 2.0, 3.0, 1.0][: features + 1] + 5.0
    directory.mkdir(parents=True, exist_ok=True)
    np.savetxt(directory / "data.txt", data)
    np.savetxt(directory / "index_features.txt", np.arange(features), fmt="%d")
    np.savetxt(directory / "index_target.txt", [features], fmt="%d")
    for split in range(splits):
        order = rng.permutation(rows)
        np.savetxt(directory / f"index_train_{split}.txt", order[: rows * 9 // 10], fmt="%d")
        np.savetxt(directory / f"index_test_{split}.txt", order[rows * 9 // 10 :], fmt="%d")
    return data


def triton_autograd_functions(tb):
    """The CUDA dispatch's autograd formulas (pyro_whvi/ops/_library.py) around the Triton launchers of ``tb``
    (:mod:`pyro_whvi.ops.triton_backend`): ``(Fwht, Matvec, Design, Fastfood)`` autograd functions, to
    differentiate the kernels on CPU tensors under Triton's interpreter."""

    class Fwht(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, normalized):
            ctx.normalized = normalized
            return tb.fwht(x, normalized)

        @staticmethod
        def backward(ctx, grad):
            return tb.fwht(grad.contiguous(), ctx.normalized), None

    class Matvec(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s1, g, s2):
            ctx.save_for_backward(x, s1, g, s2)
            return tb.whvi_matvec(x, s1, g, s2)

        @staticmethod
        def backward(ctx, grad):
            x, s1, g, s2 = ctx.saved_tensors
            return tb.whvi_matvec_backward(grad.contiguous(), x, s1, g, s2)

    class Design(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, s1, s2):
            ctx.save_for_backward(x, s1, s2)
            return tb.whvi_design(x, s1, s2)

        @staticmethod
        def backward(ctx, grad):
            return tb.whvi_design_backward(grad.contiguous(), *ctx.saved_tensors)

    class Fastfood(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *tables):
            ctx.tables = tables
            return tb.fastfood(x, *tables)

        @staticmethod
        def backward(ctx, grad):
            return (tb.fastfood_transpose(grad.contiguous(), *ctx.tables), None, None, None, None)

    return Fwht, Matvec, Design, Fastfood
