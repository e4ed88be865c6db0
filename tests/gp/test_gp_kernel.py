"""RandomFeatureKernel: GPyTorch's kernel conformance suite for every projection, convergence to the
exact RBF kernel, and the distribution of the structured frequencies."""

from __future__ import annotations

import math
import pickle
import unittest

import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase
from scipy import stats
from torch import Tensor

from pyro_whvi.gp import RandomFeatureKernel
from pyro_whvi.gp.kernel import rbf_kernel_matrix

PROJECTIONS = ("dense", "fastfood", "sorf")


class _Conformance(BaseKernelTestCase):
    """GPyTorch's own kernel test base. The seed makes every kernel a test creates share its random
    projection, so the active-dims tests compare like with like."""

    projection = "dense"
    seed = 0

    def create_kernel_no_ard(self, **kwargs):
        return RandomFeatureKernel(num_samples=5, projection=self.projection, seed=1, **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return RandomFeatureKernel(
            num_samples=7, projection=self.projection, num_dims=num_dims, ard_num_dims=num_dims, seed=1, **kwargs
        )


class TestDenseConformance(_Conformance, unittest.TestCase):
    projection = "dense"


class TestFastfoodConformance(_Conformance, unittest.TestCase):
    projection = "fastfood"


class TestSORFConformance(_Conformance, unittest.TestCase):
    projection = "sorf"


def _relative_error(projection: str, num_samples: int, seed: int, x: Tensor) -> float:
    kernel = RandomFeatureKernel(num_samples, projection, ard_num_dims=x.shape[-1], seed=seed)
    kernel.lengthscale = torch.linspace(0.4, 1.5, x.shape[-1])
    kernel.outputscale = 1.7
    exact = rbf_kernel_matrix(x, x, kernel.lengthscale.detach(), 1.7)
    approx = kernel(x).to_dense().detach()
    return ((approx - exact).norm() / exact.norm()).item()


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_features_converge_to_the_rbf_kernel_like_one_over_sqrt_m(projection):
    # Monte-Carlo error of a kernel estimate with m frequencies has standard deviation ~ 1/sqrt(m):
    # 16 times more frequencies should shrink the mean error (8 seeds) about 4 times. The band [2.5, 6.5]
    # leaves room for the seed-to-seed spread (about 15% with 8 seeds) and the mild orthogonality gain of SORF.
    x = torch.rand(30, 6, generator=torch.Generator().manual_seed(0))
    errors = [sum(_relative_error(projection, m, seed, x) for seed in range(8)) / 8 for m in (128, 2048)]
    assert 2.5 < errors[0] / errors[1] < 6.5, errors
    assert errors[1] < 0.05


def test_outputscale_and_diagonal_are_exact():
    kernel = RandomFeatureKernel(16, "sorf", num_dims=3, seed=0)
    kernel.outputscale = 2.5
    x = torch.randn(7, 3)
    assert torch.allclose(kernel(x, diag=True), torch.full((7,), 2.5))
    assert torch.allclose(kernel(x).to_dense().diagonal(), torch.full((7,), 2.5))


@pytest.mark.parametrize("projection", ("fastfood", "sorf"))
def test_structured_frequencies_have_the_gaussian_marginal(projection):
    # 2048 frequencies in d = 4: the entries of Omega * lengthscale should be N(0, 1). Fastfood's rows have
    # exactly chi_P norms; SORF's are orthogonal with fixed norm, so its entries are only asymptotically normal.
    # A KS statistic below 0.0215 on 8192 entries is about the 0.1% level for an exact N(0, 1) sample
    # (sqrt(-log(0.0005)/2 / 8192) = 0.0215).
    kernel = RandomFeatureKernel(2048, projection, num_dims=4, ard_num_dims=4, seed=3)
    kernel.lengthscale = torch.tensor([0.5, 1.0, 2.0, 4.0])
    omega = (kernel.frequencies() * kernel.lengthscale.detach().mT).detach()  # (d, m), unit lengthscale
    assert omega.shape == (4, 2048)
    entries = omega.flatten().numpy()
    assert stats.kstest(entries, "norm").statistic < 0.0215
    # Second moments: E[omega omega^T] = I (the m frequencies are the rows of Omega).
    second_moment = omega @ omega.T / omega.shape[1]
    assert torch.allclose(second_moment, torch.eye(4), atol=4 * math.sqrt(2 / 2048))


def test_dense_frequencies_are_the_buffer_over_the_lengthscale():
    kernel = RandomFeatureKernel(9, "dense", num_dims=2, ard_num_dims=2, seed=0)
    kernel.lengthscale = torch.tensor([0.5, 2.0])
    expected = kernel.randn_weights / kernel.lengthscale.detach().mT
    assert torch.allclose(kernel.frequencies().detach(), expected)


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_state_dict_round_trip_into_a_lazy_kernel(projection):
    kernel = RandomFeatureKernel(40, projection, ard_num_dims=3)
    x = torch.randn(5, 3)
    before = kernel(x).to_dense()
    fresh = RandomFeatureKernel(40, projection, ard_num_dims=3)
    fresh.load_state_dict(kernel.state_dict())
    assert fresh.num_dims == 3
    assert torch.allclose(fresh(x).to_dense(), before)
    assert torch.allclose(pickle.loads(pickle.dumps(kernel))(x).to_dense(), before)


def test_features_are_differentiable_in_the_hyperparameters():
    kernel = RandomFeatureKernel(8, "fastfood", num_dims=2, ard_num_dims=2, seed=0)
    kernel.featurize(torch.randn(4, 2)).pow(2).sum().backward()
    assert kernel.raw_outputscale.grad.abs().sum() > 0
    kernel.zero_grad()
    kernel.featurize(torch.randn(4, 2))[:, :8].sum().backward()
    assert kernel.raw_lengthscale.grad.abs().sum() > 0


def test_bad_arguments_get_specific_errors():
    with pytest.raises(ValueError, match="num_samples"):
        RandomFeatureKernel(0)
    with pytest.raises(ValueError, match="projection"):
        RandomFeatureKernel(8, "circulant")
    with pytest.raises(ValueError, match="block_size"):
        RandomFeatureKernel(8, "sorf", block_size=12)
    with pytest.raises(ValueError, match="smaller than the input dimension"):
        RandomFeatureKernel(8, "sorf", num_dims=5, block_size=4)
    with pytest.raises(ValueError, match="ard_num_dims"):
        RandomFeatureKernel(8, num_dims=3, ard_num_dims=2)
    kernel = RandomFeatureKernel(8, num_dims=3)
    with pytest.raises(ValueError, match="drawn for 3"):
        kernel(torch.randn(4, 2)).to_dense()


def _dense_block_matrices(projection: str, buffers: dict[str, Tensor]) -> Tensor:
    """Omega's blocks ``(*b, B, P, P)`` built from scipy's Hadamard matrix and the buffers, entry by entry."""
    from ..helpers import scipy_hadamard

    if projection == "sorf":
        signs = buffers["sorf_signs"]  # (*b, B, 3, P)
        h = scipy_hadamard(signs.shape[-1])
        d1, d2, d3 = (torch.diag_embed(signs[..., i, :]) for i in range(3))
        return math.sqrt(signs.shape[-1]) * h @ d1 @ h @ d2 @ h @ d3
    signs, gaussian, scale = (buffers[f"fastfood_{n}"] for n in ("signs", "gaussian", "scale"))
    h = scipy_hadamard(signs.shape[-1])
    permutation = torch.nn.functional.one_hot(buffers["fastfood_permutation"], signs.shape[-1]).to(h)
    return torch.diag_embed(scale) @ h @ torch.diag_embed(gaussian) @ permutation @ h @ torch.diag_embed(signs)


@pytest.mark.parametrize("projection", ("fastfood", "sorf"))
@pytest.mark.parametrize("num_dims", (3, 9, 16))  # P = 16: d <= P / 4 forms Omega, above the transforms
@pytest.mark.parametrize("batch_shape", (torch.Size([]), torch.Size([2])))
def test_structured_projection_equals_the_dense_block_product(projection, num_dims, batch_shape):
    from pyro_whvi.gp.features import draw_projection, project

    buffers = draw_projection(projection, batch_shape, num_dims, 40, 16, torch.float64)  # 3 blocks, m not a multiple
    x = torch.randn(*batch_shape, 5, num_dims)
    blocks = _dense_block_matrices(projection, buffers)  # (*b, B, P, P)
    padded = torch.nn.functional.pad(x, (0, 16 - num_dims))
    expected = torch.einsum("...bpq,...nq->...nbp", blocks, padded).flatten(-2)[..., :40]
    assert torch.allclose(project(projection, x, buffers, 40), expected, atol=1e-12)
    assert torch.autograd.gradcheck(lambda v: project(projection, v, buffers, 40), x.clone().requires_grad_())
    if projection == "sorf":  # orthogonal blocks: exactly P * I
        assert torch.allclose(blocks @ blocks.mT, 16 * torch.eye(16).expand_as(blocks), atol=1e-10)


def test_active_dims_are_applied_by_the_feature_map():
    kernel = RandomFeatureKernel(16, "sorf", active_dims=[0, 2], seed=0)
    x = torch.randn(5, 3)
    features = kernel.feature_map(x)
    assert torch.equal(features, kernel.featurize(x[:, [0, 2]]))
    assert torch.allclose(features @ features.T, kernel(x).to_dense())


def test_a_projection_drawn_under_inference_mode_can_be_trained_through():
    kernel = RandomFeatureKernel(8, "sorf", seed=0)
    with torch.inference_mode():
        kernel(torch.randn(3, 2)).to_dense()
    kernel.featurize(torch.randn(3, 2)).sum().backward()
    assert kernel.raw_lengthscale.grad is not None


def test_a_float32_state_dict_loads_into_a_float64_lazy_kernel():
    source = RandomFeatureKernel(8, "fastfood", num_dims=2).float()
    target = RandomFeatureKernel(8, "fastfood").double()
    target.load_state_dict(source.state_dict())
    assert target.fastfood_gaussian.dtype == torch.float64 and target.fastfood_permutation.dtype == torch.int64
    assert torch.allclose(target(torch.randn(4, 2)).to_dense().diagonal(), torch.ones(4))


def test_fourier_features_match_the_composition_and_pass_gradcheck():
    from pyro_whvi.gp.features import fourier_features

    angles = torch.randn(2, 5, 7, requires_grad=True)
    scale = torch.rand(2, 1, 1).add(0.5).requires_grad_()
    expected = torch.cat([angles.cos(), angles.sin()], -1) * scale
    assert torch.allclose(fourier_features(angles, scale), expected)
    assert torch.autograd.gradcheck(fourier_features, (angles, scale))
    unbatched = torch.randn(5, 7, requires_grad=True)  # broadcast against a batched scale
    assert torch.autograd.gradcheck(fourier_features, (unbatched, scale))
    with torch.no_grad():
        assert torch.allclose(fourier_features(angles, scale), expected)
