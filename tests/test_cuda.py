"""The ops on CUDA tensors agree with the CPU (skipped without a GPU; see conftest)."""

from __future__ import annotations

import pytest
import torch

from pyro_whvi import ops

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("size", [1, 2, 32, 1024, 2**15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fwht_cuda_matches_cpu(size, dtype):
    x = torch.randn(64, size, dtype=dtype)
    expected = ops.fwht(x)
    actual = ops.fwht(x.cuda()).cpu()
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("per_example", [False, True])
def test_whvi_matvec_cuda_matches_cpu(per_example):
    x = torch.randn(16, 256)
    s1, s2 = torch.randn(2, 256).unbind(0)
    g = torch.randn(16, 256) if per_example else torch.randn(256)
    expected = ops.whvi_matvec(x, s1, g, s2)
    actual = ops.whvi_matvec(*(t.cuda() for t in (x, s1, g, s2))).cpu()
    torch.testing.assert_close(actual, expected)


def test_gradcheck_cuda():
    x = torch.randn(3, 16, device="cuda", requires_grad=True)
    s1, g, s2 = (torch.randn(16, device="cuda", requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(ops.whvi_matvec, (x, s1, g, s2))
    assert torch.autograd.gradcheck(ops.fwht, (x,))


def test_structured_ops_cuda_match_cpu():
    x, s1, s2 = torch.randn(4, 32, 32), torch.randn(32), torch.randn(32)
    expected = ops.whvi_design(x, s1, s2)
    torch.testing.assert_close(ops.whvi_design(x.cuda(), s1.cuda(), s2.cuda()).cpu(), expected)
    signs = torch.randint(0, 2, (3, 64)).double() * 2 - 1
    permutation = torch.argsort(torch.rand(3, 64), dim=-1)
    gaussian, scale = torch.randn(2, 3, 64).unbind(0)
    inputs = torch.randn(5, 64)
    expected = ops.fastfood(inputs, signs, permutation, gaussian, scale)
    actual = ops.fastfood(*(t.cuda() for t in (inputs, signs, permutation, gaussian, scale))).cpu()
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_on_the_triton_kernels_match_float64(dtype):
    from pyro_whvi.ops import triton_backend

    assert triton_backend.triton_available(), "CUDA tensors need Triton for the GPU kernels"
    x, s1, g, s2 = (torch.randn(shape, dtype=torch.float64) for shape in ((8, 1, 512), (2, 512), (8, 2, 512), (2, 512)))
    expected = ops.whvi_matvec(x, s1, g, s2)
    actual = ops.whvi_matvec(*(t.to("cuda", dtype) for t in (x, s1, g, s2))).double().cpu()
    tolerance = 1e-2 if dtype == torch.float16 else 5e-2  # rounding of the inputs and the output
    torch.testing.assert_close(actual, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


def test_compiled_whvi_layers_on_cuda_match_eager():
    from torch import nn

    from pyro_whvi.nn import bayesian_, kl_divergence

    network = bayesian_(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)), preset="paper").cuda()
    x = torch.randn(32, 16, device="cuda")

    def loss_fn(x):
        return network(x).square().sum() + kl_divergence(network)

    compiled = torch.compile(loss_fn, fullgraph=True, options={"fallback_random": True})
    torch.manual_seed(0)
    eager = loss_fn(x)
    torch.manual_seed(0)
    torch.testing.assert_close(compiled(x), eager)
    compiled(x).backward()
    assert all(p.grad is not None and p.grad.is_cuda for p in network.parameters())
