"""The in-place transform ``fwht_(x)`` and ``fwht(x, out=...)`` on every backend: exact against scipy's
Hadamard matrix, aliasing and layouts, autograd as torch's own in-place ops (gradcheck in float64, the
leaf refusal, the version counter), the ``out`` checks, the Triton kernels under the interpreter, and the
library's in-place uses (Fastfood, SORF, the matrix-normal factors) under gradcheck."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_whvi import ops
from pyro_whvi.distributions import WHVINormal
from pyro_whvi.gp import features

from ..helpers import TRITON_LAUNCH_RECORDER, require_compiled_kernels, run_python
from .test_fwht import scipy_hadamard_rows

# The compiled kernel's code paths: scalar rows (< one vector), rows in one L1 chunk, and rows longer
# than an L1 block (float32 above 4096, float64 above 2048: here high passes of radix 2 and 4; 2^15 with
# radix 8 and 16 is checked against the reference below, scipy's 2^15 matrix alone would take 1 GiB).
SIZES = [1, 4, 64, 2048, 4096, 8192]


def _expected(x: torch.Tensor, rows: np.ndarray | None, normalized: bool) -> torch.Tensor:
    size = x.shape[-1]
    matrix = scipy_hadamard_rows(size, rows) * (1.0 if normalized else math.sqrt(size))
    return x.double() @ matrix.T


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("size", SIZES)
def test_inplace_and_out_match_scipy(backend, size, dtype):
    generator = torch.Generator().manual_seed(size)
    x = torch.randn(3, size, generator=generator, dtype=torch.float64).to(dtype)
    rows = None if size <= 1024 else np.random.default_rng(size).choice(size, 32, replace=False)
    pick = slice(None) if rows is None else rows
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    for normalized in (True, False):
        expected = _expected(x, rows, normalized)
        scale = 1.0 if normalized else math.sqrt(size)
        inplace = x.clone()
        assert ops.fwht_(inplace, normalized) is inplace
        out = torch.full_like(x, math.nan)
        assert ops.fwht(x, normalized, out=out) is out
        for result in (inplace, out):
            assert result.dtype == dtype
            torch.testing.assert_close(result[:, pick].double(), expected, rtol=tolerance, atol=tolerance * scale)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_longest_rows_match_the_reference(backend, dtype):
    x = torch.randn(2, 2**15, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = ops.reference.fwht(x)
    inplace = x.to(dtype, copy=True)
    ops.fwht_(inplace)
    out = torch.empty_like(inplace)
    ops.fwht(x.to(dtype), out=out)
    tolerance = 1e-10 if dtype == torch.float64 else 1e-5
    for result in (inplace, out):
        torch.testing.assert_close(result.double(), expected, rtol=tolerance, atol=tolerance)


def test_layouts_and_aliasing(backend):
    torch.manual_seed(0)
    x = torch.randn(5, 64)
    expected = ops.reference.fwht(x)
    aliased = x.clone()
    assert ops.fwht(aliased, out=aliased) is aliased  # out=x is the in-place transform
    torch.testing.assert_close(aliased, expected)
    transposed = x.T.contiguous().T  # non-contiguous x, transformed where it lies
    ops.fwht_(transposed)
    torch.testing.assert_close(transposed, expected)
    out = torch.empty(64, 5).T  # non-contiguous out
    ops.fwht(x.T.contiguous().T, out=out)
    torch.testing.assert_close(out, expected)
    buffer = torch.randn(2, 5, 64)
    ops.fwht(buffer[0], out=buffer[1])  # two disjoint views of one storage
    torch.testing.assert_close(buffer[1], ops.reference.fwht(buffer[0]))
    empty = torch.empty(0, 8)
    assert ops.fwht_(empty) is empty


@pytest.mark.parametrize("normalized", [True, False])
def test_inplace_gradcheck(backend, normalized):
    torch.manual_seed(0)
    x = torch.randn(3, 16, requires_grad=True)

    def transform(t):  # in place on a fresh intermediate, and on a non-contiguous view of one
        y = ops.fwht_(t * 1.5, normalized)
        z = t.mT.contiguous() * 1.0
        ops.fwht_(z.mT[:, :8], normalized)
        return y, z

    assert torch.autograd.gradcheck(transform, (x,))
    assert torch.autograd.gradgradcheck(lambda t: ops.fwht_(t * 1.5, normalized), (x,))


def test_inplace_on_a_leaf_that_requires_grad_raises(backend):
    leaf = torch.randn(2, 8, requires_grad=True)
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match=r"fwht_: a leaf Variable that requires grad .* torch.no_grad"):
        ops.fwht_(leaf)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):  # the operator itself
        torch.ops.pyro_whvi.fwht_(leaf)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        torch.ops.pyro_whvi.fwht_(leaf[:1])
    assert torch.equal(leaf.detach(), before)  # refused before any change
    with torch.no_grad():
        ops.fwht_(leaf)
    torch.testing.assert_close(leaf.detach(), ops.reference.fwht(before))


def test_inplace_bumps_the_version_counter(backend):
    x = torch.randn(2, 8, requires_grad=True)
    y = x * 1.0
    saved_by_square = y * y
    version = y._version
    ops.fwht_(y)
    assert y._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved_by_square.sum().backward()


def test_bad_out_fails_early_naming_out(backend):
    x = torch.randn(4, 16)
    cases = [
        (torch.empty(4, 8), ValueError, r"out has shape \(4, 8\) but x has \(4, 16\)"),
        (torch.empty(4, 16, dtype=torch.float32), TypeError, "out has dtype torch.float32 but x has torch.float64"),
        (torch.empty(4, 16, device="meta"), ValueError, "out is on meta but x is on cpu"),
        (np.empty((4, 16)), TypeError, "out must be a torch.Tensor"),
    ]
    for out, error, message in cases:
        with pytest.raises(error, match=message):
            ops.fwht(x, out=out)
    buffer = torch.randn(5, 16)
    with pytest.raises(ValueError, match="out overlaps part of x's memory"):
        ops.fwht(buffer[:4], out=buffer[1:])
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        ops.fwht(x.requires_grad_(), out=torch.empty(4, 16))
    with pytest.raises(ValueError, match="fwht_: the last dimension of x has size 12"):
        ops.fwht_(torch.randn(2, 12))


def test_the_operators_and_their_fake_kernels():
    for op, key in [("fwht_", "CUDA"), ("fwht.out", "CUDA"), ("fwht_", "Autograd"), ("fwht.out", "Meta")]:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pyro_whvi::{op}", key), (op, key)
    x = torch.empty(3, 8, device="meta")
    torch.ops.pyro_whvi.fwht_(x)
    torch.ops.pyro_whvi.fwht.out(x, out=torch.empty(3, 8, device="meta"))


def test_torch_compile_functionalizes_the_mutating_forms():
    require_compiled_kernels()  # the operators' fake kernels in the graph (the reference is plain PyTorch)

    def step(t):
        y = t * 2.0
        ops.fwht_(y)
        out = torch.empty_like(t)
        ops.fwht(y, False, out=out)
        return out + 1.0

    x = torch.randn(3, 16)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with ops.use_backend("compiled"):
        torch.testing.assert_close(compiled(x), step(x))


def test_python_autograd_kernels_of_the_operators(backend):
    """The autograd kernels that ``torch.ops.pyro_whvi.fwht_`` and ``fwht.out`` use on devices without the C++
    ones (CUDA), called directly on CPU tensors (below them: the compiled or the reference kernel)."""
    from pyro_whvi.ops import _library

    torch.manual_seed(0)
    x = torch.randn(3, 16, requires_grad=True)

    def inplace(t):
        y = t * 1.5
        _library._fwht_inplace_autograd(y, False)
        return y

    assert torch.autograd.gradcheck(inplace, (x,))
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        _library._fwht_inplace_autograd(x)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        _library._fwht_inplace_autograd(x[:1])
    y = x * 1.0
    saved = y * y
    _library._fwht_inplace_autograd(y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        _library._fwht_out_autograd(x, out=torch.empty(3, 16))
    out = torch.empty(3, 16)
    _library._fwht_out_autograd(x.detach(), out=out)
    torch.testing.assert_close(out, ops.reference.fwht(x.detach()))
    assert out._version > 0


TRITON_CHECKS = (
    TRITON_LAUNCH_RECORDER
    + r"""
