"""The Triton GPU kernels, proved on a machine without a GPU: Triton's interpreter runs the kernel source on
CPU tensors against the reference ops, and ahead-of-time compilation for sm_80 and sm_90 checks that every
kernel fits in registers (``ptxas -v``: no spill).

The interpreter checks here cover what the size sweep (``tests/ops/test_triton_sweep.py``: float32 and float64,
every power of two up to 2^15, every dispatcher path, against the C++ kernels) does not: the half types,
non-contiguous, empty and broadcast inputs, scipy's Hadamard matrix, and gradcheck in float64."""

from __future__ import annotations

import pytest
import torch

from ..helpers import TRITON_LAUNCH_RECORDER, run_python

pytest.importorskip("triton")

INTERPRETER_CHECKS = (
    TRITON_LAUNCH_RECORDER
    + r"""
# Tolerances: the kernels compute in float32 (float64 for float64); half types are compared after
# rounding the float64 reference to their own type, so one unit in the last place can differ.
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

def close(actual, expected, dtype, what):
    assert actual.dtype == dtype and actual.shape == expected.shape, (what, actual.dtype, actual.shape)
    error = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    scale = max(1.0, expected.double().abs().max().item()) if expected.numel() else 1.0
    assert error <= TOL[dtype] * scale, (what, error)

# float32 and float64 on every power of two up to 2^15, against the C++ kernels: tests/ops/test_triton_sweep.py.
# Here the half types, which it does not cover, on each size class of the fused transform.
for size in (1, 2, 4, 32, 128, 1024, 8192):
    for dtype in (torch.float16, torch.bfloat16):
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

# The structured ops: Fastfood and its adjoint (one permutation gather each), the WHVI design and its backward.
launched.clear()
for dtype in (torch.float32, torch.float64):
    size, blocks = 64, 3
    signs = (torch.randint(0, 2, (blocks, size)) * 2 - 1).to(dtype)
    permutation = torch.argsort(torch.rand(blocks, size), dim=-1)
    gaussian, scale = torch.randn(2, blocks, size, dtype=dtype).unbind(0)
    x = torch.randn(2, 5, size, dtype=dtype)
    close(tb.fastfood(x, signs, permutation, gaussian, scale),
          reference.fastfood(x, signs, permutation, gaussian, scale), dtype, "fastfood")  # fmt: skip
    grad = torch.randn(2, 5, blocks, size, dtype=dtype)
    expected = reference.fastfood_transpose(grad, signs, permutation, gaussian, scale)
    close(tb.fastfood_transpose(grad, signs, permutation, gaussian, scale), expected, dtype, "fastfood_transpose")
    for size in (2, 16, 64, 128):  # 128: the tile is read in chunks of rows
        matrices = torch.randn(3, 4, size, size, dtype=dtype)
        s1, s2 = torch.randn(2, size, dtype=dtype).unbind(0)
        close(tb.whvi_design(matrices, s1, s2), reference.whvi_design(matrices, s1, s2), dtype, ("design", size))
        grad = torch.randn(3, 4, size, dtype=dtype)
        for got, want in zip(tb.whvi_design_backward(grad, matrices, s1, s2),
                             reference.whvi_design_backward(grad, matrices, s1, s2)):  # fmt: skip
            close(got, want, dtype, ("design backward", size))
    features, s1, s2 = torch.randn(6, 40, dtype=dtype), torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    grad = torch.randn(6, 8, dtype=dtype)
    for got, want in zip(tb.whvi_fourier_design_backward(grad, features, s1, s2),
                         reference.whvi_fourier_design_backward(grad, features, s1, s2)):  # fmt: skip
        close(got, want, dtype, "fourier design backward")
assert set(launched) == {"fastfood_kernel", "fastfood_transpose_kernel"}, launched

# Against scipy's Hadamard matrix and the C++ CPU kernels on the same inputs.
import scipy.linalg
from pyro_whvi import ops

for size in (2, 64, 1024):
    x = torch.randn(4, size, dtype=torch.float64)
    dense = torch.from_numpy(scipy.linalg.hadamard(size)).double() / size**0.5
    close(tb.fwht(x), x @ dense.T, torch.float64, ("scipy", size))
if ops.compiled_available():
    with ops.use_backend("compiled"):
        for dtype in (torch.float32, torch.float64):
            x, s1, g, s2 = (torch.randn(shape, dtype=dtype) for shape in ((5, 1, 256), (2, 256), (5, 2, 256), (2, 256)))
            close(tb.fwht(x), ops.fwht(x), dtype, "compiled fwht")
            close(tb.whvi_matvec(x, s1, g, s2), ops.whvi_matvec(x, s1, g, s2), dtype, "compiled matvec")

# gradcheck in float64 through the kernels' forward and backward (the formulas the CUDA dispatch uses).
from tests.helpers import triton_autograd_functions

_, Matvec, _, Fastfood = triton_autograd_functions(tb)
shapes = ((2, 1, 8), (2, 8), (2, 2, 8), (2, 8))  # 80 inputs: each a forward pair in the interpreter
inputs = [torch.randn(shape, dtype=torch.float64, requires_grad=True) for shape in shapes]
assert torch.autograd.gradcheck(Matvec.apply, inputs)
tables = ((torch.randint(0, 2, (2, 16)) * 2 - 1).double(), torch.argsort(torch.rand(2, 16), -1),
          torch.randn(2, 16, dtype=torch.float64), torch.randn(2, 16, dtype=torch.float64))  # fmt: skip
assert torch.autograd.gradcheck(Fastfood.apply, (torch.randn(3, 16, dtype=torch.float64, requires_grad=True), *tables))
print("ok")
"""
)


