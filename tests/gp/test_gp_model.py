"""RandomFeatureGP against exact answers: dense linear algebra for its moments and KL, the conjugate
optimum for its ELBO, GPyTorch's ExactGP for its predictive, and GPyTorch's own ELBOs and likelihoods
(it is an ApproximateGP whose inducing variables are the weights) against the closed forms."""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch
from linear_operator.operators import LowRankRootLinearOperator, RootLinearOperator
from scipy.linalg import hadamard

from pyro_whvi.experiments.gp_regressors import RandomFeatureRegressor
from pyro_whvi.gp import RandomFeatureGP, RandomFeatureKernel, RandomFeatureVariationalStrategy
from pyro_whvi.train.engine import Minibatches, Schedule

POSTERIORS = [("gaussian", "diagonal"), ("gaussian", "full"), ("whvi", "diagonal"), ("whvi", "full")]


def _randomize(model: RandomFeatureGP, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.variational_strategy.parameters():  # q(z) and the design's S1, S2 (WHVI)
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5 + (parameter == 1).double())


def _dense_weight_map(model: RandomFeatureGP) -> torch.Tensor:
    """``A`` with ``w = A z`` for the model's latent ``z`` (identity for a Gaussian posterior), built from
    scipy's Hadamard matrix entry by entry."""
    weights = model.weights
    if model.posterior == "gaussian":
        return torch.eye(weights.latent_dim)
    block = weights.latent_dim
    h = torch.tensor(hadamard(block), dtype=torch.float64) / math.sqrt(block)
    s1, s2 = model.variational_strategy.s1.detach(), model.variational_strategy.s2.detach()
    columns = [(s1[:, None] * h @ torch.diag(torch.eye(block)[k]) @ h * s2).flatten() for k in range(block)]
    return torch.stack(columns, dim=-1)[: weights.num_features]


@pytest.mark.parametrize(("posterior", "covariance"), POSTERIORS)
def test_moments_and_kl_match_dense_linear_algebra(posterior, covariance):
    kernel = RandomFeatureKernel(24, "sorf", num_dims=3, seed=0)  # 48 features: WHVI pads to 8 x 8 = 64
    model = RandomFeatureGP(kernel, posterior, covariance)
    _randomize(model)
    x = torch.randn(10, 3)
    dist = model(x)
    assert isinstance(dist, gpytorch.distributions.MultivariateNormal)
    assert isinstance(dist.lazy_covariance_matrix, (LowRankRootLinearOperator, RootLinearOperator))

    features = kernel.featurize(x).detach()
    weight_map = _dense_weight_map(model)
    loc = model.weights.loc.detach()
    scale_tril = model.weights.scale_tril.detach()
    covariance_z = scale_tril @ scale_tril.T
    assert torch.allclose(dist.mean, features @ weight_map @ loc, atol=1e-10)
    expected_cov = features @ weight_map @ covariance_z @ weight_map.T @ features.T
    assert torch.allclose(dist.covariance_matrix, expected_cov, atol=1e-10)
    if posterior == "whvi":
        assert torch.allclose(model.variational_strategy.weight_mean(), weight_map @ loc, atol=1e-12)

    prior = torch.distributions.MultivariateNormal(
        torch.zeros_like(loc), covariance_matrix=model.weights.prior_variance * torch.eye(loc.numel())
    )
    q = torch.distributions.MultivariateNormal(loc, scale_tril=scale_tril)
    assert torch.allclose(model.variational_strategy.kl_divergence(), torch.distributions.kl_divergence(q, prior))


@pytest.mark.parametrize(("posterior", "covariance"), POSTERIORS)
def test_parameter_counts(posterior, covariance):
    model = RandomFeatureGP(RandomFeatureKernel(512, num_dims=2), posterior, covariance)  # F = 1024 = 32^2
    features, block = 1024, 32
    expected = {
        ("gaussian", "diagonal"): 2 * features,
        ("gaussian", "full"): features + features * (features + 1) // 2,
        ("whvi", "diagonal"): 4 * block,
        ("whvi", "full"): 3 * block + block * (block + 1) // 2,
    }[(posterior, covariance)]
    assert model.weights.num_variational_parameters == expected
    assert model.variational_strategy.num_variational_parameters == expected
    free = sum(p.numel() for p in model.variational_strategy.parameters())  # q(z)'s and the design's S1, S2
    if covariance == "full":
        free -= model.weights.latent_dim * (model.weights.latent_dim + 1) // 2  # the unused upper triangle
    assert free == expected


