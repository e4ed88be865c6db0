"""The checks every variational strategy of a random-feature GP passes, as a reusable base class (GPyTorch's
``BaseKernelTestCase`` idea): a subclass says how to build its model, and inherits one test per check.

Shipped for users who write their own strategy or weight posterior (it needs ``pytest``, in the ``dev`` extra):
subclass it in a ``test_*.py`` file, name the subclass ``Test...`` and implement
:meth:`RandomFeatureStrategyTestCase.make_model`. The checks, in float64 against closed forms:

* the KL is GPyTorch's KL of the strategy's ``q(z)`` and ``p(z)``; GPyTorch's ``forward`` hook, handed ``q``,
  gives what a call gives; ``model(x, prior=True)`` is :math:`\\lambda \\Psi \\Psi^\\top`;
* train and eval mode give the same root-operator distribution, the one of
  ``variational_strategy.mean_and_root`` (an ``N x R`` root, never ``N x N``);
* a Gaussian likelihood's predictive variance is the root's row norms plus the noise, with and without
  ``fast_pred_var``;
* GPyTorch's ``VariationalELBO`` and ``PredictiveLogLikelihood`` equal their closed forms from the mean, the
  root and the KL, and every variational parameter of the strategy gets a gradient;
* a state dict round trip gives the same predictive.

``tests/gp/test_strategy_conformance.py`` holds the library's own subclasses.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator

import gpytorch
import pytest
import torch
from linear_operator.operators import LowRankRootLinearOperator, RootLinearOperator
from torch import Tensor

__all__ = ["RandomFeatureStrategyTestCase"]


class RandomFeatureStrategyTestCase:
    """Base of the strategy conformance tests. A subclass (named ``Test...``) implements :meth:`make_model`;
    it may set ``input_dim`` and ``design_is_features`` (the prior is then also the kernel's ``covar_module(x)``)."""

    input_dim = 3
    num_inputs = 12
    #: The design is the features themselves (a Gaussian q(w)): the prior is then the random-feature kernel.
    design_is_features = False

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(0)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    def make_model(self, seed: int = 0) -> gpytorch.models.ApproximateGP:
        """A new float64 model whose ``variational_strategy`` is under test, its parameters away from their
        initial values (so that no check passes by symmetry), built deterministically from ``seed``."""
        raise NotImplementedError

    def make_inputs(self, seed: int = 1) -> tuple[Tensor, Tensor]:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(self.num_inputs, self.input_dim, generator=generator, dtype=torch.float64)
        y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(self.num_inputs, generator=generator, dtype=torch.float64)
        return x, y

    def test_kl_forward_and_prior_are_gpytorchs_definitions(self):
        x, _ = self.make_inputs()
        model = self.make_model()
        strategy = model.variational_strategy
        q, p = strategy.variational_distribution, strategy.prior_distribution
        torch.testing.assert_close(strategy.kl_divergence(), torch.distributions.kl_divergence(q, p))
        called = model(x)
        forward = strategy.forward(x, strategy.inducing_points, q.mean, q.lazy_covariance_matrix)
        torch.testing.assert_close(forward.mean, called.mean)
        torch.testing.assert_close(forward.covariance_matrix, called.covariance_matrix)
        design = strategy.design(x)
        prior = model(x, prior=True)
        torch.testing.assert_close(prior.mean, torch.zeros_like(prior.mean))
        variance = strategy.weight_posterior.prior_variance
        torch.testing.assert_close(prior.covariance_matrix, variance * design @ design.mT)
        if self.design_is_features:
            torch.testing.assert_close(prior.covariance_matrix, model.covar_module(x).to_dense())

    def test_train_and_eval_mode_give_the_same_root_operator_distribution(self):
        x, _ = self.make_inputs()
        model = self.make_model()
        mean, root = model.variational_strategy.mean_and_root(x)
        for training in (True, False):
            model.train(training)
            with torch.no_grad():
                dist = model(x)
            assert isinstance(dist, gpytorch.distributions.MultivariateNormal)
            assert isinstance(dist.lazy_covariance_matrix, (LowRankRootLinearOperator, RootLinearOperator))
            assert torch.equal(dist.mean, mean.detach())
            assert torch.equal(dist.lazy_covariance_matrix.root.to_dense(), root.detach())

    def test_likelihood_predictive_variance_is_root_row_norms_plus_noise(self):
        x, _ = self.make_inputs()
        model = self.make_model().eval()
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double().eval()
        likelihood.noise = 0.05
        with torch.no_grad():
            mean, root = model.variational_strategy.mean_and_root(x)
            expected = root.pow(2).sum(-1) + likelihood.noise
            for fast in (False, True):
                with gpytorch.settings.fast_pred_var(fast):
                    predictive = likelihood(model(x))
                torch.testing.assert_close(predictive.mean, mean, rtol=0, atol=0)
                torch.testing.assert_close(predictive.variance, expected, rtol=1e-14, atol=0)

    def test_gpytorchs_elbos_equal_the_closed_form_and_reach_every_parameter(self):
        """ELBO: ``mean_i[-log(2 pi s)/2 - ((y_i - m_i)^2 + v_i) / (2 s)] - KL / num_data``; predictive log
        likelihood: ``mean_i[log N(y_i; m_i, v_i + s)] - KL / num_data``. Each side adds the same O(1) terms in
        another order, so they agree to a few ulps of the sum; ``rtol = atol = 1e-12`` leaves two orders of
        magnitude for the log and the division."""
        x, y = self.make_inputs()
        model = self.make_model()
        strategy = model.variational_strategy
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        likelihood.noise = 0.3
        num_data = 100
        mean, root = strategy.mean_and_root(x)
        variance, noise = root.pow(2).sum(-1), likelihood.noise.detach()
        kl = strategy.kl_divergence()
        expected = -0.5 * torch.log(2 * math.pi * noise) - ((y - mean).pow(2) + variance) / (2 * noise)
        elbo = expected.mean() - kl / num_data
        predictive = torch.distributions.Normal(mean, (variance + noise).sqrt()).log_prob(y).mean() - kl / num_data
        model.train()
        gpytorch_elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data)(model(x), y)
        gpytorch_predictive = gpytorch.mlls.PredictiveLogLikelihood(likelihood, model, num_data)(model(x), y)
        torch.testing.assert_close(gpytorch_elbo, elbo, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gpytorch_predictive, predictive, rtol=1e-12, atol=1e-12)
        robust = gpytorch.mlls.GammaRobustVariationalELBO(likelihood, model, gamma=1.03, num_data=num_data)(model(x), y)
        assert torch.isfinite(robust)  # the gamma-robust ELBO reads the same mean and variance
        gpytorch_elbo.backward()
        for name, parameter in strategy.named_parameters():
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name

    def test_state_dict_round_trip_gives_the_same_predictive(self):
        x, _ = self.make_inputs()
        model = self.make_model(seed=0).eval()
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        buffer.seek(0)
        copy = self.make_model(seed=0)
        with torch.no_grad():  # move every parameter away, so that only the load can bring it back
            for parameter in copy.variational_strategy.parameters():
                parameter.add_(1.0)
        copy.load_state_dict(torch.load(buffer, weights_only=True))
        copy.eval()
        with torch.no_grad():
            expected, got = model(x), copy(x)
        assert torch.equal(got.mean, expected.mean)
        assert torch.equal(got.lazy_covariance_matrix.root.to_dense(), expected.lazy_covariance_matrix.root.to_dense())
