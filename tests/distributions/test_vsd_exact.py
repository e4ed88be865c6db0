"""VSD against exact answers: Householder orthogonality, the noise's moments and density, the KL terms
of eq. (6), (12), (15) against dense Gaussian KLs and Monte Carlo, T = 0 as Gaussian dropout, and the
per-example forward passes' output moments."""

from __future__ import annotations

import math

import pyro.distributions as dist
import pytest
import torch
from torch.distributions import MultivariateNormal, Normal, kl_divergence

from pyro_whvi.distributions import StructuredDropoutNoise, householder_product
from pyro_whvi.distributions.empirical_bayes import vsd_hierarchical_kl, vsd_kl
from pyro_whvi.distributions.householder import householder_variance
from pyro_whvi.infer import VSDWeight


def _noise(size=6, reflections=2, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    alpha = (torch.rand(size, generator=generator, dtype=dtype) + 0.2).to(dtype)
    vectors = torch.randn(reflections, size, generator=generator, dtype=dtype)
    return StructuredDropoutNoise(alpha, vectors)


@pytest.mark.parametrize("reflections", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_householder_product_is_orthogonal_and_matches_dense_reflections(reflections, dtype):
    vectors = torch.randn(reflections, 9, dtype=dtype)
    orthogonal = householder_product(vectors)
    eye = torch.eye(9, dtype=dtype)
    tolerance = 50 * torch.finfo(dtype).eps
    assert torch.allclose(orthogonal @ orthogonal.mT, eye, atol=tolerance)
    expected = eye.clone()
    for v in vectors:  # U = H_T ... H_1: H_1 applied first
        expected = (eye - 2 * torch.outer(v, v) / v.dot(v)) @ expected
    assert torch.allclose(orthogonal, expected, atol=tolerance)


@pytest.mark.parametrize("reflections", [0, 1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compact_wy_variance_matches_the_dense_householder_product(reflections, dtype):
    vectors, alpha = torch.randn(reflections, 37, dtype=dtype), torch.rand(37, dtype=dtype) + 0.1
    dense = householder_product(vectors).square() @ alpha
    assert torch.allclose(householder_variance(alpha, vectors), dense, atol=20 * torch.finfo(dtype).eps)
    # Differentiable, as the KL needs: gradcheck in float64.
    if dtype == torch.float64:
        inputs = (alpha[:6].clone().requires_grad_(), vectors[:, :6].clone().requires_grad_())
        assert torch.autograd.gradcheck(householder_variance, inputs)


@pytest.mark.parametrize("reflections", [0, 1, 3])
def test_noise_mean_and_covariance_match_within_monte_carlo_error(reflections):
    noise = _noise(reflections=reflections)
    num = 200_000
    draws = noise.rsample((num,))
    covariance = noise.covariance_matrix
    # Standard errors: mean sqrt(S_ii / n); covariance sqrt((S_ii S_jj + S_ij^2) / n). Allow 5 sigma.
    mean_se = (covariance.diagonal() / num).sqrt()
    assert ((draws.mean(0) - 1).abs() < 5 * mean_se).all()
    var = covariance.diagonal()
    cov_se = ((torch.outer(var, var) + covariance.square()) / num).sqrt()
    assert ((torch.cov(draws.T) - covariance).abs() < 5 * cov_se).all()
    if reflections == 0:
        assert torch.allclose(covariance, torch.diag(noise.alpha))
    assert torch.allclose(noise.variance, covariance.diagonal())


def test_noise_log_prob_is_the_exact_gaussian_density():
    noise = _noise(reflections=3)
    exact = MultivariateNormal(torch.ones(6, dtype=torch.float64), noise.covariance_matrix)
    values = noise.sample((10,))
    assert torch.allclose(noise.log_prob(values), exact.log_prob(values), atol=1e-10)


def _dense_column_kl(theta, noise, beta):
    """sum_j KL(N(Theta_:j, diag(Theta_:j) S diag(Theta_:j)) || N(0, diag(beta_:j)^-1)), noise on rows of Theta."""
    covariance = noise.covariance_matrix
    total = theta.new_zeros(())
    for j in range(theta.shape[1]):
        column = theta[:, j]
        q = MultivariateNormal(column, covariance * torch.outer(column, column))
        p = MultivariateNormal(torch.zeros_like(column), torch.diag(1 / beta[:, j]))
        total = total + kl_divergence(q, p)
    return total


def test_empirical_bayes_kl_equals_eq12_at_the_optimal_beta():
    noise = _noise(size=5, reflections=2)
    theta = torch.randn(5, 7, dtype=torch.float64)  # the paper's K x Q: noise on the rows
    s = noise.variance
    beta_star = 1 / (theta.square() * (1 + s)[:, None])
    dense = _dense_column_kl(theta, noise, beta_star)
    assert torch.allclose(vsd_kl(noise.alpha, s, num_columns=7), dense, rtol=1e-9)
    # beta* is the minimizer: any other precision costs more.
    for factor in (0.5, 2.0):
        assert _dense_column_kl(theta, noise, beta_star * factor) > dense


def test_zero_reflections_is_gaussian_dropout_kl():
    noise = _noise(size=4, reflections=0)
    theta = torch.randn(4, 3, dtype=torch.float64)
    alpha = noise.alpha[:, None]
    # Gaussian dropout: W_ij ~ N(Theta_ij, alpha_i Theta_ij^2) independently, prior precision beta*.
    prior_std = (theta.square() * (1 + alpha)).sqrt()
    direct = kl_divergence(Normal(theta, alpha.sqrt() * theta.abs()), Normal(0.0, prior_std)).sum()
    assert torch.allclose(vsd_kl(noise.alpha, noise.variance, 3), direct, rtol=1e-10)
    assert torch.allclose(direct, 0.5 * 3 * torch.log1p(1 / noise.alpha).sum(), rtol=1e-10)


def test_hierarchical_kl_equals_monte_carlo_estimate():
    noise = _noise(size=4, reflections=2)
    theta = torch.randn(4, 3, dtype=torch.float64)
    z_loc, z_scale = torch.tensor([0.1, -0.2, 0.0, 0.3]), torch.tensor([0.3, 0.2, 0.5, 0.1])
    s = noise.variance
    beta_star = 1 / (theta.square() * (1 + s)[:, None])
    q_z = dist.LogNormal(z_loc, z_scale).to_event(1)
    p_z = dist.InverseGamma(torch.tensor(3.0), torch.tensor(2.0)).expand([4]).to_event(1)
    num = 4000
    zs = q_z.sample((num,))
    covariance = noise.covariance_matrix
    conditional = []
    for z in zs[:400]:  # the dense conditional KL is slow; its spread is small, 400 draws suffice
        total = 0.0
        for j in range(3):
            column = z * theta[:, j]
            q = MultivariateNormal(column, covariance * torch.outer(column, column))
            p = MultivariateNormal(torch.zeros(4, dtype=torch.float64), torch.diag(z / beta_star[:, j]))
            total = total + kl_divergence(q, p)
        conditional.append(total)
    conditional_t = torch.stack(conditional)
    z_terms = q_z.log_prob(zs) - p_z.log_prob(zs)
    mc = conditional_t.mean() + z_terms.mean()
    se = (conditional_t.var() / len(conditional_t) + z_terms.var() / num).sqrt()
    closed = vsd_hierarchical_kl(noise.alpha, s, 3, z_loc, z_scale) + kl_divergence(q_z, p_z)
    assert abs(float(closed - mc)) < 5 * float(se)


@pytest.mark.parametrize("prior", ["inverse_gamma", "gamma"])
def test_lognormal_kls_match_monte_carlo(prior):
    q = dist.LogNormal(torch.tensor([0.3, -0.4]), torch.tensor([0.4, 0.2]))
    concentration, rate = torch.tensor([3.0, 1.5]), torch.tensor([2.0, 0.7])
    p = dist.InverseGamma(concentration, rate) if prior == "inverse_gamma" else dist.Gamma(concentration, rate)
    z = q.sample((200_000,))
    terms = q.log_prob(z) - p.log_prob(z)
    se = terms.std(0) / math.sqrt(len(z))
    assert ((kl_divergence(q, p) - terms.mean(0)).abs() < 5 * se).all()


def _weight(theta, noise, noise_dim):
    return VSDWeight(theta, noise, noise_dim, noise.sample())


@pytest.mark.parametrize("reflections", [0, 2])
def test_linear_forward_draws_noise_per_example_with_the_right_output_covariance(reflections):
    noise = _noise(size=6, reflections=reflections)
    theta = torch.randn(3, 6, dtype=torch.float64)  # PyTorch layout (out, in): the noise scales the inputs
    weight = _weight(theta, noise, noise_dim=1)
    x = torch.randn(6, dtype=torch.float64)
    num = 100_000
    outputs = torch.nn.functional.linear(x.expand(num, 6), weight)
    # y = Theta diag(xi) x: mean Theta x, covariance Theta diag(x) S diag(x) Theta^T.
    expected_cov = theta @ (torch.outer(x, x) * noise.covariance_matrix) @ theta.T
    var = expected_cov.diagonal()
    assert ((outputs.mean(0) - theta @ x).abs() < 5 * (var / num).sqrt()).all()
    cov_se = ((torch.outer(var, var) + expected_cov.square()) / num).sqrt()
    assert ((torch.cov(outputs.T) - expected_cov).abs() < 5 * cov_se).all()


def test_conv_forward_scales_output_channels_per_image():
    noise = _noise(size=4, reflections=1)
    theta = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    weight = _weight(theta, noise, noise_dim=0)
    image = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    num = 50_000
    outputs = torch.nn.functional.conv2d(image.expand(num, -1, -1, -1), weight, padding=1)
    clean = torch.nn.functional.conv2d(image, theta, padding=1)[0]
    ratio = outputs[:, :, 2, 2] / clean[:, 2, 2]  # = xi of each image
    covariance = noise.covariance_matrix
    var = covariance.diagonal()
    assert ((ratio.mean(0) - 1).abs() < 5 * (var / num).sqrt()).all()
    cov_se = ((torch.outer(var, var) + covariance.square()) / num).sqrt()
    assert ((torch.cov(ratio.T) - covariance).abs() < 5 * cov_se).all()
    # Every pixel of a channel shares the image's draw.
    assert torch.allclose(outputs[:, :, 1, 1] / clean[:, 1, 1], ratio)


def test_dense_weight_is_the_sites_draw():
    noise = _noise(size=6, reflections=2)
    theta = torch.randn(3, 6, dtype=torch.float64)
    weight = _weight(theta, noise, noise_dim=1)
    assert torch.allclose(weight.dense(), theta * weight.xi)
    x = torch.randn(5, 6, dtype=torch.float64)
    assert torch.allclose(x @ weight.t(), x @ (theta * weight.xi).T)
    weight.local = False
    assert torch.allclose(torch.nn.functional.linear(x, weight), x @ (theta * weight.xi).T)
