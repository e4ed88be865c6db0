"""The Triton GPU kernels, proved on a machine without a GPU: Triton's interpreter runs the kernel source on
CPU tensors against the reference ops, and ahead-of-time compilation for sm_80 and sm_90 checks that every
kernel fits in registers (``ptxas -v``: no spill)."""

from __future__ import annotations

import pytest
import torch

from .helpers import run_python

pytest.importorskip("triton")

INTERPRETER_CHECKS = r"""
import torch
from pyro_whvi.ops import reference, triton_backend as tb

torch.manual_seed(0)
assert tb.triton_available()
launched = []
launch = tb._launch
tb._launch = lambda name, *args, **kwargs: (launched.append(name), launch(name, *args, **kwargs))
# Tolerances: the kernels compute in float32 (float64 for float64); half types are compared after
# rounding the float64 reference to their own type, so one unit in the last place can differ.
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

def close(actual, expected, dtype, what):
    assert actual.dtype == dtype and actual.shape == expected.shape, (what, actual.dtype, actual.shape)
    error = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    scale = max(1.0, expected.double().abs().max().item()) if expected.numel() else 1.0
    assert error <= TOL[dtype] * scale, (what, error)

for size in (1, 2, 4, 32, 128, 1024, 8192, 32768):
    for dtype in TOL:
        if size == 32768 and dtype != torch.float32:
            continue  # the two-pass path, once: the interpreter is slow
        x = torch.randn(3, size, dtype=torch.float64).to(dtype)
        for normalized in (True, False):
            close(tb.fwht(x, normalized), reference.fwht(x.double(), normalized).to(dtype), dtype, ("fwht", size))
assert "fwht_kernel" in launched

x = torch.randn(32, 5, dtype=torch.float64).mT  # non-contiguous (5, 32)
close(tb.fwht(x), reference.fwht(x), torch.float64, "non-contiguous")
close(tb.fwht(torch.empty(0, 16)), torch.empty(0, 16), torch.float32, "empty")

launched.clear()
for dtype in TOL:
    for shapes in [
        ((6, 1, 64), (3, 64), (3, 64), (3, 64)),        # shared g, stacked blocks (K = 3)
        ((6, 1, 64), (3, 64), (6, 3, 64), (3, 64)),     # one g per example (local reparameterization)
        ((2, 4, 16), (16,), (4, 16), (1, 16)),          # broadcast diagonals
    ]:
        x, s1, g, s2 = (torch.randn(shape, dtype=torch.float64) for shape in shapes)
        expected = reference.whvi_matvec(x, s1, g, s2)
        args = [t.to(dtype) for t in (x, s1, g, s2)]
        close(tb.whvi_matvec(*args), reference.whvi_matvec(*[a.double() for a in args]).to(dtype), dtype, "matvec")
        grad = torch.randn(expected.shape, dtype=torch.float64).to(dtype)
        expected_grads = reference.whvi_matvec_backward(grad.double(), *[a.double() for a in args])
        for got, want in zip(tb.whvi_matvec_backward(grad, *args), expected_grads):
            if dtype in (torch.float16, torch.bfloat16):
                want = want.to(dtype)  # sums over broadcast rows add rounding: compare at the type's precision
                assert (got.double() - want.double()).abs().max() <= 0.05 * max(1.0, want.double().abs().max()), "grad"
            else:
                close(got, want.to(dtype), dtype, ("backward", shapes))
assert {"whvi_matvec_kernel", "whvi_matvec_backward_kernel"} <= set(launched)

# float64 rows longer than the fused backward takes go through the unfused composition.
x, s1, g, s2, grad = (torch.randn(2, 8192, dtype=torch.float64) for _ in range(5))
for got, want in zip(tb.whvi_matvec_backward(grad, x, s1, g, s2), reference.whvi_matvec_backward(grad, x, s1, g, s2)):
    close(got, want, torch.float64, "unfused backward")
print("ok")
"""


def test_kernels_match_the_reference_under_the_interpreter():
    result = run_python(INTERPRETER_CHECKS, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_importing_the_library_does_not_import_triton():
    result = run_python("import sys, pyro_whvi, pyro_whvi.ops; print('triton' in sys.modules)")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("kernel", ["fwht_kernel", "whvi_matvec_kernel", "whvi_matvec_backward_kernel"])
def test_kernels_compile_for_the_gpu_without_spilling(kernel, arch):
    from pyro_whvi.ops import triton_backend

    for size in (2, 128, 8192):
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            fused = triton_backend.kernels().max_fused_size(kernel, dtype == torch.float64)
            usage = triton_backend.resource_usage(kernel, min(size, fused), dtype, arch)
            assert usage["spill_bytes"] == 0, (kernel, size, dtype, arch, usage)
            assert usage["registers"] <= 255