def _data(n: int = 40, d: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=generator)
    y = torch.sin(4 * x[:, 0]) + x[:, -1] ** 2 + 0.1 * torch.randn(n, generator=generator)
    return x, y


@pytest.mark.parametrize(("posterior", "covariance"), POSTERIORS)
def test_conjugate_posterior_is_a_stationary_point_of_gpytorchs_variational_elbo(posterior, covariance):
    # The ELBO is concave in (mean, covariance) for a Gaussian likelihood; at the closed-form optimum its
    # gradient in q's parameters is zero up to round-off, which checks both the ELBO and set_conjugate_.
    x, y = _data()
    model = RandomFeatureGP(RandomFeatureKernel(32, "fastfood", num_dims=2, seed=1), posterior, covariance)
    _randomize(model, seed=2)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.05
    model.set_conjugate_posterior_(x, y, likelihood.noise.detach())
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
    elbo = mll(model(x), y)
    parameters = [model.weights.loc, model.weights.raw_scale]
    if covariance == "full":
        parameters.append(model.weights.scale_tril_offdiag)
    gradients = torch.autograd.grad(elbo, parameters)
    assert max(g.abs().max().item() for g in gradients) < 1e-8
    with torch.no_grad():
        model.weights.loc.add_(0.01)
    assert mll(model(x), y) < elbo


@pytest.mark.slow
def test_full_covariance_predictive_approaches_the_exact_gp():
    x, y = _data(n=25, d=1)
    test_x = torch.linspace(-0.5, 1.5, 60)[:, None]  # includes extrapolation, where the variance grows
    lengthscale, outputscale, noise = 0.3, 1.3, 0.01

    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = noise

    class Exact(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
            self.covar_module.base_kernel.lengthscale = lengthscale
            self.covar_module.outputscale = outputscale

        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(inputs), self.covar_module(inputs))

    exact = Exact().eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        exact_pred = exact(test_x)
    errors = []
    for num_samples in (16, 2048):
        mean_errors, var_errors = [], []
        for seed in range(3):
            kernel = RandomFeatureKernel(num_samples, "sorf", num_dims=1, seed=seed)
            kernel.lengthscale, kernel.outputscale = lengthscale, outputscale
            model = RandomFeatureGP(kernel, "gaussian", "full")
            model.set_conjugate_posterior_(x, y, noise)
            with torch.no_grad():
                pred = model(test_x)
            mean_errors.append((pred.mean - exact_pred.mean).abs().max().item())
            var_errors.append((pred.variance - exact_pred.variance).abs().max().item())
        errors.append((sum(mean_errors) / 3, sum(var_errors) / 3))
    (mean_few, var_few), (mean_many, var_many) = errors
    assert mean_many < 0.05 and var_many < 0.05, errors
    assert mean_many < mean_few / 2 and var_many < var_few / 2, errors


@pytest.mark.parametrize(("posterior", "covariance"), [("gaussian", "diagonal"), ("whvi", "full")])
def test_training_reaches_the_conjugate_elbo(posterior, covariance):
    # Hyperparameters frozen, so the best ELBO is the conjugate one; Adam from the default initialization
    # should get within 2% of it (measured: within 0.5% after 1,500 full-batch steps).
    x, y = _data(n=60)
    regressor = RandomFeatureRegressor(2, 32, "sorf", posterior, covariance, seed=0)
    regressor.model.covar_module.lengthscale = 0.4
    regressor.likelihood.noise = 0.01
    regressor.model.covar_module.requires_grad_(False)
    schedule = Schedule(steps=1500, fixed_noise_steps=1500, lr=0.02, batch_size=None, lr_power=0.0)
    result = regressor.fit(x, y, schedule)
    trained = regressor.elbo(x, y)
    assert result.losses[-1] < result.losses[0]
    regressor.model.set_conjugate_posterior_(x, y, regressor.likelihood.noise)
    optimum = regressor.elbo(x, y)
    assert trained <= optimum + 1e-6
    assert trained > optimum - 0.02 * abs(optimum), (trained, optimum)


