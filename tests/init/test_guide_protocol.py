"""The guide protocol of ``pyro_whvi.init``: ``set_site_gaussian_`` and ``set_site_isotropic_`` write the moments
they are given, exactly where the guide's family can hold them; ``iblm_`` and ``xavier_normal_`` reach a guide
through these methods only, and name what to implement for a guide that has neither."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoDelta, AutoDiagonalNormal, AutoNormal

from pyro_whvi import AutoVSDGuide, AutoWHVIGuide, iblm_, xavier_normal_
from pyro_whvi.infer._guide_utils import assign_param_, deep_getattr
from pyro_whvi.init import site_initializer
from pyro_whvi.nn import BayesianMLP

from ..helpers import dense_weight, whvi_a_matrix

WEIGHT, BIAS = "layers.0.weight", "layers.0.bias"


def _set_up(make_guide, widths=(6, 4)):
    guide = make_guide(BayesianMLP(list(widths)))
    guide(torch.randn(5, widths[0]))
    return guide


def _positive(*shape):
    return torch.rand(*shape) + 0.5


def _row_precisions(rows, size):
    factor = torch.randn(rows, size, size)
    return factor @ factor.transpose(-1, -2) + torch.eye(size)


# -- mean-field sites ------------------------------------------------------------------------------


MEAN_FIELD = {
    "autonormal": (AutoNormal, WEIGHT),
    "whvi-bias": (AutoWHVIGuide, BIAS),
    "vsd-bias": (AutoVSDGuide, BIAS),
    "whvi-unstructured-weight": (lambda m: AutoWHVIGuide(m, hide=[WEIGHT]), WEIGHT),
}


@pytest.mark.parametrize("name", list(MEAN_FIELD))
def test_a_mean_field_site_takes_the_mean_and_the_inverse_precision(name):
    make_guide, site = MEAN_FIELD[name]
    guide = _set_up(make_guide, widths=(6, 4, 4))  # the second weight keeps a structured guide's site selection
    target = site_initializer(guide, "test")
    loc = deep_getattr(guide.locs, site)
    mean, precision = torch.randn(loc.shape), _positive(*loc.shape)
    target.set_site_gaussian_(site, mean, precision, data_precision=precision, data_rhs=mean)
    torch.testing.assert_close(deep_getattr(guide.locs, site).detach(), mean)
    torch.testing.assert_close(deep_getattr(guide.scales, site).detach(), precision.rsqrt())
    target.set_site_isotropic_(site, 0.3)
    assert torch.equal(deep_getattr(guide.locs, site).detach(), torch.zeros(loc.shape))
    torch.testing.assert_close(deep_getattr(guide.scales, site).detach(), torch.full(loc.shape, 0.3**0.5))


# -- WHVI sites ------------------------------------------------------------------------------------


def test_whvi_q_g_is_the_exact_posterior_of_the_likelihood_part_under_g_prior():
    """4 x 6 weight (D = 8): q(g) = N(P^-1 A^T b, P^-1), P = A^T blockdiag(P_rows) A + I / lambda, with A from
    the s1, s2 the guide was given; a full-covariance q(g) holds it exactly."""
    guide = _set_up(lambda m: AutoWHVIGuide(m, covariance="full", prior_variance=2.0))
    data_precision, data_rhs = _row_precisions(4, 6), torch.randn(4, 6)
    guide.set_site_gaussian_(
        WEIGHT, torch.randn(4, 6), _positive(4, 6), data_precision=data_precision, data_rhs=data_rhs
    )
    s1, s2 = deep_getattr(guide.whvi_s1, WEIGHT).detach(), deep_getattr(guide.whvi_s2, WEIGHT).detach()
    a = whvi_a_matrix(s1, s2, (4, 6))
    precision = a.T @ torch.block_diag(*data_precision) @ a + torch.eye(8) / 2.0
    posterior = guide.get_posterior(WEIGHT)
    torch.testing.assert_close(posterior.mean.reshape(-1), torch.linalg.solve(precision, a.T @ data_rhs.reshape(-1)))
    torch.testing.assert_close(posterior.base_dist.covariance_matrix[0], torch.linalg.inv(precision))


def test_a_whvi_shaped_mean_is_reproduced_when_the_data_pin_it_down():
    """A mean of the WHVI form (within the projection's spread), observed with a vanishing noise: q(W) has that
    mean (the projection onto the form is exact, the prior's pull is 1e-8 of the data's)."""
    guide = _set_up(AutoWHVIGuide, widths=(8, 8, 1))
    signs = torch.sign(torch.randn(2, 8))
    mean = dense_weight(signs[0] * torch.empty(8).uniform_(0.5, 1.5), torch.randn(8), signs[1] * _positive(8))
    strength = 1e8
    guide.set_site_gaussian_(
        WEIGHT,
        mean,
        torch.full_like(mean, strength),
        data_precision=strength * torch.eye(8).expand(8, 8, 8),
        data_rhs=strength * mean,
    )
    torch.testing.assert_close(guide.weight_distribution(WEIGHT).mean, mean, atol=1e-5, rtol=0)


def test_a_whvi_site_needs_the_likelihood_part():
    guide = _set_up(AutoWHVIGuide)
    with pytest.raises(ValueError, match=r"set_site_gaussian_\('layers\.0\.weight'\).*data_precision and data_rhs"):
        guide.set_site_gaussian_(WEIGHT, torch.randn(4, 6), _positive(4, 6))


@pytest.mark.parametrize("covariance", ["diagonal", "full", "lowrank"])
def test_whvi_isotropic_gives_the_weight_entries_the_variance_and_keeps_s1_s2(covariance):
    guide = _set_up(lambda m: AutoWHVIGuide(m, covariance=covariance), widths=(8, 8, 1))
    s1 = deep_getattr(guide.whvi_s1, WEIGHT).detach().clone()
    guide.set_site_isotropic_(WEIGHT, 0.2)
    assert torch.equal(deep_getattr(guide.whvi_s1, WEIGHT).detach(), s1)
    weights = guide.weight_distribution(WEIGHT)
    assert torch.equal(guide.qg(WEIGHT).loc, torch.zeros(1, 8))
    torch.testing.assert_close(weights.variance.mean(), torch.tensor(0.2))


# -- VSD sites -------------------------------------------------------------------------------------


def test_vsd_takes_the_mean_and_variances_it_can_hold_exactly():
    """T = 0 (U = I): W_ij ~ N(Theta_ij, Theta_ij^2 alpha_j). A Gaussian of that form, Theta = mean and
    precisions 1 / (mean^2 s_j), is written as it is."""
    guide = _set_up(lambda m: AutoVSDGuide(m, reflections=0), widths=(5, 3))
    mean, relative = torch.randn(3, 5), torch.rand(5) + 0.1
    precision = 1.0 / (mean.pow(2) * relative)
    guide.set_site_gaussian_(WEIGHT, mean, precision)
    posterior = guide.get_posterior(WEIGHT)
    assert torch.equal(posterior.mean.detach(), mean)
    torch.testing.assert_close(posterior.variance.detach(), 1.0 / precision)


def test_vsd_isotropic_draws_theta_from_the_normal_and_keeps_alpha():
    guide = _set_up(AutoVSDGuide, widths=(5, 3))
    alpha = deep_getattr(guide.vsd_alpha, WEIGHT).detach().clone()
    pyro.set_rng_seed(3)
    guide.set_site_isotropic_(WEIGHT, 0.5)
    pyro.set_rng_seed(3)
    expected = 0.5**0.5 * torch.randn(3, 5)
    assert torch.equal(deep_getattr(guide.vsd_theta, WEIGHT).detach(), expected)
    assert torch.equal(deep_getattr(guide.vsd_alpha, WEIGHT).detach(), alpha)


# -- dispatch ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_guide", [AutoDelta, AutoDiagonalNormal], ids=["delta", "diagonal-normal"])
def test_a_guide_without_the_protocol_is_named_with_the_supported_ones(make_guide):
    x, y = torch.randn(30, 3), torch.randn(30)
    name = make_guide.__name__
    for initialize, call in (
        ("iblm_", lambda g: iblm_(g, (x, y))),
        ("xavier_normal_", lambda g: xavier_normal_(g, x, y)),
    ):
        pyro.clear_param_store()
        with pytest.raises(TypeError, match=rf"{initialize}: {name} is not supported") as error:
            call(make_guide(BayesianMLP([3, 4, 1])))
        assert "AutoNormal, AutoWHVIGuide or AutoVSDGuide" in str(error.value)
        assert "set_site_gaussian_" in str(error.value) and "set_site_isotropic_" in str(error.value)


def test_a_set_up_guide_is_needed():
    guide = AutoWHVIGuide(BayesianMLP([6, 4]))
    with pytest.raises(RuntimeError, match="first call"):
        guide.set_site_gaussian_(WEIGHT, torch.randn(4, 6), _positive(4, 6))


class _PointGuide(AutoDelta):
    """A guide from outside pyro_whvi that implements the protocol: a point estimate at the given means."""

    def __init__(self, model):
        super().__init__(model)
        self.calls: list[tuple[str, str]] = []

    def set_site_gaussian_(self, site, mean, precision, *, data_precision=None, data_rhs=None):
        self.calls.append(("gaussian", site))
        assign_param_(self, site, mean, "_PointGuide")

    def set_site_isotropic_(self, site, variance):
        self.calls.append(("isotropic", site))
        assign_param_(self, site, torch.full_like(deep_getattr(self, site), variance), "_PointGuide")


def test_iblm_and_xavier_reach_any_guide_through_the_protocol():
    x = torch.randn(40, 3)
    y = torch.sin(x[:, 0])
    guide = _PointGuide(BayesianMLP([3, 4, 1]))
    iblm_(guide, (x, y), batch_size=40)
    sites = ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]
    assert guide.calls == [("gaussian", site) for site in sites]
    assert deep_getattr(guide, "layers.1.weight").abs().sum() > 0
    guide.calls.clear()
    xavier_normal_(guide, x, y)
    assert guide.calls == [("isotropic", site) for site in sites]
    torch.testing.assert_close(deep_getattr(guide, "layers.0.weight").detach(), torch.full((4, 3), 2 / 7))
