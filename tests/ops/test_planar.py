"""The fused planar flow against Pyro's ``Planar`` module: values, log-determinants and gradients (float64),
gradcheck and gradgradcheck, either output alone, the softplus branch past its threshold, and bad input."""

from __future__ import annotations

import pytest
import torch
from pyro.distributions.transforms import Planar

from pyro_whvi import ops
from pyro_whvi.ops.planar import reference_planar, reference_planar_backward


def _flow(size: int, scale: float = 1.0) -> Planar:
    flow = Planar(size).double()
    with torch.no_grad():
        for parameter in (flow.u, flow.w, flow.bias):
            parameter.normal_(0.0, scale)
    return flow


def _params(flow: Planar) -> list[torch.Tensor]:
    return [flow.u, flow.w, flow.bias]


@pytest.mark.parametrize("shape", [(1,), (16,), (5, 16), (3, 4, 7), (128, 128)])
def test_matches_pyro_planar(backend, shape):
    """Pyro computes the log-determinant through u_hat's product with psi; the op uses w . u_hat = a exactly, so
    the two agree to rounding (float64 defaults of assert_close: 1e-7 relative)."""
    flow = _flow(shape[-1])
    x = torch.randn(shape, requires_grad=True)
    expected_y = flow(x)
    expected_log_det = flow.log_abs_det_jacobian(x, expected_y)
    y, log_det = ops.planar_flow(x, *_params(flow))
    torch.testing.assert_close(y, expected_y)
    torch.testing.assert_close(log_det, expected_log_det)
    grad_y, grad_log_det = torch.randn(shape), torch.randn(shape[:-1])
    inputs = [x, *_params(flow)]
    got = torch.autograd.grad((y * grad_y).sum() + (log_det * grad_log_det).sum(), inputs)
    want = torch.autograd.grad((expected_y * grad_y).sum() + (expected_log_det * grad_log_det).sum(), inputs)
    for name, g, w in zip(("x", "u", "w", "bias"), got, want):
        torch.testing.assert_close(g, w, msg=name)


@pytest.mark.parametrize("output", ["y", "log_det"])
def test_either_output_alone(backend, output):
    """NF-WHVI's per-example draws use y only; the backward must treat the other gradient as zero."""
    flow = _flow(8)
    x = torch.randn(6, 8, requires_grad=True)
    inputs = [x, *_params(flow)]
    y, log_det = ops.planar_flow(x, *_params(flow))
    expected_y = flow(x)
    got = (y if output == "y" else log_det).sin().sum()
    want = (expected_y if output == "y" else flow.log_abs_det_jacobian(x, expected_y)).sin().sum()
    for g, w in zip(torch.autograd.grad(got, inputs), torch.autograd.grad(want, inputs)):
        torch.testing.assert_close(g, w)


def test_gradcheck_and_gradgradcheck(backend):
    flow = _flow(8)
    inputs = (torch.randn(3, 8, requires_grad=True), *_params(flow))
    assert torch.autograd.gradcheck(ops.planar_flow, inputs)
    assert torch.autograd.gradgradcheck(ops.planar_flow, inputs)


def test_softplus_past_its_threshold(backend):
    """u . w > 20: softplus is the identity there (torch's threshold), and so is its derivative."""
    flow = _flow(4)
    with torch.no_grad():
        flow.w.copy_(torch.tensor([1.0, 2.0, 0.5, 1.0]))
        flow.u.copy_(4 * flow.w)  # u . w = 25
    x = torch.randn(3, 4, requires_grad=True)
    y, log_det = ops.planar_flow(x, *_params(flow))
    expected_y = flow(x)
    torch.testing.assert_close(y, expected_y)
    torch.testing.assert_close(log_det, flow.log_abs_det_jacobian(x, expected_y))
    inputs = [x, *_params(flow)]
    got = torch.autograd.grad((y.sum() + log_det.sum()), inputs)
    want = torch.autograd.grad(expected_y.sum() + flow.log_abs_det_jacobian(x, expected_y).sum(), inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_float32_and_non_contiguous_inputs(backend):
    flow = _flow(16)
    x = torch.randn(16, 10).T  # (10, 16), not contiguous
    y, log_det = ops.planar_flow(x.float(), *(p.detach().float() for p in _params(flow)))
    expected_y, expected_log_det = reference_planar(x.contiguous(), *_params(flow))
    torch.testing.assert_close(y.double(), expected_y.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_det.double(), expected_log_det.detach(), rtol=1e-5, atol=1e-5)


def test_reference_backward_is_the_reference_gradient():
    """The hand-written vector-Jacobian products (the kernel of other devices) against autograd."""
    flow = _flow(12)
    x = torch.randn(2, 5, 12, requires_grad=True)
    inputs = [x, *_params(flow)]
    y, log_det = reference_planar(*inputs)
    grad_y, grad_log_det = torch.randn_like(y), torch.randn_like(log_det)
    want = torch.autograd.grad((y * grad_y).sum() + (log_det * grad_log_det).sum(), inputs, retain_graph=True)
    for g, w in zip(reference_planar_backward(grad_y, grad_log_det, *inputs), want):
        torch.testing.assert_close(g, w)
    only_y = torch.autograd.grad((y * grad_y).sum(), inputs)
    for g, w in zip(reference_planar_backward(grad_y, None, *inputs), only_y):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize(
    ("x_shape", "u_shape", "bias_shape", "match"),
    [((4, 8), (6,), (1,), "u and w"), ((4, 0), (0,), (1,), "D > 0"), ((4, 8), (8,), (2,), "bias one value")],
)
def test_bad_shapes_raise(x_shape, u_shape, bias_shape, match):
    u = torch.randn(u_shape)
    with pytest.raises(ValueError, match=match):
        ops.planar_flow(torch.randn(x_shape), u, torch.randn(u_shape), torch.randn(bias_shape))


def test_mixed_dtypes_raise():
    with pytest.raises(ValueError, match="one dtype and device"):
        ops.planar_flow(torch.randn(3, 4), torch.randn(4).float(), torch.randn(4), torch.randn(1))
