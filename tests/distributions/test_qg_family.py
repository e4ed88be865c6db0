"""The one q(g) family (pyro_whvi.distributions.qg_family) against exact answers: KL vs torch's dense
Gaussian KL, moments, the best Gaussian of each kind given a precision, the conventions' weight
variance vs WHVINormal, and the guide / GP holders reading back what was set."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn
from torch.distributions import MultivariateNormal, kl_divergence

from pyro_whvi import AutoWHVIGuide
from pyro_whvi.distributions import WHVILayout, WHVINormal
from pyro_whvi.distributions.qg_family import (
    COVARIANCES,
    GP_CONVENTION,
    NETWORK_CONVENTION,
    QG_FIELDS,
    GaussianQG,
)
from pyro_whvi.gp.posteriors import WHVIWeightPosterior

BLOCKS, SIZE, RANK = 3, 4, 2


def _random_qg(kind: str, generator: torch.Generator) -> GaussianQG:
    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    loc = randn(BLOCKS, SIZE)
    scale = randn(BLOCKS, SIZE).exp()
    if kind == "diagonal":
        return GaussianQG(kind, loc, scale=scale)
    if kind == "full":
        tril = torch.tril(randn(BLOCKS, SIZE, SIZE), -1) + torch.diag_embed(scale)
        return GaussianQG(kind, loc, scale_tril=tril)
    return GaussianQG(kind, loc, scale=scale, cov_factor=randn(BLOCKS, SIZE, RANK))


def _dense(qg: GaussianQG) -> MultivariateNormal:
    return MultivariateNormal(qg.loc, covariance_matrix=qg.covariance_matrix())


def _random_precision(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    root = torch.randn(BLOCKS, SIZE, 2 * SIZE, generator=generator, dtype=torch.float64)
    precision = root @ root.mT + 0.5 * torch.eye(SIZE, dtype=torch.float64)
    return precision, torch.randn(BLOCKS, SIZE, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("kind", COVARIANCES)
@pytest.mark.parametrize("prior_variance", [1.0, 0.3, 16.0])
def test_kl_is_the_dense_gaussian_kl(kind, prior_variance):
    qg = _random_qg(kind, torch.Generator().manual_seed(0))
    prior = MultivariateNormal(torch.zeros(SIZE, dtype=torch.float64), prior_variance * torch.eye(SIZE).double())
    expected = kl_divergence(_dense(qg), prior).sum()
    torch.testing.assert_close(qg.kl_divergence(prior_variance), expected, rtol=1e-12, atol=1e-12)


def test_full_kl_reads_the_given_diagonal_for_its_log_determinant():
    qg = _random_qg("full", torch.Generator().manual_seed(1))
    assert qg.scale_tril is not None
    diagonal = qg.scale_tril.diagonal(dim1=-2, dim2=-1)
    with_scale = GaussianQG("full", qg.loc, scale=diagonal, scale_tril=qg.scale_tril)
    torch.testing.assert_close(with_scale.kl_divergence(2.0), qg.kl_divergence(2.0), rtol=1e-14, atol=0)
    doubled = GaussianQG("full", qg.loc, scale=2 * diagonal, scale_tril=qg.scale_tril)  # the log-det moves
    assert not torch.allclose(doubled.kl_divergence(2.0), qg.kl_divergence(2.0))


@pytest.mark.parametrize("kind", COVARIANCES)
def test_distribution_has_the_family_moments(kind):
    qg = _random_qg(kind, torch.Generator().manual_seed(2))
    distribution = qg.distribution()
    assert distribution.event_shape == (BLOCKS, SIZE) and distribution.batch_shape == ()
    torch.testing.assert_close(distribution.mean, qg.loc)
    base = distribution.base_dist
    covariance = torch.diag_embed(base.variance) if kind == "diagonal" else base.covariance_matrix
    torch.testing.assert_close(covariance, qg.covariance_matrix(), rtol=1e-12, atol=1e-12)


def test_lowrank_covariance_is_diagonal_plus_factor_outer_product():
    qg = _random_qg("lowrank", torch.Generator().manual_seed(3))
    assert qg.scale is not None and qg.cov_factor is not None
    for k in range(BLOCKS):
        factor = qg.cov_factor[k]
        expected = torch.diag(qg.scale[k] ** 2) + sum(torch.outer(factor[:, r], factor[:, r]) for r in range(RANK))
        torch.testing.assert_close(qg.covariance_matrix()[k], expected, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("kind", COVARIANCES)
def test_from_precision_is_the_best_gaussian_of_its_kind(kind):
    precision, rhs = _random_precision(torch.Generator().manual_seed(4))
    covariance = torch.linalg.inv(precision)
    qg = GaussianQG.from_precision(kind, precision, rhs, rank=SIZE)
    torch.testing.assert_close(qg.loc, (covariance @ rhs.unsqueeze(-1)).squeeze(-1), rtol=1e-10, atol=1e-12)
    if kind == "diagonal":  # mean-field optimum: variances 1 / P_ii (I-BLM App. D)
        expected = torch.diag_embed(1 / precision.diagonal(dim1=-2, dim2=-1))
    else:  # full, and low-rank at full rank: the Gaussian itself
        expected = covariance
    torch.testing.assert_close(qg.covariance_matrix(), expected, rtol=1e-9, atol=1e-11)


def test_low_rank_from_precision_keeps_the_leading_directions_and_the_variances():
    precision, rhs = _random_precision(torch.Generator().manual_seed(5))
    covariance = torch.linalg.inv(precision)
    qg = GaussianQG.from_precision("lowrank", precision, rhs, rank=RANK)
    assert qg.cov_factor is not None and qg.cov_factor.shape == (BLOCKS, SIZE, RANK) and qg.rank == RANK
    torch.testing.assert_close(
        qg.covariance_matrix().diagonal(dim1=-2, dim2=-1), covariance.diagonal(dim1=-2, dim2=-1), rtol=1e-10, atol=0
    )
    eigenvectors = torch.linalg.eigh(covariance).eigenvectors[..., -RANK:]
    projector = eigenvectors @ eigenvectors.mT  # the factor lies in the span of the leading eigenvectors
    torch.testing.assert_close(projector @ qg.cov_factor, qg.cov_factor, rtol=1e-9, atol=1e-11)
    with pytest.raises(ValueError, match="rank"):
        GaussianQG.from_precision("lowrank", precision, rhs)


@pytest.mark.parametrize("kind", COVARIANCES)
def test_isotropic(kind):
    loc = torch.zeros(BLOCKS, SIZE, dtype=torch.float64)
    qg = GaussianQG.isotropic(kind, loc, 0.5, rank=RANK)
    expected = 0.25 * torch.eye(SIZE, dtype=torch.float64).expand(BLOCKS, SIZE, SIZE)
    assert torch.equal(qg.covariance_matrix(), expected)
    assert set(qg.fields()) == {"loc", *QG_FIELDS[kind]}
    if kind == "lowrank":
        drawn = GaussianQG.isotropic(kind, loc, 0.5, rank=RANK, factor_scale=0.1)
        assert drawn.cov_factor is not None and drawn.cov_factor.abs().max() > 0


def test_missing_fields_and_unknown_kinds_fail():
    with pytest.raises(ValueError, match="scale_tril"):
        GaussianQG("full", torch.zeros(4), scale=torch.ones(4))
    with pytest.raises(ValueError, match="covariance must be one of"):
        GaussianQG("dense", torch.zeros(4), scale=torch.ones(4))


@pytest.mark.parametrize(
    ("convention", "prior_variance", "expected"),
    [(NETWORK_CONVENTION, 1.0, 1 / 8), (NETWORK_CONVENTION, 1e-3, 1 / 8), (GP_CONVENTION, None, 1.0)],
)
def test_conventions_give_the_weight_variance_of_whvi_normal(convention, prior_variance, expected):
    """Var W_ij = s1^2 s2^2 lambda / D under g ~ N(0, lambda I) (eq. 4), at each convention's initial S1, S2."""
    layout = WHVILayout.for_shape((8, 8))
    lam = convention.resolve_prior_variance(layout.block_size, prior_variance)
    like = torch.zeros((), dtype=torch.float64)
    s1, s2 = convention.init_scales(layout.block_shape, lam, like)
    prior = dist.Normal(torch.zeros(layout.block_shape, dtype=torch.float64), lam**0.5).to_event(2)
    variance = WHVINormal(s1, s2, prior, layout.shape).variance
    torch.testing.assert_close(variance, torch.full_like(variance, expected), rtol=1e-12, atol=0)
    assert convention.weight_variance(layout.block_size, prior_variance) == pytest.approx(expected, rel=1e-12)


