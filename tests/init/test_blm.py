"""Bayesian linear regression (I-BLM App. B–D) and the WHVI projection (WHVI App. B) against dense,
closed-form answers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import MultivariateNormal

from pyro_whvi.init import (
    blm_log_marginal,
    blm_posterior,
    dirichlet_label_transform,
    evidence_hyperparameters,
    fit_whvi_mean,
    whvi_precision,
)
from pyro_whvi.init.whvi_projection import whvi_rhs

from ..helpers import dense_weight, whvi_a_matrix


def _problems(num_problems=3, num=20, dim=4):
    inputs = torch.randn(num_problems, num, dim)
    targets = torch.randn(num_problems, num)
    return inputs, targets


@pytest.mark.parametrize("heteroscedastic", [False, True])
def test_posterior_equals_dense_closed_form(heteroscedastic):
    inputs, targets = _problems()
    noise = torch.rand(3, 20) + 0.2 if heteroscedastic else torch.tensor(0.3)
    prior_var = torch.rand(3, 4) + 0.5
    prior_mean = torch.randn(3, 4)
    posterior = blm_posterior(inputs, targets, noise, prior_var, prior_mean)
    for j in range(3):
        noise_j = noise[j] if heteroscedastic else noise.expand(20)
        precision = torch.diag(1 / prior_var[j]) + inputs[j].T @ torch.diag(1 / noise_j) @ inputs[j]
        covariance = torch.linalg.inv(precision)
        mean = covariance @ (prior_mean[j] / prior_var[j] + inputs[j].T @ (targets[j] / noise_j))
        torch.testing.assert_close(posterior.mean[j], mean)
        torch.testing.assert_close(posterior.precision[j], precision)
        torch.testing.assert_close(posterior.covariance[j], covariance)
        torch.testing.assert_close(posterior.mean_field_variance[j], 1 / precision.diagonal())


@pytest.mark.parametrize("heteroscedastic", [False, True])
def test_log_marginal_equals_dense_gaussian(heteroscedastic):
    inputs, targets = _problems()
    noise = torch.rand(3, 20) + 0.2 if heteroscedastic else torch.tensor(0.3)
    prior_var = torch.rand(4) + 0.5
    value = blm_log_marginal(inputs, targets, noise, prior_var)
    for j in range(3):
        noise_j = noise[j] if heteroscedastic else noise.expand(20)
        covariance = torch.diag(noise_j) + inputs[j] @ torch.diag(prior_var) @ inputs[j].T
        expected = MultivariateNormal(torch.zeros(20), covariance).log_prob(targets[j])
        torch.testing.assert_close(value[j], expected)


def test_log_marginal_matches_appendix_c_woodbury_form():
    """App. C with Lambda = I: -1/2 (sum log s2 + 2 sum log Q_kk) - 1/2 y^T y~ + 1/2 y~^T X Q^-T Q^-1 X^T y~."""
    inputs, targets = _problems(num_problems=1)
    x, y, noise = inputs[0], targets[0], torch.rand(20) + 0.1
    y_tilde = y / noise
    q = torch.linalg.cholesky(torch.eye(4) + x.T @ torch.diag(1 / noise) @ x)
    half = torch.linalg.solve_triangular(q, (x.T @ y_tilde).unsqueeze(-1), upper=False).squeeze(-1)
    paper = -0.5 * (noise.log().sum() + 2 * q.diagonal().log().sum()) - 0.5 * y @ y_tilde + 0.5 * half @ half
    const = -0.5 * 20 * math.log(2 * math.pi)
    torch.testing.assert_close(blm_log_marginal(inputs, targets, noise.unsqueeze(0), 1.0)[0], paper + const)


def test_mean_field_variances_minimize_reverse_kl():
    """App. D: KL(q || p) over diagonal q is least at m = mu, s_i^2 = 1 / P_ii (zero gradient, larger elsewhere)."""
    inputs, targets = _problems(num_problems=1, dim=5)
    posterior = blm_posterior(inputs, targets, 0.5)
    target = MultivariateNormal(posterior.mean[0], precision_matrix=posterior.precision[0])

    def kl(log_var, mean):
        q = MultivariateNormal(mean, torch.diag(log_var.exp()))
        return torch.distributions.kl_divergence(q, target)

    log_var = posterior.mean_field_variance[0].log().requires_grad_()
    mean = posterior.mean[0].clone().requires_grad_()
    value = kl(log_var, mean)
    grads = torch.autograd.grad(value, (log_var, mean))
    assert all(g.abs().max() < 1e-10 for g in grads)
    for _ in range(5):
        assert kl(log_var.detach() + 0.1 * torch.randn(5), mean.detach()) > value


def test_dirichlet_transform_round_trip():
    """softmax of the log-normals' means gives back (y + alpha) / (1 + k alpha) (I-BLM §4.3)."""
    labels = torch.tensor([0, 2, 1, 2])
    targets, variance = dirichlet_label_transform(labels, 3, alpha=0.01)
    one_hot = torch.nn.functional.one_hot(labels, 3).double()
    torch.testing.assert_close(variance, torch.log1p(1 / (one_hot + 0.01)))
    torch.testing.assert_close(torch.softmax(targets + variance / 2, -1), (one_hot + 0.01) / (1 + 3 * 0.01))
    assert (torch.softmax(targets, -1).argmax(-1) == labels).all()
    torch.testing.assert_close(dirichlet_label_transform(one_hot, 3)[0], targets)
    with pytest.raises(ValueError, match="lie in"):
        dirichlet_label_transform(torch.tensor([0, 3]), 3)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_label_transform(labels, 3, alpha=0.0)


