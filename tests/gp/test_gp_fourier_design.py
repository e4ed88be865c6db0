"""whvi_fourier_design (WHVI's design on random Fourier features with a fused backward) against the
two-step composition fourier_features -> whvi_design, values and gradients, on every backend."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyro_whvi import ops
from pyro_whvi.gp.features import fourier_features
from pyro_whvi.gp.fourier_design import whvi_fourier_design


def composite(angles, scale, s1, s2):
    size = s1.shape[-1]
    features = fourier_features(angles, scale)
    features = F.pad(features, (0, size * size - features.shape[-1]))
    return ops.whvi_design(features.unflatten(-1, (size, size)), s1, s2)


def inputs(size, half, batch=(2, 5), scale_shape=(1, 1), seed=0):
    generator = torch.Generator().manual_seed(seed)
    angles = torch.randn(*batch, half, generator=generator)
    scale = 0.5 + torch.rand(scale_shape, generator=generator)
    s1, s2 = torch.randn(2, size, generator=generator).unbind(0)
    return [t.requires_grad_() for t in (angles, scale, s1, s2)]


@pytest.mark.parametrize(("size", "half"), [(2, 2), (4, 8), (8, 16), (8, 13), (16, 100)])
def test_values_and_gradients_match_the_composition(backend, size, half):
    """Square (2m = D^2) and padded (2m < D^2) layouts, vector and scalar code paths."""
    args = inputs(size, half)
    grad = torch.randn(2, 5, size)
    fused = whvi_fourier_design(*args)
    expected = composite(*args)
    torch.testing.assert_close(fused, expected)
    for a, e in zip(torch.autograd.grad(fused, args, grad), torch.autograd.grad(expected, args, grad)):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("scale_shape", [(), (1, 1), (5, 1)])
def test_gradcheck(backend, scale_shape):
    args = inputs(4, 6, batch=(5,), scale_shape=scale_shape)
    assert torch.autograd.gradcheck(whvi_fourier_design, args)
    assert torch.autograd.gradgradcheck(whvi_fourier_design, args)


def test_float32_many_rows(backend):
    """Rows split over threads; the s1/s2 gradients are reduced across them."""
    args = [t.detach().float().requires_grad_() for t in inputs(32, 512, batch=(300,), seed=3)]
    reference_args = [t.detach().double().requires_grad_() for t in args]
    grad = torch.randn(300, 32)
    fused = torch.autograd.grad(whvi_fourier_design(*args), args, grad.float())
    expected = torch.autograd.grad(composite(*reference_args), reference_args, grad)
    for a, e in zip(fused, expected):
        torch.testing.assert_close(a.double(), e, rtol=1e-3, atol=1e-3)


def test_rejects_features_that_do_not_fit():
    angles, scale, s1, s2 = inputs(4, 9)
    with pytest.raises(ValueError, match="18 features do not fit a 4 x 4"):
        whvi_fourier_design(angles, scale, s1, s2)
    with pytest.raises(ValueError, match="constant along the features"):
        whvi_fourier_design(angles[..., :8], torch.ones(8), s1, s2)