@pytest.mark.slow
def test_kernels_match_the_reference_under_the_interpreter():
    result = run_python(INTERPRETER_CHECKS, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_importing_the_library_does_not_import_triton():
    result = run_python("import sys, pyro_whvi, pyro_whvi.ops; print('triton' in sys.modules)")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"


@pytest.mark.slow
@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("kernel", ["fwht", "whvi_matvec", "whvi_matvec_backward", "fastfood", "fastfood_transpose"])
def test_kernels_compile_for_the_gpu_without_spilling(kernel, arch):
    from pyro_whvi.ops import triton_backend, triton_resources

    kernel = f"{kernel}_kernel"
    module = triton_backend.kernels()
    for size in (2, 128, 1024, 2048, 8192):  # Fastfood: register gather up to 1024, the scratch slot above
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            fused = module.max_fused_size(kernel, dtype == torch.float64)
            usage = triton_resources.resource_usage(kernel, min(size, fused), dtype, arch)
            assert usage["spill_bytes"] == 0, (kernel, size, dtype, arch, usage)
            assert usage["registers"] <= 255


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("kernel", ["whvi_design_kernel", "whvi_design_backward_kernel"])
def test_design_kernels_compile_for_the_gpu_without_spilling(kernel, arch):
    from pyro_whvi.ops import triton_backend, triton_resources

    module = triton_backend.kernels()
    for size in (2, 16, 64, 128, 256, 1024, 8192):  # one tile up to 64 (32 in float64), chunks of rows above
        for dtype in (torch.float32, torch.float64):
            size = min(size, module.max_fused_size(kernel, dtype == torch.float64))
            usage = triton_resources.resource_usage(kernel, size, dtype, arch)
            assert usage["spill_bytes"] == 0, (kernel, size, dtype, arch, usage)


def test_every_operator_has_a_cuda_kernel():
    for op in ("fwht", "whvi_matvec", "whvi_matvec_backward", "whvi_design", "whvi_design_backward",
               "whvi_fourier_design_backward", "fastfood", "fastfood_transpose"):  # fmt: skip
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pyro_whvi::{op}", "CUDA"), op