import scipy.linalg
for size in (1, 2, 64, 1024):
    for dtype in (torch.float64, torch.float32):
        x = torch.randn(3, size, dtype=dtype)
        dense = torch.from_numpy(scipy.linalg.hadamard(size)).double() / size**0.5
        tolerance = 1e-12 if dtype == torch.float64 else 2e-6
        inplace = x.clone()
        tb.fwht_(inplace)
        out = torch.full_like(x, float("nan"))
        tb.fwht_out(x, out=out)
        for result in (inplace, out):
            assert (result.double() - x.double() @ dense.T).abs().max() <= tolerance * max(1.0, size**0.5), size
assert launched.count("fwht_kernel") == 16, launched
launched.clear()
x = torch.randn(8, 4, dtype=torch.float64).mT  # non-contiguous: through a temporary
expected = reference.fwht(x)
tb.fwht_(x)
assert torch.allclose(x, expected)
tb.kernels().MAX_FUSED_SIZE = 64  # rows past the fused size (8192 on a GPU, slow here): the two-pass form
x = torch.randn(2, 128, dtype=torch.float64)
expected = reference.fwht(x, False)
tb.fwht_out(x, False, out=x)
assert torch.allclose(x, expected)
print("ok")
"""
)


@pytest.mark.slow  # a fresh interpreter that imports Triton: about 6 s on two busy cores
def test_triton_inplace_and_out_under_the_interpreter():
    pytest.importorskip("triton")
    result = run_python(TRITON_CHECKS, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


# The library's own buffers transformed in place: Fastfood with a kernel batch and SORF (gp.features),
# and the matrix-normal factors of a WHVI weight.
@pytest.mark.parametrize("projection", ["fastfood", "sorf"])
def test_structured_features_gradcheck(backend, projection):
    generator = torch.Generator().manual_seed(0)
    buffers = features.draw_projection(projection, torch.Size([2]), 4, 12, 8, torch.float64, generator)
    x = torch.randn(2, 3, 4, generator=generator, requires_grad=True)  # 4 d > P: the transforms, not Omega
    projected = features.project(projection, x, buffers, 12)
    omega = features.project(projection, torch.eye(4).expand(2, 4, 4), buffers, 12)
    torch.testing.assert_close(projected, x @ omega)
    assert torch.autograd.gradcheck(lambda t: features.project(projection, t, buffers, 12), (x,))


def test_matrix_normal_factors_gradcheck():
    generator = torch.Generator().manual_seed(0)
    s1, s2, loc = (torch.randn(2, 8, generator=generator, requires_grad=True) for _ in range(3))
    scale = (torch.rand(2, 8, generator=generator) + 0.2).requires_grad_()

    def factors(s1, s2, loc, scale):
        g_dist = torch.distributions.Independent(torch.distributions.Normal(loc, scale), 2)
        return WHVINormal(s1, s2, g_dist, (12, 6)).matrix_normal_factors()

    assert torch.autograd.gradcheck(factors, (s1, s2, loc, scale))