@pytest.mark.parametrize(("posterior", "covariance"), POSTERIORS)
def test_regressor_loss_is_gpytorchs_variational_elbo(posterior, covariance):
    """The regressor writes GPyTorch's ELBO out in closed form (for speed): equal up to the order of the
    sums, a few ulps in float64 (see test_gpytorchs_elbos_equal_the_closed_form)."""
    x, y = _data(n=30)
    x, y = x.double(), y.double()
    regressor = RandomFeatureRegressor(2, 32, "fastfood", posterior, covariance, seed=1)
    _randomize(regressor.model, seed=3)
    regressor.likelihood.noise = 0.3
    mll = gpytorch.mlls.VariationalELBO(regressor.likelihood, regressor.model, num_data=100)
    expected = -mll(regressor.model(x[:10]), y[:10])
    torch.testing.assert_close(regressor.negative_elbo(x[:10], y[:10], 100), expected, rtol=1e-12, atol=1e-12)


def test_works_with_gaussian_likelihood_and_gpytorch_metrics():
    x, y = _data(n=50)
    regressor = RandomFeatureRegressor(2, 64, "fastfood", "whvi", "diagonal")
    regressor.fit(x, y, Schedule(steps=30, fixed_noise_steps=10, lr=0.01, batch_size=16, lr_power=0.0))
    predictive = regressor.likelihood(regressor.model(x))
    nlpd = gpytorch.metrics.negative_log_predictive_density(predictive, y)
    msll = gpytorch.metrics.mean_standardized_log_loss(predictive, y)
    assert torch.isfinite(nlpd) and torch.isfinite(msll)
    mean, variance = regressor.predict(x)
    assert torch.allclose(mean, predictive.mean) and torch.allclose(variance, predictive.variance)
    assert (variance > regressor.likelihood.noise).all()


def test_state_dict_round_trip_and_noise_held_fixed():
    x, y = _data()
    regressor = RandomFeatureRegressor(2, 32, "sorf", "whvi", "full", seed=4)
    noise = regressor.likelihood.noise.clone()
    regressor.fit(x, y, Schedule(steps=20, fixed_noise_steps=20, lr=0.05, batch_size=8, lr_power=0.0))
    assert torch.equal(regressor.likelihood.noise, noise)
    copy = RandomFeatureRegressor(2, 32, "sorf", "whvi", "full", seed=99)
    copy.load_state_dict(regressor.state_dict())
    for a, b in zip(copy.predict(x), regressor.predict(x)):
        assert torch.allclose(a, b)


def _float64_model(posterior: str, covariance: str, seed: int = 0) -> RandomFeatureGP:
    kernel = RandomFeatureKernel(24, "sorf", num_dims=3, seed=seed).double()  # WHVI: 48 features in 8 x 8
    model = RandomFeatureGP(kernel, posterior, covariance)
    _randomize(model, seed)
    return model


def test_is_a_gpytorch_approximate_gp_whose_inducing_variables_are_the_weights():
    model = RandomFeatureGP(RandomFeatureKernel(8, num_dims=2), "whvi", "full")
    assert isinstance(model, gpytorch.models.ApproximateGP)
    strategy = model.variational_strategy
    assert isinstance(strategy, RandomFeatureVariationalStrategy)
    assert isinstance(strategy, gpytorch.variational._VariationalStrategy)
    assert isinstance(model.weights, gpytorch.variational._VariationalDistribution)
    assert model.weights is strategy._variational_distribution
    assert strategy.inducing_points.shape == (model.weights.latent_dim, 0)  # weights have no input locations
    # q's tensors and the design's S1, S2 make the state dict: the strategy's placeholder buffers carry nothing
    assert {name for name in model.state_dict() if "variational_strategy" in name} == {
        "variational_strategy.s1",
        "variational_strategy.s2",
        *(
            f"variational_strategy._variational_distribution.{name}"
            for name in ("loc", "raw_scale", "scale_tril_offdiag")
        ),
    }


def test_loads_state_dicts_written_before_the_variational_strategy():
    """Earlier versions kept q's tensors directly under ``variational_strategy.``; they still load, strictly."""
    model = _float64_model("whvi", "full", seed=5)
    _randomize(model, seed=3)
    old_keys = {k.replace("_variational_distribution.", ""): v for k, v in model.state_dict().items()}
    assert "variational_strategy.loc" in old_keys
    fresh = _float64_model("whvi", "full", seed=6)
    fresh.load_state_dict(old_keys)
    torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)


