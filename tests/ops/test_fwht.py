"""fwht against scipy's Hadamard matrix, its algebraic properties, gradients and registration."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from pyro_whvi import ops

ALL_SIZES = [2**k for k in range(15)]  # 1 ... 2^14


def scipy_hadamard_rows(size: int, rows: np.ndarray | None = None) -> torch.Tensor:
    """Rows of scipy's normalized Hadamard matrix (int8 to keep 2^14 x 2^14 at 256 MiB)."""
    matrix = scipy.linalg.hadamard(size, dtype=np.int8)
    if rows is not None:
        matrix = matrix[rows]
    return torch.from_numpy(matrix.astype(np.float64)) / np.sqrt(size)


@pytest.mark.parametrize("size", ALL_SIZES)
def test_matches_scipy_hadamard(backend, size):
    generator = torch.Generator().manual_seed(size)
    x = torch.randn(3, size, generator=generator)
    if size <= 2**12:
        rows = None
        expected = x @ scipy_hadamard_rows(size).T
        actual = ops.fwht(x)
    else:  # compare a random subset of the outputs
        rows = np.random.default_rng(size).choice(size, 64, replace=False)
        expected = x @ scipy_hadamard_rows(size, rows).T
        actual = ops.fwht(x)[:, rows]
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("size", [1, 2, 4, 8, 16, 64, 1024])
def test_unnormalized_is_the_pm1_matrix(backend, size):
    x = torch.randn(4, size)
    expected = x @ torch.from_numpy(scipy.linalg.hadamard(size).astype(np.float64)).T
    torch.testing.assert_close(ops.fwht(x, normalized=False), expected)


@pytest.mark.parametrize("size", [1, 2, 8, 32, 512, 2**15])
def test_involution_and_norm(backend, size):
    x = torch.randn(2, size)
    y = ops.fwht(x)
    torch.testing.assert_close(ops.fwht(y), x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # orthonormal
    torch.testing.assert_close(ops.fwht(ops.fwht(x, normalized=False), normalized=False), size * x)


def test_linearity(backend):
    x, z = torch.randn(2, 5, 64).unbind(0)
    torch.testing.assert_close(ops.fwht(2.5 * x - 3.0 * z), 2.5 * ops.fwht(x) - 3.0 * ops.fwht(z))


@pytest.mark.parametrize("shape", [(16,), (3, 16), (2, 3, 4, 32), (0, 8)])
def test_batch_shapes(backend, shape):
    x = torch.randn(shape)
    y = ops.fwht(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, ops.reference.fwht(x))


def test_non_contiguous_input(backend):
    base = torch.randn(64, 10)
    x = base.T  # (10, 64), non-contiguous
    assert not x.is_contiguous()
    torch.testing.assert_close(ops.fwht(x), ops.reference.fwht(x.contiguous()))
    sliced = torch.randn(4, 128)[:, ::2]
    torch.testing.assert_close(ops.fwht(sliced), ops.reference.fwht(sliced.contiguous()))


def test_float32(backend):
    x = torch.randn(8, 256, dtype=torch.float32)
    expected = ops.reference.fwht(x.double())
    y = ops.fwht(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_use_the_reference(backend, dtype):
    x = torch.randn(4, 64)
    y = ops.fwht(x.to(dtype))
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), ops.fwht(x), rtol=2e-2, atol=2e-2)


def test_output_is_fresh(backend):
    x = torch.randn(3, 8)
    y = ops.fwht(x)
    y.zero_()
    assert x.abs().sum() > 0
    one = torch.randn(3, 1)
    out = ops.fwht(one)
    assert out.data_ptr() != one.data_ptr()


@pytest.mark.parametrize("size", [1, 2, 8, 16, 64])
@pytest.mark.parametrize("normalized", [True, False])
def test_gradcheck(backend, size, normalized):
    x = torch.randn(3, size, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ops.fwht(t, normalized), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ops.fwht(t, normalized), (x,))


def test_backward_is_the_transform(backend):
    x = torch.randn(4, 32, requires_grad=True)
    grad = torch.randn(4, 32)
    ops.fwht(x).backward(grad)
    torch.testing.assert_close(x.grad, ops.reference.fwht(grad))
