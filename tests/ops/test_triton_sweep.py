"""The Triton kernels against the compiled C++ CPU kernels on every power of two ``D = 2 ... 2^15``.

Every op the Triton backend implements, forward and gradient, runs through its launcher
(:mod:`pyro_whvi.ops.triton_backend`) under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors,
the kernel source a GPU compiles) and through the C++ kernels (``pyro_whvi.ops`` with the compiled
backend) on the same inputs. The error is ``max|a - b| / max|b|`` over all entries (the infinity norm
of the difference over the infinity norm of the C++ result ``b``); it must be at most 1e-5 in float32
and 1e-12 in float64. One output is measured otherwise: the Fourier-design backward's row sums, a sum of
``~D^2`` terms that cancel, relative to the sum of their magnitudes (see ``_run_case``).

Gradients go through ``torch.autograd.Function`` wrappers with the CUDA dispatch's formulas
(``pyro_whvi/ops/_library.py``) around the launchers, against autograd through the C++ kernels: the
gradient of ``fastfood`` is ``fastfood_transpose`` (and that op's gradient ``fastfood``), ``whvi_matvec``'s
is ``whvi_matvec_backward`` (all four inputs need a gradient: the x-only transposed product is not
exercised here) and ``whvi_design``'s is ``whvi_design_backward``.

Where the dispatcher leaves the fused kernel at a size (rows longer than ``MAX_FUSED_SIZE``, float64
backward kernels above 4096, Fastfood's permutation through a scratch slot above ``GATHER_LIMIT``),
the case tests what the dispatcher does there, names that path in its id, and checks which kernels
were launched. Large sizes use one row (a "sampled" batch): the interpreter is slow.

The design ops (``whvi_design``, its backward, the RF Fourier-design backward) take ``D x D``
matrices, so one matrix at ``D = 2^15`` is 4 GiB (float32) and beyond 8192 the dispatcher sends them to the
pure-PyTorch reference (no Triton kernel). Their interpreter cost grows as ``D^2``: the default sweep
stops them at :data:`DESIGN_MAX` = 1024, where every size up to 8192 takes the same kernel path (the 2048
cases alone took 18 of the sweep's 49 s here); ``PYRO_WHVI_TRITON_SWEEP_FULL=1`` runs them up to 8192 (those
18 s, then about two more minutes and 5 GB of memory above 2048).

The sweep runs once per session in a subprocess (the interpreter is chosen when the kernels module is
imported, and other tests import it compiled for a GPU); each case is its own parametrized test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
import zlib

import pytest
import torch

from ..helpers import ROOT, checkout_environment, require_compiled_kernels, triton_autograd_functions

pytestmark = pytest.mark.slow  # the module's sweep fixture runs every case under Triton's interpreter

# Dispatcher limits (cuda/triton/kernels.py); the sweep checks that the kernels launched match them.
MAX_FUSED_SIZE = 8192  # longer rows: two-pass FWHT, unfused compositions, design ops to the reference
GATHER_LIMIT = 1024  # Fastfood above it permutes through the output row's slot (same kernel)
F64_BACKWARD_FUSED = 4096  # float64 whvi_matvec_backward / whvi_design_backward kernels stop here

FULL = os.environ.get("PYRO_WHVI_TRITON_SWEEP_FULL") == "1"
SIZES = [2**k for k in range(1, 16)]
DESIGN_MAX = MAX_FUSED_SIZE if FULL else 1024
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
MATVEC_LAYOUTS = ("shared", "per_example", "stacked")
#: Above the fused size each unfused whvi_matvec case costs seconds (a stacked one twice: two rows).
LARGE_MATVEC_LAYOUT = {
    (2**14, "float32"): "stacked",
    (2**14, "float64"): "per_example",
    (2**15, "float32"): "per_example",
    (2**15, "float64"): "shared",
}


def _rows(size: int) -> int:
    """Rows of a batch: several where the fused kernels make it cheap (5 leaves a partial program), one above."""
    return 5 if size <= 1024 else (3 if size <= MAX_FUSED_SIZE else 1)


def _matrices(size: int) -> int:
    """``D x D`` matrices of the design ops: the interpreter loops over ``D^2 / 4096`` tiles per matrix."""
    return 3 if size <= 64 else (2 if size <= 256 else 1)


def _paths(op: str, size: int, dtype: str) -> tuple[str, list[str], str, list[str]]:
    """(forward path, its launched kernels, gradient path, its launched kernels) the dispatcher takes."""
    large = size > MAX_FUSED_SIZE
    transform = ["fwht_kernel"] * (2 if large else 1)  # one launch per tb.fwht call (two passes above 8192)
    backward_fused = size <= (F64_BACKWARD_FUSED if dtype == "float64" else MAX_FUSED_SIZE)
    if op.startswith("fwht"):
        path = "two_pass" if large else "fused"
        return path, transform, path, transform
    if op.startswith("whvi_matvec"):
        forward = ("unfused", transform * 2) if large else ("fused", ["whvi_matvec_kernel"])
        backward = ("fused", ["whvi_matvec_backward_kernel"]) if backward_fused else ("unfused", transform * 4)
        return (*forward, *backward)
    if op == "fastfood":  # its gradient is fastfood_transpose
        if large:
            return "unfused", transform * 2, "unfused", transform * 2
        path = "register_gather" if size <= GATHER_LIMIT else "scratch_gather"
        return path, ["fastfood_kernel"], path, ["fastfood_transpose_kernel"]
    design = ("fused", ["whvi_design_backward_kernel"]) if backward_fused else ("reference", [])
    if op == "whvi_design":
        return "fused", ["whvi_design_kernel"], *design
    assert op == "whvi_fourier_design_backward"
    return design[0], [], *design  # a backward only (of the design on Fourier features): no forward


def _case_id(op: str, size: int, dtype: str) -> str:
    forward, _, backward, _ = _paths(op, size, dtype)
    path = forward if forward == backward else f"{forward}-grad_{backward}"
    return f"{op}-{dtype}-D{size}-{path}"


def _cases() -> list[tuple[str, int, str]]:
    cases = []
    for size in SIZES:
        for dtype in TOLERANCE:
            ops = ["fwht", "fwht_pm1", "fastfood"]
            if size <= MAX_FUSED_SIZE:
                ops += [f"whvi_matvec[{layout}]" for layout in MATVEC_LAYOUTS]
            else:  # one layout per (D, dtype) above the fused size (the unfused path broadcasts in PyTorch)
                ops.append(f"whvi_matvec[{LARGE_MATVEC_LAYOUT[size, dtype]}]")
            if size <= DESIGN_MAX:
                ops += ["whvi_design", "whvi_fourier_design_backward"]
            cases += [(op, size, dtype) for op in ops]
    return cases


CASES = _cases()


# ---------------------------------------------------------------------------------------------------
# The worker: runs in a subprocess with TRITON_INTERPRET=1 (see _sweep_main).


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|a - b| / max|b|``: infinity norm of the difference over that of the C++ result ``b``."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (actual.shape, expected.shape)
    difference = (actual.double() - expected.double()).abs().max().item()
    scale = expected.double().abs().max().item()
    return difference / scale if scale > 0 else difference


def _triton_matvec(matvec, x, s1, g, s2):
    """``ops.whvi_matvec``'s layout preparation (what a CUDA call hands the kernel), then the Triton product."""
    from pyro_whvi import ops
    from pyro_whvi.ops._checks import has_kernel_layout

    if not has_kernel_layout(x, s1, g, s2):
        shape = torch.broadcast_shapes(x.shape, s1.shape, g.shape, s2.shape)
        x = x.expand(shape) if x.shape != shape else x
        s1, g, s2 = (ops._as_suffix_of(t, shape) for t in (s1, g, s2))
    return matvec.apply(x, s1, g, s2)


