r"""The linearized GP ``f = Phi(x) w`` as a GPyTorch approximate GP.

Shape letters: ``N`` inputs, ``d`` input dimensions, ``F`` features, ``R`` columns of the covariance
root, ``...`` batch.

:class:`RandomFeatureGP` is a :class:`gpytorch.models.ApproximateGP` whose inducing variables are the
weights ``w`` (or WHVI's ``g``): its
:class:`~pyro_whvi.gp.variational_strategy.RandomFeatureVariationalStrategy` returns a
:class:`gpytorch.distributions.MultivariateNormal` over ``f`` whose covariance is a root operator
``Psi C (Psi C)^T`` (never a dense ``N x N`` matrix), and supplies ``KL(q(w) || p(w))``. So GPyTorch's
ELBOs (:class:`gpytorch.mlls.VariationalELBO`, :class:`~gpytorch.mlls.PredictiveLogLikelihood`, ...),
likelihoods and :mod:`gpytorch.metrics` apply as to any approximate GP.

Example::

    kernel = RandomFeatureKernel(num_samples=2048, projection="sorf", ard_num_dims=d)
    model = RandomFeatureGP(kernel, posterior="whvi", covariance="diagonal")
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(train_y))
    loss = -mll(model(x_batch), y_batch)

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4 (eq. 22) and Table 10; workshop version (2019), §3.2.
    K. Cutajar, E. Bonilla, P. Michiardi, M. Filippone. *Random Feature Expansions for Deep Gaussian
    Processes*. ICML 2017.
"""

from __future__ import annotations

import warnings

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from .kernel import RandomFeatureKernel
from .posteriors import COVARIANCES, GaussianWeightPosterior, WeightPosterior, WHVIWeightPosterior
from .variational_strategy import RandomFeatureVariationalStrategy, WHVIVariationalStrategy, root_covariance

__all__ = ["POSTERIORS", "RandomFeatureGP", "check_regression_data"]

POSTERIORS = ("gaussian", "whvi")


def check_regression_data(x: Tensor, y: Tensor | None = None, input_dim: int | None = None, name: str = "x") -> None:
    """Raise a specific error for inputs that are not ``(N, d)`` finite tensors with matching ``(N,)`` targets."""
    if not isinstance(x, Tensor) or x.dim() != 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a (N, d) tensor of inputs, got {shape}.")
    if input_dim is not None and x.shape[-1] != input_dim:
        raise ValueError(f"{name} has {x.shape[-1]} input dimensions but the model was built for {input_dim}.")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    if y is not None:
        if not isinstance(y, Tensor) or y.shape != x.shape[:1]:
            shape = tuple(y.shape) if isinstance(y, Tensor) else type(y).__name__
            raise ValueError(f"y must be a ({x.shape[0]},) tensor of targets matching {name}, got {shape}.")
        if not torch.isfinite(y).all():
            raise ValueError("y contains NaN or infinite values.")