class _Net(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](4, 8)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([8, 4]).to_event(2))

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("kind", COVARIANCES)
def test_guide_reads_back_what_was_set_under_its_own_names(kind):
    pyro.clear_param_store()
    guide = AutoWHVIGuide(_Net(), covariance=kind, rank=RANK if kind == "lowrank" else None)
    guide(torch.randn(3, 4))
    groups = {"loc": "locs", "scale": "scales", "scale_tril": "scale_trils", "cov_factor": "cov_factors"}
    names = {f"{groups[f]}.fc.weight_whvi_g_unconstrained" for f in ("loc", *QG_FIELDS[kind])}
    assert names <= set(guide.state_dict())
    block_shape = guide.whvi_layouts["fc.weight"].block_shape
    precision, rhs = _random_precision(torch.Generator().manual_seed(6))
    dtype = guide.qg("fc.weight").loc.dtype
    precision, rhs = precision[: block_shape[0]].to(dtype), rhs[: block_shape[0]].to(dtype)
    qg = GaussianQG.from_precision(kind, precision, rhs, rank=RANK)
    guide.set_qg_("fc.weight", qg)
    read = guide.qg("fc.weight")
    torch.testing.assert_close(read.loc, qg.loc)
    torch.testing.assert_close(read.covariance_matrix(), qg.covariance_matrix())
    posterior = guide.get_posterior("fc.weight")
    torch.testing.assert_close(posterior.mean, qg.loc)
    with pytest.raises(ValueError, match="q\\(g\\)"):
        guide.set_qg_("fc.weight", GaussianQG.isotropic("full" if kind != "full" else "diagonal", qg.loc, 1.0))


@pytest.mark.parametrize("kind", ["diagonal", "full"])
def test_gp_posterior_kl_and_conjugate_set_are_the_family_s(kind):
    posterior = WHVIWeightPosterior(16, kind).double()
    lam = posterior.prior_variance
    assert lam == 4.0 and not hasattr(posterior, "s1")  # a pure q(z): the design's S1, S2 are the strategy's
    design = torch.randn(10, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    y = torch.randn(10, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    posterior.set_conjugate_(design, y, 0.1)
    precision = design.T @ design / 0.1 + torch.eye(4, dtype=torch.float64) / lam
    expected = GaussianQG.from_precision(kind, precision, design.T @ y / 0.1)
    torch.testing.assert_close(posterior.loc, expected.loc, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(posterior.qg().covariance_matrix(), expected.covariance_matrix(), rtol=1e-10, atol=1e-12)
    prior = MultivariateNormal(torch.zeros(4, dtype=torch.float64), lam * torch.eye(4, dtype=torch.float64))
    dense = MultivariateNormal(posterior.loc, covariance_matrix=posterior.qg().covariance_matrix())
    torch.testing.assert_close(posterior.kl_divergence(), kl_divergence(dense, prior), rtol=1e-10, atol=1e-12)