def _run_case(op: str, size: int, dtype: torch.dtype, functions, tb, launched: list[str]) -> tuple:
    """Errors of the forward and of each gradient, the kernels each part launched, and measures not checked."""
    from pyro_whvi import ops

    fwht_fn, matvec_fn, design_fn, fastfood_fn = functions
    generator = torch.Generator().manual_seed(zlib.crc32(f"{op}-{size}-{dtype}".encode()))

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)

    def leaves(*tensors):
        return [t.clone().requires_grad_(True) for t in tensors]

    def both(triton_fn, cpp_fn, inputs, names):
        """Forward errors and launches; then the gradients of ``<y, grad>`` w.r.t. ``inputs`` (named ``names``)."""
        launched.clear()
        triton_inputs, cpp_inputs = leaves(*inputs), leaves(*inputs)
        triton_out = triton_fn(*triton_inputs)
        forward_launched = list(launched)
        cpp_out = cpp_fn(*cpp_inputs)
        grad = randn(*triton_out.shape)
        launched.clear()
        triton_grads = torch.autograd.grad(triton_out, triton_inputs, grad)
        grad_launched = list(launched)
        cpp_grads = torch.autograd.grad(cpp_out, cpp_inputs, grad)
        errors = {"forward": _relative_error(triton_out.detach(), cpp_out.detach())}
        for name, got, want in zip(names, triton_grads, cpp_grads):
            errors[f"grad_{name}"] = _relative_error(got, want)
        return errors, forward_launched, grad_launched, {}

    n = _rows(size)
    if op in ("fwht", "fwht_pm1"):
        normalized = op == "fwht"
        return both(lambda x: fwht_fn.apply(x, normalized), lambda x: ops.fwht(x, normalized), [randn(n, size)], ["x"])
    if op.startswith("whvi_matvec"):
        layout = op[len("whvi_matvec[") : -1]
        if layout == "shared":
            shapes = [(n, size), (size,), (size,), (size,)]
        elif layout == "per_example":
            shapes = [(n, size), (size,), (n, size), (size,)]
        else:  # stacked blocks: K = 3 (2 above the fused size) shared diagonals, every input through each
            blocks = 3 if size <= MAX_FUSED_SIZE else 2
            shapes = [(n, 1, size), (blocks, size), (blocks, size), (blocks, size)]
        inputs = [randn(*shape) for shape in shapes]
        return both(lambda *a: _triton_matvec(matvec_fn, *a), ops.whvi_matvec, inputs, ["x", "s1", "g", "s2"])
    if op == "fastfood":
        blocks = 3 if size <= MAX_FUSED_SIZE else 1
        signs = (torch.randint(0, 2, (blocks, size), generator=generator) * 2 - 1).to(dtype)
        permutation = torch.argsort(torch.rand(blocks, size, generator=generator), dim=-1)
        tables = (signs, permutation, randn(blocks, size), randn(blocks, size))
        return both(
            lambda x: fastfood_fn.apply(x, *tables), lambda x: ops.fastfood(x, *tables), [randn(n, size)], ["x"]
        )
    m = _matrices(size)
    if op == "whvi_design":
        inputs = [randn(m, size, size), randn(size), randn(size)]
        return both(design_fn.apply, ops.whvi_design, inputs, ["x", "s1", "s2"])
    assert op == "whvi_fourier_design_backward"
    features = size * size if size == 2 else 2 * (size * size // 3)  # zero-padded to D^2 (all of it at D = 2)
    angles, scale = randn(m, features // 2), randn(m, 1).abs() + 0.5
    grad, s1, s2 = randn(m, size), randn(size), randn(size)
    args = (grad, torch.cat([scale * angles.cos(), scale * angles.sin()], -1), s1, s2)
    launched.clear()
    triton_out = tb.whvi_fourier_design_backward(*args)
    grad_launched = list(launched)
    cpp_out = torch.ops.pyro_whvi.whvi_fourier_design_backward(*args)  # the C++ CPU kernel
    parts = ("angles", "s1", "s2")
    errors = {f"grad_{name}": _relative_error(a, b) for name, a, b in zip(parts, triton_out, cpp_out)}
    # The row sums sum_f R_f dR_f add ~D^2 terms of both signs that cancel (|sum| / sum_f |R_f dR_f| is
    # 2e-5 at D = 2048), so max|a - b| / max|b| measures the cancellation, not the kernels: in float32 the
    # C++ kernel's sum is 8e-4 and the Triton path's 3e-5 from the float64 value there. Their error is taken
    # relative to max over rows of sum_f |R_f dR_f|, the norm that bounds a sum's rounding; the plain
    # measure is kept, unchecked, as "row_sums_vs_max|b|".
    padded = torch.nn.functional.pad(args[1], (0, size * size - features)).unflatten(-1, (size, size))
    dpadded = torch.ops.pyro_whvi.whvi_design_backward(grad, padded, s1, s2)[0]
    summands = (padded.double() * dpadded.double()).abs().flatten(-2).sum(-1).max().item()
    difference = (triton_out[3].double() - cpp_out[3].double()).abs().max().item()
    errors["grad_row_sums"] = difference / summands
    unchecked = {"row_sums_vs_max|b|": _relative_error(triton_out[3], cpp_out[3])}
    return errors, [], grad_launched, unchecked


class _Recorder:
    """A kernel that records its name each time it is launched (``kernel[grid](...)``)."""

    def __init__(self, kernel, name: str, launched: list[str]):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


def _sweep_main() -> None:
    """Run every case; print one JSON object (case id to errors, launches or the exception) as the last line."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from pyro_whvi import ops
    from pyro_whvi.ops import triton_backend as tb

    torch.manual_seed(0)
    module = tb.kernels()
    assert module is not None, "Triton cannot be imported"
    launched: list[str] = []
    for name in tb.KERNELS:
        kernel = getattr(module, name)
        assert type(kernel).__name__ == "InterpretedFunction", (name, type(kernel))
        setattr(module, name, _Recorder(kernel, name, launched))
    ops.load_compiled()
    for name in ("fwht", "whvi_matvec", "whvi_matvec_backward", "whvi_design", "whvi_design_backward",
                 "whvi_fourier_design_backward", "fastfood", "fastfood_transpose"):  # fmt: skip
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pyro_whvi::{name}", "CPU"), name
    functions = triton_autograd_functions(tb)
    results = {}
    with ops.use_backend("compiled"):
        for op, size, dtype in CASES:
            case = _case_id(op, size, dtype)
            try:
                start = time.perf_counter()
                errors, forward, backward, unchecked = _run_case(
                    op, size, getattr(torch, dtype), functions, tb, launched
                )
                results[case] = {
                    "errors": errors,
                    "unchecked": unchecked,
                    "forward_launched": forward,
                    "grad_launched": backward,
                    "seconds": time.perf_counter() - start,
                }
            except Exception:
                results[case] = {"exception": traceback.format_exc()[-3000:]}
    print(json.dumps(results))


# ---------------------------------------------------------------------------------------------------
# The tests.


@pytest.fixture(scope="module")
def sweep() -> dict:
    pytest.importorskip("triton")
    require_compiled_kernels()
    env = checkout_environment(TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    result = subprocess.run(
        [sys.executable, "-c", "from tests.ops.test_triton_sweep import _sweep_main; _sweep_main()"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_sweep_covers_every_size_op_and_dtype(sweep):
    assert set(sweep) == {_case_id(*case) for case in CASES}
    for dtype in TOLERANCE:
        for size in SIZES:
            ops = {op for op, s, d in CASES if s == size and d == dtype}
            assert {"fwht", "fwht_pm1", "fastfood"} <= ops and any(op.startswith("whvi_matvec") for op in ops)


@pytest.mark.parametrize(("op", "size", "dtype"), CASES, ids=[_case_id(*case) for case in CASES])
def test_triton_matches_the_compiled_kernel(sweep, op, size, dtype):
    result = sweep[_case_id(op, size, dtype)]
    assert "exception" not in result, result.get("exception")
    _, forward_kernels, _, grad_kernels = _paths(op, size, dtype)
    assert result["forward_launched"] == forward_kernels, ("forward path", result["forward_launched"])
    assert result["grad_launched"] == grad_kernels, ("gradient path", result["grad_launched"])
    errors = result["errors"]
    assert errors, "nothing compared"
    failed = {part: error for part, error in errors.items() if not error <= TOLERANCE[dtype]}
    assert not failed, f"{op} D={size} {dtype}: relative error |triton - C++| = {failed} > {TOLERANCE[dtype]}"
