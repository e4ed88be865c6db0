"""whvi_matvec against x @ W.T with W = diag(s1) H diag(g) H diag(s2) built densely (WHVI paper §2.2)."""

from __future__ import annotations

import pytest
import torch

from pyro_whvi import ops

from ..helpers import dense_weight


@pytest.mark.parametrize("size", [1, 2, 4, 8, 16, 128, 1024])
def test_shared_g(backend, size):
    x = torch.randn(5, size)
    s1, g, s2 = torch.randn(3, size).unbind(0)
    torch.testing.assert_close(ops.whvi_matvec(x, s1, g, s2), x @ dense_weight(s1, g, s2).T)


@pytest.mark.parametrize("size", [1, 2, 8, 16, 256])
def test_per_example_g(backend, size):
    """Local reparameterization: row i is multiplied by its own W_i."""
    x = torch.randn(2, 3, size)
    s1, s2 = torch.randn(2, size).unbind(0)
    g = torch.randn(2, 3, size)
    expected = torch.einsum("bnij,bnj->bni", dense_weight(s1, g, s2), x)
    torch.testing.assert_close(ops.whvi_matvec(x, s1, g, s2), expected)


def test_stacked_and_broadcast_diagonals(backend):
    """Diagonals whose shape is a suffix of x's (stacked blocks), and g that broadcasts."""
    size, blocks = 16, 3
    x = torch.randn(4, blocks, size)
    s1, s2 = torch.randn(2, blocks, size).unbind(0)
    g = torch.randn(2, 1, blocks, size)  # e.g. 2 posterior samples shared across the batch of 4
    y = ops.whvi_matvec(x, s1, g, s2)
    assert y.shape == (2, 4, blocks, size)
    expected = torch.einsum("sbij,nbj->snbi", dense_weight(s1, g[:, 0], s2), x)
    torch.testing.assert_close(y, expected)
    # x broadcast against a bigger g
    g_full = torch.randn(2, 4, blocks, size)
    expected_full = torch.einsum("snbij,nbj->snbi", dense_weight(s1, g_full, s2), x)
    torch.testing.assert_close(ops.whvi_matvec(x, s1, g_full, s2), expected_full)


def test_non_contiguous_inputs(backend):
    x = torch.randn(32, 6).T
    s1 = torch.randn(32, 2)[:, 0]
    g = torch.randn(32, 6).T
    s2 = torch.randn(64)[::2]
    expected = ops.reference.whvi_matvec(x.contiguous(), s1.contiguous(), g.contiguous(), s2.contiguous())
    torch.testing.assert_close(ops.whvi_matvec(x, s1, g, s2), expected)


def test_float32(backend):
    x = torch.randn(16, 512, dtype=torch.float32)
    s1, g, s2 = torch.randn(3, 512, dtype=torch.float32).unbind(0)
    expected = ops.reference.whvi_matvec(x.double(), s1.double(), g.double(), s2.double())
    torch.testing.assert_close(ops.whvi_matvec(x, s1, g, s2).double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size", [1, 2, 8, 16, 32])
@pytest.mark.parametrize("g_layout", ["shared", "per_example", "stacked"])
def test_gradcheck(backend, size, g_layout):
    x = torch.randn(2, 3, size, requires_grad=True)
    s1 = torch.randn(size, requires_grad=True)
    s2 = torch.randn(size, requires_grad=True)
    g_shape = {"shared": (size,), "per_example": (2, 3, size), "stacked": (3, size)}[g_layout]
    g = torch.randn(g_shape, requires_grad=True)
    assert torch.autograd.gradcheck(ops.whvi_matvec, (x, s1, g, s2))
    assert torch.autograd.gradgradcheck(ops.whvi_matvec, (x, s1, g, s2))


def test_gradients_match_dense(backend):
    size = 64
    x = torch.randn(7, size, requires_grad=True)
    s1, g, s2 = (torch.randn(size, requires_grad=True) for _ in range(3))
    grad = torch.randn(7, size)
    ops.whvi_matvec(x, s1, g, s2).backward(grad)
    fast = [t.grad.clone() for t in (x, s1, g, s2)]
    for t in (x, s1, g, s2):
        t.grad = None
    (x @ dense_weight(s1, g, s2).T).backward(grad)
    for got, want in zip(fast, (x.grad, s1.grad, g.grad, s2.grad)):
        torch.testing.assert_close(got, want)


def test_zero_rows(backend):
    x = torch.randn(0, 8)
    s1, g, s2 = torch.randn(3, 8).unbind(0)
    assert ops.whvi_matvec(x, s1, g, s2).shape == (0, 8)


@pytest.mark.parametrize("g_layout", ["shared", "stacked"])
def test_input_only_gradient_is_the_transposed_product(backend, g_layout):
    # Fixed diagonals (random-feature projections): the backward takes the W^T shortcut.
    size = 32
    x = torch.randn(5, 3, size, requires_grad=True)
    s1, s2 = torch.randn(3, size), torch.randn(size)
    g = torch.randn(size) if g_layout == "shared" else torch.randn(3, size)
    grad = torch.randn(5, 3, size)
    ops.whvi_matvec(x, s1, g, s2).backward(grad)
    weight = dense_weight(torch.ones(size), g, torch.ones(size)) if g_layout == "shared" else None
    if weight is not None:
        expected = ((grad * s1) @ weight) * s2  # x_bar = S2 W_0^T S1 grad, W_0 = H diag(g) H symmetric
        torch.testing.assert_close(x.grad, expected)
    assert torch.autograd.gradcheck(lambda v: ops.whvi_matvec(v, s1, g, s2), x.detach().clone().requires_grad_())