class RandomFeatureGP(gpytorch.models.ApproximateGP):
    r"""A GP linearized by random features, :math:`f(x) = \phi(x)^\top w`, :math:`w \sim \mathcal N(0, I)`.

    ``model(x)`` is ``q(f(x))`` (train and eval mode alike), ``model(x, prior=True)`` the prior of the
    linearized GP (:meth:`forward`), ``model.variational_strategy.kl_divergence()`` the KL of ``q``.

    :param kernel: the feature map (its lengthscales and outputscale are learned with the model).
    :param posterior: ``"gaussian"`` (``q(w)`` Gaussian over all ``2m`` weights) or ``"whvi"``
        (``w`` reshaped to a matrix with a WHVI posterior, :math:`O(\sqrt{2m})` parameters).
    :param covariance: ``"diagonal"`` (mean field) or ``"full"``.
    :param mean_module: prior mean (default zero, the paper's centred GP).
    :param prior_variance: WHVI only, the prior variance of ``g`` (default ``D``).

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), App. D.4 and Table 10.
    """

    def __init__(
        self,
        kernel: RandomFeatureKernel,
        posterior: str = "gaussian",
        covariance: str = "diagonal",
        mean_module: gpytorch.means.Mean | None = None,
        prior_variance: float | None = None,
    ) -> None:
        if not isinstance(kernel, RandomFeatureKernel):
            raise TypeError(
                f"RandomFeatureGP needs a pyro_whvi.gp.RandomFeatureKernel, got {type(kernel).__name__}; wrap "
                "outputscales into the kernel's own outputscale instead of a ScaleKernel."
            )
        if kernel.batch_shape:
            raise ValueError(
                f"RandomFeatureGP supports kernels without a batch shape, got {tuple(kernel.batch_shape)}."
            )
        if posterior not in POSTERIORS:
            raise ValueError(f"RandomFeatureGP: posterior must be one of {POSTERIORS}, got {posterior!r}.")
        if covariance not in COVARIANCES:
            raise ValueError(f"RandomFeatureGP: covariance must be one of {COVARIANCES}, got {covariance!r}.")
        if posterior == "gaussian" and prior_variance is not None:
            raise ValueError(
                "RandomFeatureGP: prior_variance applies to posterior='whvi' only (w ~ N(0, I) otherwise)."
            )
        strategy: RandomFeatureVariationalStrategy
        like = kernel.raw_lengthscale
        if posterior == "gaussian":
            strategy = RandomFeatureVariationalStrategy(
                self, GaussianWeightPosterior(kernel.num_features, covariance).to(like)
            )
        else:
            weights = WHVIWeightPosterior(kernel.num_features, covariance, prior_variance).to(like)
            strategy = WHVIVariationalStrategy(self, weights)
        super().__init__(strategy)
        self.covar_module = kernel
        self.mean_module = mean_module if mean_module is not None else gpytorch.means.ZeroMean()
        self.posterior = posterior

    @property
    def weights(self) -> WeightPosterior:
        """The weight posterior ``q(w)`` (or WHVI's ``q(g)``): the variational strategy's distribution."""
        return self.variational_strategy.weight_posterior

    def forward(self, x: Tensor, **kwargs) -> MultivariateNormal:
        r"""``model(x, prior=True)``: the linearized GP's prior, :math:`\mathcal N(m(x), \lambda \Psi(x) \Psi(x)^\top)`.

        For a Gaussian ``q(w)`` this is the random-feature kernel :math:`\Phi \Phi^\top`; for WHVI the
        prior of ``f`` under ``g ~ N(0, lambda I)`` with ``S1``, ``S2`` at their current values.
        """
        strategy = self.variational_strategy
        root = strategy.design(x) * self.weights.prior_variance**0.5
        return MultivariateNormal(strategy.prior_mean(x, torch.zeros_like(root[..., 0])), root_covariance(root))

    def mean_and_root(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Deprecated: ``model.variational_strategy.mean_and_root(x)``, the one place that maps ``q`` to ``q(f)``."""
        warnings.warn(
            "RandomFeatureGP.mean_and_root is deprecated; call model.variational_strategy.mean_and_root(x) "
            "(it will be removed in the next release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.variational_strategy.mean_and_root(x)

    @torch.no_grad()
    def set_conjugate_posterior_(self, x: Tensor, y: Tensor, noise_variance: Tensor | float) -> None:
        r"""Set ``q`` to the ELBO's maximizer for a Gaussian likelihood at the current hyperparameters.

        With ``covariance="full"`` this is the exact posterior of the linear model (so the predictive
        is Bayesian linear regression on the features); with ``"diagonal"`` the mean-field optimum.
        For WHVI, ``S1`` and ``S2`` are kept and ``q(g)`` is set.
        """
        check_regression_data(x, y)
        design = self.variational_strategy.feature_design(self.covar_module.feature_map(x))
        self.weights.set_conjugate_(design, y - self.mean_module(x), noise_variance)
