"""whvi_design and fastfood against dense products built from scipy's Hadamard matrix, their
adjoints, gradients (first and second order) and input checks, on every backend."""

from __future__ import annotations

import pytest
import torch

from pyro_whvi import ops

from ..helpers import dense_weight, scipy_hadamard

SIZES = [1, 2, 4, 8, 16, 64]


def design_inputs(size: int, batch=(3, 2), dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, size, size, generator=generator, dtype=dtype)
    s1, s2 = torch.randn(2, size, generator=generator, dtype=dtype).unbind(0)
    return x, s1, s2


@pytest.mark.parametrize("size", SIZES)
def test_design_is_the_diagonal_of_the_dense_sandwich(backend, size):
    x, s1, s2 = design_inputs(size)
    hadamard = scipy_hadamard(size)
    expected = torch.diagonal(hadamard @ torch.diag(s1) @ x @ torch.diag(s2) @ hadamard, dim1=-2, dim2=-1)
    torch.testing.assert_close(ops.whvi_design(x, s1, s2), expected)


@pytest.mark.parametrize("size", [4, 32])
def test_design_is_the_adjoint_of_the_whvi_map(backend, size):
    """<X, S1 H diag(g) H S2>_F = whvi_design(X) . g: the design row of a WHVI-matrix weight."""
    x, s1, s2 = design_inputs(size, batch=(5,))
    g = torch.randn(size)
    inner = (x * dense_weight(s1, g, s2)).sum((-2, -1))
    torch.testing.assert_close(ops.whvi_design(x, s1, s2) @ g, inner)


def test_design_float32_and_non_contiguous(backend):
    x, s1, s2 = design_inputs(128, batch=(6,), dtype=torch.float32)
    expected = ops.reference.whvi_design(x.double(), s1.double(), s2.double())
    torch.testing.assert_close(ops.whvi_design(x, s1, s2).double(), expected, rtol=1e-4, atol=1e-4)
    transposed = x.mT  # non-contiguous
    expected = ops.reference.whvi_design(transposed.contiguous().double(), s1.double(), s2.double())
    torch.testing.assert_close(ops.whvi_design(transposed, s1, s2).double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size", [1, 2, 8, 16])
def test_design_gradcheck(backend, size):
    x, s1, s2 = (t.requires_grad_() for t in design_inputs(size, batch=(3,)))
    assert torch.autograd.gradcheck(ops.whvi_design, (x, s1, s2))
    assert torch.autograd.gradgradcheck(ops.whvi_design, (x, s1, s2))


def test_design_backward_matches_reference_for_large_batches(backend):
    """Many matrices: the compiled kernel splits them over threads and reduces s1/s2 gradients."""
    x, s1, s2 = (t.requires_grad_() for t in design_inputs(32, batch=(257,), seed=1))
    grad = torch.randn(257, 32)
    actual = torch.autograd.grad(ops.whvi_design(x, s1, s2), (x, s1, s2), grad)
    expected = torch.autograd.grad(ops.reference.whvi_design(x, s1, s2), (x, s1, s2), grad)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


def fastfood_inputs(size: int, blocks: int = 3, repeats: bool = False, seed=0):
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (blocks, size), generator=generator).double() * 2 - 1
    gaussian, scale = torch.randn(2, blocks, size, generator=generator).unbind(0)
    if repeats:  # any index, not only permutations: the transpose must scatter-add
        permutation = torch.randint(0, size, (blocks, size), generator=generator)
    else:
        permutation = torch.argsort(torch.rand(blocks, size, generator=generator), dim=-1)
    return signs, permutation, gaussian, scale


def dense_fastfood(signs, permutation, gaussian, scale) -> torch.Tensor:
    """(B, P, P) matrices diag(scale) H diag(gaussian) Pi H diag(signs), Pi[i, perm[i]] = 1."""
    size = signs.shape[-1]
    hadamard = scipy_hadamard(size)
    selection = torch.nn.functional.one_hot(permutation, size).double()
    return scale[..., None] * hadamard @ (gaussian[..., None] * selection) @ hadamard * signs[..., None, :]


@pytest.mark.parametrize("size", [*SIZES, 256])
@pytest.mark.parametrize("repeats", [False, True])
def test_fastfood_matches_dense_blocks(backend, size, repeats):
    buffers = fastfood_inputs(size, repeats=repeats)
    x = torch.randn(4, 2, size)
    expected = torch.einsum("bij,...j->...bi", dense_fastfood(*buffers), x)
    torch.testing.assert_close(ops.fastfood(x, *buffers), expected)


@pytest.mark.parametrize("repeats", [False, True])
def test_fastfood_transpose_is_the_adjoint(backend, repeats):
    buffers = fastfood_inputs(16, repeats=repeats)
    x, y = torch.randn(5, 16), torch.randn(5, 3, 16)
    forward = torch.ops.pyro_whvi.fastfood(x, *buffers)
    transposed = torch.ops.pyro_whvi.fastfood_transpose(y, *buffers)
    torch.testing.assert_close((forward * y).sum(), (x * transposed).sum())


@pytest.mark.parametrize("size", [1, 4, 16])
def test_fastfood_gradcheck(backend, size):
    buffers = fastfood_inputs(size, repeats=True)
    x = torch.randn(3, size, requires_grad=True)

    def apply(x):
        return ops.fastfood(x, *buffers)

    assert torch.autograd.gradcheck(apply, (x,))
    assert torch.autograd.gradgradcheck(apply, (x,))


def test_fastfood_float32(backend):
    signs, permutation, gaussian, scale = fastfood_inputs(512, blocks=4)
    x = torch.randn(7, 512)
    expected = ops.reference.fastfood(x, signs, permutation, gaussian, scale)
    actual = ops.fastfood(x.float(), signs.float(), permutation, gaussian.float(), scale.float())
    torch.testing.assert_close(actual.double(), expected, rtol=1e-4, atol=1e-4)


def test_bad_inputs_name_the_argument():
    x, s1, s2 = design_inputs(8)
    with pytest.raises(ValueError, match="square matrices"):
        ops.whvi_design(x[..., :4], s1, s2)
    with pytest.raises(ValueError, match="power of two"):
        ops.whvi_design(torch.randn(2, 6, 6), torch.randn(6), torch.randn(6))
    with pytest.raises(ValueError, match="s2 must have shape"):
        ops.whvi_design(x, s1, s2[:4])
    with pytest.raises(ValueError, match=r"s1 is torch\.float32"):
        ops.whvi_design(x, s1.float(), s2)
    signs, permutation, gaussian, scale = fastfood_inputs(8)
    with pytest.raises(ValueError, match=r"signs must be \(B, 16\)"):
        ops.fastfood(torch.randn(2, 16), signs, permutation, gaussian, scale)
    with pytest.raises(ValueError, match="entries must lie in"):
        ops.fastfood(torch.randn(2, 8), signs, permutation + 1, gaussian, scale)
    with pytest.raises(ValueError, match="permutation must be an int64"):
        ops.fastfood(torch.randn(2, 8), signs, permutation.int(), gaussian, scale)
    with pytest.raises(ValueError, match="gaussian is a fixed random tensor"):
        ops.fastfood(torch.randn(2, 8), signs, permutation, gaussian.requires_grad_(), scale)