def test_evidence_finds_the_generating_noise_and_prior():
    """Type-II ML on a grid: data from a known noise level and prior scale recover them within a grid step."""
    inputs = torch.randn(8, 400, 3)
    weights = 3.0 * torch.randn(8, 3)  # prior variance 9 = 9 x the nominal 1
    targets = (inputs @ weights.unsqueeze(-1)).squeeze(-1) + 0.5 * torch.randn(8, 400)
    noise, factor = evidence_hyperparameters(inputs, targets, 1.0, prior_factors=torch.tensor([0.25, 1.0, 4.0, 16.0]))
    assert 0.25 / 2.5 < noise < 0.25 * 2.5
    assert factor in (4.0, 16.0)


# -- WHVI projection ---------------------------------------------------------------------------


def test_fit_recovers_an_exact_whvi_matrix():
    s1, s2 = (torch.rand(2, 1, 16) + 0.5) * torch.sign(torch.randn(2, 1, 16))
    g = torch.randn(1, 16)
    target = dense_weight(s1[0], g[0], s2[0]).unsqueeze(0)
    start = torch.sign(torch.randn(1, 16))
    fit_s1, fit_g, fit_s2 = fit_whvi_mean(target, torch.ones_like(target), torch.ones(1, 16), start, 2.0)
    torch.testing.assert_close(dense_weight(fit_s1[0], fit_g[0], fit_s2[0]), target[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fit_g.pow(2).mean(), torch.tensor(2.0))  # balanced: mean square lambda


def test_fit_ignores_masked_entries_and_reduces_the_error():
    target = torch.rand(2, 8, 8) * 2 - 1
    mask = torch.ones_like(target)
    mask[:, 5:, :] = 0.0  # dropped rows
    mask[:, :, 6:] = 0.0  # padded columns
    start = (torch.ones(2, 8), torch.sign(torch.randn(2, 8)))
    fit = fit_whvi_mean(target, mask, *start)
    changed = target + 10.0 * (1 - mask) * torch.randn_like(target)
    fit_changed = fit_whvi_mean(changed, mask, *start)
    for a, b in zip(fit, fit_changed):
        torch.testing.assert_close(a, b)
    weights = torch.stack([dense_weight(fit[0][k], fit[1][k], fit[2][k]) for k in range(2)])
    assert ((mask * (weights - target)).pow(2).sum()) < 0.8 * (mask * target).pow(2).sum()


@pytest.mark.parametrize("diagonal_rows", [False, True])
def test_whvi_precision_and_rhs_equal_dense_a_transpose(diagonal_rows):
    """A^T P A and A^T b with A built entry by entry from scipy's Hadamard matrix (stacked 2 blocks)."""
    num_blocks, size = 2, 8
    s1, s2 = torch.randn(num_blocks, size), torch.randn(num_blocks, size)
    rows = num_blocks * size
    if diagonal_rows:
        row_precision = torch.rand(num_blocks, size, size)
        dense_rows = [torch.diag(p) for p in row_precision.reshape(rows, size)]
    else:
        factor = torch.randn(num_blocks, size, size, size)
        row_precision = factor @ factor.transpose(-1, -2)
        dense_rows = list(row_precision.reshape(rows, size, size))
    rhs = torch.randn(num_blocks, size, size)
    a = whvi_a_matrix(s1, s2, (rows, size))  # (rows * size, K * D), row-major W
    big = torch.block_diag(*dense_rows)
    expected = a.T @ big @ a
    full = whvi_precision(s1, s2, row_precision, diagonal=False)
    diag = whvi_precision(s1, s2, row_precision, diagonal=True)
    for k in range(num_blocks):
        block = slice(k * size, (k + 1) * size)
        torch.testing.assert_close(full[k], expected[block, block])
        torch.testing.assert_close(diag[k], expected[block, block].diagonal())
        assert expected[block, slice((1 - k) * size, (2 - k) * size)].abs().max() < 1e-12  # blocks independent
    torch.testing.assert_close(whvi_rhs(s1, s2, rhs).reshape(-1), a.T @ rhs.reshape(-1))


@pytest.mark.parametrize("heteroscedastic", [False, True])
def test_evidence_search_agrees_with_the_direct_marginal_likelihood(heteroscedastic):
    """The sufficient-statistics search picks the grid point that blm_log_marginal ranks first."""
    inputs, targets = _problems(num_problems=4, num=30, dim=3)
    prior = torch.rand(4, 3) + 0.2
    factors = torch.tensor([0.25, 1.0, 4.0])
    noise = torch.rand(4, 30) + 0.1 if heteroscedastic else None
    best_noise, best_factor = evidence_hyperparameters(inputs, targets, prior, noise, factors, noise_grid_size=5)
    scale = targets.pow(2).mean()
    grid = [noise] if heteroscedastic else list(scale * torch.logspace(-3, 1, 5))
    values = {
        (i, float(c)): float(blm_log_marginal(inputs, targets, v, c * prior).sum())
        for i, v in enumerate(grid)
        for c in factors
    }
    i, factor = max(values, key=values.get)
    assert factor == float(best_factor)
    if not heteroscedastic:
        torch.testing.assert_close(best_noise, grid[i])


def test_cholesky_adds_jitter_only_when_needed():
    from pyro_whvi.init import cholesky_with_jitter

    spd = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    torch.testing.assert_close(cholesky_with_jitter(spd, "x"), torch.linalg.cholesky(spd))
    singular = torch.ones(2, 2)
    factor = cholesky_with_jitter(singular, "x")
    assert torch.isfinite(factor).all() and (factor @ factor.T - singular).abs().max() < 1e-6
    with pytest.raises(ValueError, match="not positive definite"):
        cholesky_with_jitter(torch.full((2, 2), float("nan")), "x")