def test_loads_state_dicts_written_when_the_posterior_held_s1_and_s2():
    """Before the strategy owned the design, WHVI's ``S1``, ``S2`` sat in the posterior; such state dicts still
    load, strictly, into the strategy."""
    model = _float64_model("whvi", "diagonal", seed=5)
    _randomize(model, seed=4)
    old_keys = {
        k.replace("variational_strategy.s", "variational_strategy._variational_distribution.s"): v
        for k, v in model.state_dict().items()
    }
    assert "variational_strategy._variational_distribution.s1" in old_keys
    fresh = _float64_model("whvi", "diagonal", seed=6)
    fresh.load_state_dict(old_keys)
    torch.testing.assert_close(fresh.state_dict(), model.state_dict(), rtol=0, atol=0)
    assert not hasattr(fresh.weights, "s1") and fresh.weights.num_variational_parameters == 4 * fresh.weights.latent_dim


def test_bad_input_gets_specific_errors():
    kernel = RandomFeatureKernel(8, num_dims=2)
    with pytest.raises(TypeError, match="RandomFeatureKernel"):
        RandomFeatureGP(gpytorch.kernels.RBFKernel())
    with pytest.raises(ValueError, match="posterior"):
        RandomFeatureGP(kernel, posterior="flow")
    with pytest.raises(ValueError, match="covariance"):
        RandomFeatureGP(kernel, covariance="lowrank")
    with pytest.raises(ValueError, match="prior_variance"):
        RandomFeatureGP(kernel, prior_variance=2.0)
    with pytest.raises(ValueError, match="batch shape"):
        RandomFeatureGP(RandomFeatureKernel(8, num_dims=2, batch_shape=torch.Size([2])))
    with pytest.raises(ValueError, match="even"):
        RandomFeatureRegressor(2, 31)
    regressor = RandomFeatureRegressor(2, 32)
    with pytest.raises(ValueError, match="3 input dimensions"):
        regressor.predict(torch.randn(5, 3))
    with pytest.raises(ValueError, match="NaN"):
        regressor.fit(torch.full((5, 2), float("nan")), torch.zeros(5))
    with pytest.raises(ValueError, match="targets"):
        regressor.fit(torch.randn(5, 2), torch.zeros(4))


def test_the_model_applies_the_kernels_active_dims_and_follows_its_dtype():
    kernel = RandomFeatureKernel(16, "sorf", active_dims=[0, 2], seed=0).double()
    model = RandomFeatureGP(kernel, "whvi")
    assert model.weights.loc.dtype == torch.float64
    x = torch.randn(6, 3)
    expected = model.variational_strategy.feature_design(kernel.featurize(x[:, [0, 2]])) @ model.weights.loc
    assert torch.allclose(model(x).mean, expected)


@pytest.mark.parametrize("drop_last", [True, False])
def test_minibatches_epochs(drop_last):
    """Batches of an epoch are disjoint; ``drop_last=False`` adds the short last batch so every index is
    visited once per epoch; a batch as large as the data yields ``None`` (the full data)."""
    batches = Minibatches(10, 4, 0, replacement=False, drop_last=drop_last)
    epoch = [next(batches) for _ in range(2 if drop_last else 3)]
    assert [len(b) for b in epoch] == ([4, 4] if drop_last else [4, 4, 2])
    visited = torch.cat(epoch)
    assert len(set(visited.tolist())) == len(visited)
    if not drop_last:
        assert sorted(visited.tolist()) == list(range(10))
    assert len(next(batches)) == 4  # the next epoch starts with a full batch
    assert next(Minibatches(10, 10, replacement=False, drop_last=drop_last)) is None


@pytest.mark.parametrize("replacement", [True, False])
def test_minibatches_resume_from_state_dict(replacement):
    """A sampler restored from another's ``state_dict`` mid-epoch draws exactly what the original goes on to draw."""
    original = Minibatches(23, 5, 3, replacement=replacement)
    for _ in range(3):
        next(original)
    copy = Minibatches(23, 5, 99, replacement=replacement)
    copy.load_state_dict(original.state_dict())
    assert all(torch.equal(next(original), next(copy)) for _ in range(10))
